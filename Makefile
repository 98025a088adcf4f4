# One entry point for everything CI and people run. Every target sets itself up.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
SETUP_STAMP := $(VENV)/.setup-done
# The Node.js that package.json pins (the `node` package, a supported release) before the machine's: the CDK CLI,
# jsii under the app and the review's diff engine run on it. `npm ci` itself needs only the machine's npm.
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)
NODE_STAMP := node_modules/.setup-done
# CONTEXT='{"approvers": ["arn:aws:iam::123456789012:role/MLLead"]}': settings merged over cdk.json's
# `platform` object by every synth (synth, deploy, diff, review, demo), read by stacks/settings.py.
export PLATFORM_CONTEXT := $(CONTEXT)

.PHONY: help setup synth test lint typecheck unit docs deploy diff outputs cost review demo constraints clean

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(SETUP_STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
# The repository's own modules, editable, for the `tp` console script (pyproject.toml's [project.scripts]).
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(SETUP_STAMP) $(NODE_STAMP)  ## Create .venv and node_modules from the pinned files.

synth: setup  ## Synthesize every stack; fail on an unacknowledged cdk-nag finding or a cfn-lint finding.
	$(CDK) synth --quiet
	$(VENV)/bin/cfn-lint

lint: setup  ## ruff format check + ruff lint.
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

typecheck: setup  ## mypy on the app, stacks, lambdas and training package.
	$(VENV)/bin/mypy

unit: setup  ## pytest (synth, cdk-nag, cfn-lint, moto, multi-process torch); the 4-process jobs alone, after the rest.
	$(VENV)/bin/pytest -n 2 -m "not multiprocess4"
# Each of these starts up to 4 training processes: run side by side they would share 2 cores 8 ways.
	$(VENV)/bin/pytest -n 0 -m multiprocess4

# In `test` after unit: the tests compare the committed reference pages with their models before this rewrites
# them. NO_MKDOCS_2_WARNING: Material's notice of its end of life (May 2027), printed on every build otherwise.
docs: setup  ## Write the reference pages from their models, then build the documentation site into site/ (--strict).
	$(PY) -m tools.docs --write
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: lint typecheck unit docs  ## Everything CI runs.

# What deployed platforms record as their revision (in every registered model's lineage): this
# commit, marked -dirty when the tree has uncommitted changes. The app never asks git itself.
deploy diff: export PLATFORM_REVISION ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)

diff: setup  ## cdk diff against a deployed platform (needs AWS credentials).
	$(CDK) diff --all

review: setup  ## Offline change review of the working tree against BASE (default origin/main, else main): review.md.
	$(PY) -m tools.review $(if $(BASE),--base '$(BASE)',) --output review.md

deploy: setup  ## cdk deploy --all (needs AWS credentials, a bootstrapped account and named approvers; CONTEXT=).
	$(CDK) deploy --all --require-approval broadening -c platform:deploy=true

outputs: setup  ## The deployed stage's pipeline outputs: state machine, decision URL, buckets, dashboard, logs.
	$(PY) -m tools.outputs $(ARGS)

cost: synth  ## The idle monthly cost of the synthesized platform (FSx, endpoints, keys, alarms, dashboard).
	$(PY) -m tools.idle_cost cdk.out

demo: setup  ## The whole pipeline, run locally: synth, state machine in moto, real training (INPUT=, ARGS=).
	$(PY) -m localrun.demo $(if $(INPUT),--input $(INPUT),) $(ARGS)

constraints:  ## Re-pin constraints.txt from the current .venv.
	{ echo "# Full pin set for the dev/CI virtual environment (pip freeze). Regenerate: make constraints"; \
	  $(PY) -m pip freeze --all --exclude-editable | grep -vE '^(pip|setuptools|wheel)=' ; } > constraints.txt

clean:  ## Remove build outputs (keeps .venv and node_modules).
	rm -rf cdk.out demo-out review.md site .pytest_cache .mypy_cache .ruff_cache

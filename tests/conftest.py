"""Shared fixtures: the platform synthesized once per session from cdk.json's own context."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.demo.new_data import RETRAIN
from localrun.demo.scenario import is_scenario

REPO = Path(__file__).resolve().parents[1]
# moto and boto3 must never find real credentials or a real endpoint.
for _var, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_var] = _value
# The revision make deploy passes (a commit); the app itself never asks git.
os.environ["PLATFORM_REVISION"] = "0123456789ab"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test marked slow run first, each module's tests still together and in order.

    xdist's workers take the collection's tests in chunks from the front: a minute-long test collected last
    would run alone on one worker while the other has nothing left. Whole modules move, so a module-scoped
    fixture is still built once per worker that runs its module.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(autouse=True)
def _interpreter_left_as_found() -> Iterator[None]:
    """Fail a test that leaves `sys.path` or `sys.argv` changed: a later test on the same xdist worker (a spawned
    process, which imports its target by `sys.path`) would fail for it, and only in some orders."""
    path, argv = list(sys.path), list(sys.argv)
    yield
    changed = [
        name for name, before, now in (("sys.path", path, sys.path), ("sys.argv", argv, sys.argv)) if now != before
    ]
    sys.path[:], sys.argv[:] = path, argv
    assert not changed, f"the test left {' and '.join(changed)} changed"


APPROVER = "arn:aws:iam::123456789012:role/MLLead"
READER = "arn:aws:iam::123456789012:role/PlatformAuditor"
PATH_APPROVER = "arn:aws:iam::123456789012:role/ml-team/TeamLead"


def hosts_left_running(root: Path, timeout: float = 10) -> list[str]:
    """Processes of local training hosts under `root` (their OPT_ML_ROOT) still alive after `timeout` s.

    torchrun and its workers run in sessions of their own: a runner that kills a host's launcher alone
    leaves them training, orphaned, on this machine's cores.
    """
    marker = f"OPT_ML_ROOT={root}".encode()
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            try:
                environ = (entry / "environ").read_bytes() if entry.name.isdigit() else b""
                if any(v.startswith(marker) for v in environ.split(b"\0")):
                    command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    left.append(f"{entry.name}: {command}")
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def cdk_context(**platform_overrides: Any) -> dict[str, Any]:
    """cdk.json's context (feature flags included) plus an approver (cdk.json names none: a platform
    team must), with `platform` keys replaced at the top level."""
    context: dict[str, Any] = json.loads((REPO / "cdk.json").read_text())["context"]
    context = json.loads(json.dumps(context))
    context["platform"].update({"approvers": [APPROVER], **platform_overrides})
    return context


RUN_EMAIL = "alice@example.org"
# The variant's training plan (its Region and account).
TRAINING_PLAN_ARN = "arn:aws:sagemaker:eu-west-1:123456789012:training-plan/p4d-reserved"
# The retrain trigger of docs/platform-team/retraining.md, which the demo plays: new objects under the prefix start
# examples/retrain-on-new-data.json.
RETRAIN_TRIGGER = RETRAIN


# The variant's teams: two quota shares of its p4d service environment (docs/platform-team/teams.md).
TEAMS = [
    {
        "name": "vision",
        "members": ["arn:aws:iam::123456789012:role/VisionScientist"],
        "approvers": ["arn:aws:iam::123456789012:role/VisionLead"],
        "notification_emails": ["vision@example.org"],
        "dataset_prefixes": ["vision/"],
        "monthly_budget_usd": 2000,
        "quota_share": {
            "capacity": {"ml.p4d.24xlarge": 4},
            "sharing": "LEND_AND_BORROW",
            "borrow_limit_percent": 100,
            "in_share_preemption": True,
        },
    },
    {
        "name": "language",
        "member_tag": "language",
        "dataset_prefixes": ["language/"],
        "monthly_budget_usd": 1000,
        "quota_share": {"capacity": {"ml.p4d.24xlarge": 2}},
    },
]
SERVICE_ENVIRONMENT = {"capacity": {"ml.p4d.24xlarge": 8}}


def platform_context() -> dict[str, Any]:
    """cdk.json's context plus an approver and notification addresses (cdk.json ships none)."""
    context = cdk_context(approvers=[APPROVER])
    context["platform"]["notifications"] = {
        "alarm_emails": ["oncall@example.org"],
        "budget_emails": ["finance@example.org"],
        "approval_emails": ["lead@example.org"],
        "run_emails": [RUN_EMAIL, "bob@example.org"],
    }
    context["platform"]["retrain"] = [RETRAIN_TRIGGER]
    return context


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The platform of `platform_context()`, synthesized (with cdk-nag) once for the session."""
    from stacks.app_builder import build_platform

    outdir = tmp_path_factory.mktemp("cdk.out")
    built = build_platform(platform_context(), outdir=str(outdir))
    built.assembly = built.synth()
    yield built


@pytest.fixture(scope="session")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """NAT on, named AZs, a p4d cluster, FSx auto-export, no network isolation, one allowed instance
    type and a training plan of it, a named reader of execution data, two teams: the optional paths of every
    stack."""
    context = cdk_context(region="eu-west-1", account="123456789012")
    context["platform"]["network"] = {
        **context["platform"]["network"],
        "nat_gateways": 1,
        "availability_zones": ["eu-west-1b", "eu-west-1a"],
        "largest_cluster": {"instance_type": "ml.p4d.24xlarge", "count": 16},
    }
    context["platform"]["storage"] = {**context["platform"]["storage"], "fsx_auto_export_prefix": "results/"}
    context["platform"]["pipeline"] = {
        "network_isolation": False,
        "allowed_instance_types": ["ml.p4d.24xlarge"],
        "training_plan": {"arn": TRAINING_PLAN_ARN, "instance_type": "ml.p4d.24xlarge"},
    }
    context["platform"]["execution_data_readers"] = [READER]
    context["platform"]["teams"] = TEAMS
    context["platform"]["service_environment"] = SERVICE_ENVIRONMENT
    from stacks.app_builder import build_platform

    built = build_platform(context, outdir=str(tmp_path_factory.mktemp("variant")))
    built.assembly = built.synth()
    return built


TEAMS_SCENARIO = REPO / "examples" / "teams.json"


@pytest.fixture(scope="session")
def teams_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's platform with examples/teams.json's settings (two teams, a queue of two ml.m5.xlarge), as
    `make demo INPUT=examples/teams.json` synthesizes it."""
    from localrun.demo import scenario
    from localrun.demo.cli import synthesize

    settings = scenario.parse(json.loads(TEAMS_SCENARIO.read_text())).settings
    return synthesize(tmp_path_factory.mktemp("teams"), lambda _: None, settings=settings)


def _packs_code(document: Any) -> bool:
    """Whether an input's `code.source` names a local folder, which `tp` and the demo pack before it is sent."""
    source = document.get("code", {}).get("source") if isinstance(document, dict) else None
    return isinstance(source, str) and not source.startswith("s3://")


_INPUTS = [path for path in (REPO / "examples").glob("*.json") if not is_scenario(json.loads(path.read_text()))]
EXAMPLE_INPUTS = sorted(path for path in _INPUTS if not _packs_code(json.loads(path.read_text())))
"""The examples that are execution inputs as sent (examples/teams.json is a scenario of several, run by the demo)."""
OWN_CODE_EXAMPLES = sorted(path for path in _INPUTS if _packs_code(json.loads(path.read_text())))
"""The examples of a run's own code, whose `code.source` is a folder of examples/own-code/ that they pack."""

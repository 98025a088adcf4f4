"""Malformed execution inputs: each fails in Validate, says what to fix, and creates nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import ScriptedTraining
from tests.pipeline.conftest import Pipeline

MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"RoleArn": "arn:aws:iam::1:role/admin"}, "RoleArn: unknown key"),
    ("wrong type", {"instance_count": "2"}, "instance_count: '2' is not a whole number"),
    ("unknown instance type", {"instance_type": "ml.p5.4xlarge"}, "'ml.p5.4xlarge' is not a known training type"),
    (
        "count over capacity",
        {"instance_type": "ml.p5.48xlarge", "instance_count": 200},
        "exceeds what the training subnet holds",
    ),
    ("efa on a non-EFA type", {"efa": True}, "efa is true but ml.g5.2xlarge has no EFA"),
    ("spot without checkpoints", {"spot": True, "checkpoints": False}, "spot needs checkpoints"),
    ("max wait not above runtime", {"spot": True, "max_wait_hours": 2}, "must be greater than max_runtime_hours"),
    ("max wait without spot", {"max_wait_hours": 5}, "max_wait_hours applies to spot runs only"),
    ("invalid run name", {"run_name": "My_Run!"}, "run_name 'My_Run!'"),
    (
        "path outside datasets",
        {"dataset": "fsx:///home/alice/data/"},
        "FSx datasets are folders under fsx:///datasets/",
    ),
    ("path escaping datasets", {"dataset": "fsx:///datasets/../etc/"}, "has a '..' segment"),
    ("foreign bucket", {"dataset": "s3://someone-elses-bucket/data/"}, "only the platform's datasets locations"),
    (
        "nested hyperparameter",
        {"hyperparameters": {"lr": {"value": 1}}},
        "hyperparameters.lr: must be a string, number or boolean",
    ),
    ("unknown hyperparameter", {"hyperparameters": {"learning_rate": 0.1}}, "learning_rate"),
    ("bad hyperparameter value", {"hyperparameters": {"max_steps": -5}}, "max_steps"),
    (
        "distribution as hyperparameter",
        {"hyperparameters": {"distribution": "fsdp"}},
        "set `distribution` at the top level",
    ),
    ("smddp on a type without it", {"distribution": "smddp"}, "distribution 'smddp' runs on"),
    ("warm pool with spot", {"spot": True, "warm_pool_minutes": 10}, "warm pools do not support spot"),
    ("runtime over the limit", {"max_runtime_hours": 1000}, "exceeds the platform limit of 120"),
    ("notify someone unsubscribed", {"notify": ["mallory@example.org"]}, "not subscribed to run notifications"),
    ("quality on an unknown metric", {"quality": {"metric": "accuracy", "min": 0.9}}, "'accuracy' is not reported"),
    ("missing field", {"instance_type": None}, "instance_type: Field required"),
]


@pytest.fixture(scope="module")
def validation_pipeline(platform: Any) -> Iterator[Pipeline]:
    """One deployment for all malformed inputs: none of them may create anything in it."""
    training = ScriptedTraining()
    with LocalPlatform(Path(platform.assembly.directory), training=training) as local:
        yield Pipeline(local, training)
        assert local.training_requests == {}


@pytest.mark.parametrize(("case", "change", "hint"), MALFORMED, ids=[c for c, *_ in MALFORMED])
def test_malformed_input_fails_in_validate_and_creates_nothing(
    validation_pipeline: Pipeline, case: str, change: dict[str, Any], hint: str
) -> None:
    pipeline = validation_pipeline
    arn = pipeline.start(pipeline.input(**change), name=re.sub(r"[^a-z0-9]+", "-", case))
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert described["status"] == "FAILED"
    assert error == "InvalidRequest"
    assert hint in cause, cause
    assert pipeline.local.states_entered(arn)[-1] == "Request rejected"
    assert pipeline.jobs() == []


@pytest.mark.parametrize(
    ("execution_input", "kind"), [([1, 2], "an array"), ("gpt2", "a string"), (42, "a number"), (None, "null")]
)
def test_an_input_that_is_not_an_object_is_rejected_with_what_to_send(
    validation_pipeline: Pipeline, execution_input: Any, kind: str
) -> None:
    arn = validation_pipeline.local.start(execution_input, name=f"not-an-object-{kind.replace(' ', '-')}")
    described = validation_pipeline.finish(arn)
    error, cause = validation_pipeline.error(described)
    assert (error, validation_pipeline.local.states_entered(arn)[-1]) == ("InvalidRequest", "Request rejected")
    assert "the execution input must be a JSON object" in cause and f"not {kind}" in cause


def test_all_problems_are_reported_at_once(validation_pipeline: Pipeline) -> None:
    pipeline = validation_pipeline
    arn = pipeline.start(
        pipeline.input(run_name="X", spot=True, checkpoints=False, instance_type="ml.nope.xlarge"), name="all-at-once"
    )
    _, cause = pipeline.error(pipeline.finish(arn))
    assert cause.count("\n  - ") == 3


def test_schema_and_other_problems_fail_the_execution_together(validation_pipeline: Pipeline) -> None:
    """The issue's case: a typo'd key (the schema's), a type without `ml.` and a foreign bucket (the checks')."""
    pipeline = validation_pipeline
    execution_input = pipeline.input(instance_type="p4d.24xlarge", dataset="s3://someone-elses-bucket/data/")
    execution_input["instance_cuont"] = 1
    arn = pipeline.start(execution_input, name="one-pass")
    error, cause = pipeline.error(pipeline.finish(arn))
    assert error == "InvalidRequest" and cause.count("\n  - ") == 3, cause
    assert "instance_cuont: unknown key; did you mean 'instance_count'?" in cause, cause
    assert "instance_type 'p4d.24xlarge' is not a known training type; did you mean 'ml.p4d.24xlarge'?" in cause
    assert "dataset 's3://someone-elses-bucket/data/' is not in the datasets bucket" in cause, cause

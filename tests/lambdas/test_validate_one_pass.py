"""Validate in one pass: the schema's problems and every other check's together, with did-you-mean."""

from __future__ import annotations

from typing import Any

import pytest

from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS, _example


def _problems(execution_input: dict[str, Any]) -> tuple[str, list[Problem]]:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, limits=LIMITS)  # as an offline caller does: the input and the limits
    # getattr: each test checks the message first, so it fails on its content where `problems` is missing
    return str(raised.value), getattr(raised.value, "problems", [])


def test_typo_key_type_without_ml_and_foreign_bucket_are_one_invalid_request() -> None:
    execution_input = {
        **_example("single-node-ddp"),
        "instance_cuont": 1,
        "instance_type": "p4d.24xlarge",
        "dataset": "s3://someone-elses-bucket/data/",
    }
    message, problems = _problems(execution_input)
    # The Fail cause first (what the state machine shows), then the same problems structured.
    assert message.startswith("The training request cannot run:\n  - ") and message.count("\n  - ") == 3, message
    assert "did you mean 'ml.p4d.24xlarge'?" in message and "someone-elses-bucket" in message, message
    by_field = {p.field: p for p in problems}
    assert set(by_field) == {"instance_cuont", "instance_type", "dataset"}, message
    assert "did you mean 'instance_count'?" in by_field["instance_cuont"].message
    assert by_field["instance_type"].value == "p4d.24xlarge"
    assert "did you mean 'ml.p4d.24xlarge'?" in by_field["instance_type"].message
    assert by_field["dataset"].value == "s3://someone-elses-bucket/data/"
    assert "only the platform's datasets locations" in by_field["dataset"].message


def test_an_unknown_hyperparameter_is_named_with_the_closest_known_one_beside_a_schema_error() -> None:
    execution_input = {**_example("single-node-ddp"), "instance_count": "2", "hyperparameters": {"max_step": 10}}
    message, problems = _problems(execution_input)
    assert "(did you mean 'max_steps'?)" in message, message
    assert [p.field for p in problems] == ["instance_count", "hyperparameters.max_step"], message
    assert "unknown hyperparameter 'max_step' (did you mean 'max_steps'?)" in problems[1].message


def test_schema_and_semantic_problems_of_different_fields_are_reported_together() -> None:
    execution_input = {
        **_example("single-node-ddp"),
        "spot": "yes",  # the schema's
        "run_name": "My_Run!",  # the checks'
        "max_runtime_hours": 1000,
        "quality": {"metric": "validation:loss", "maxx": 3.0},  # an unknown key one level down
    }
    message, problems = _problems(execution_input)
    assert "quality.maxx" in message and "run_name 'My_Run!'" in message, message
    fields = [p.field for p in problems]
    assert fields[:2] == ["spot", "quality.maxx"], message
    assert "run_name" in fields and "max_runtime_hours" in fields, message
    assert "did you mean 'max'?" in problems[1].message
    # spot was rejected, so no check judges it (from its default) in the same pass
    assert not any("spot" in p.message for p in problems[2:]), message


def test_a_rejected_required_field_skips_only_the_checks_that_need_it() -> None:
    execution_input = {**_example("single-node-ddp"), "dataset": 7, "instance_type": "ml.p5.4xlarge"}
    message, problems = _problems(execution_input)
    assert "'ml.p5.4xlarge' is not a known training type" in message, message
    assert [p.field for p in problems] == ["dataset", "instance_type"], message
    assert "did you mean 'ml.p5.48xlarge'" in problems[1].message


def test_a_quality_gate_names_a_model_metric_not_a_phase_of_the_jobs_time() -> None:
    execution_input = {**_example("single-node-ddp"), "quality": {"metric": "phases:train_seconds", "max": 3600}}
    message, problems = _problems(execution_input)
    assert [p.field for p in problems] == ["quality.metric"], message
    assert "quality.metric 'phases:train_seconds' is not reported by the trainer" in message, message
    assert "use one of train:loss, train:lr, train:grad_norm, train:tokens_per_sec, train:mfu, validation:loss" in (
        message
    )

"""What Validate checks is what the state machine sends: the requests Validate builds equal the ones the local
platform's state machine sends to SageMaker and AWS Batch, and an input those services would refuse ends at
Validate, before any estimate or gate, with nothing created."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from botocore.client import BaseClient

from contract.config import HYPERPARAMETERS
from contract.execution_state import CostEstimate, TrainingRequest
from contract.layout import CHECKPOINTS_ENV, OUTPUT_ENV, split_s3_uri
from contract.service_requests import (
    EXECUTION_TAG,
    BatchJobConstants,
    RunState,
    create_training_job,
    create_tuning_job,
    submit_job,
)
from lambdas.sagemaker.capacity import next_cluster
from lambdas.validate.api_requests import TUNING_RANGES, api_problems
from lambdas.validate.trials import trainer_field
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED, Pipeline, sagemaker_constants
from tests.pipeline.test_batch import batch_factory  # noqa: F401 - the fixture, used by name
from tests.pipeline.test_paths import CAPACITY, FALLBACK
from tests.pipeline.test_tuning import TUNING

SENT = {"CreateTrainingJob": "sagemaker", "CreateHyperParameterTuningJob": "sagemaker", "SubmitJob": "batch"}


@contextmanager
def sent_requests() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every create or submit call, with the parameters the SDK call received (as the state machine sent them)."""
    sent: list[tuple[str, dict[str, Any]]] = []
    original = BaseClient._make_api_call

    def record(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if operation in SENT:
            sent.append((operation, copy.deepcopy(params)))
        return original(client, operation, params)

    with mock.patch.object(BaseClient, "_make_api_call", record):
        yield sent


def _validated(pipeline: Pipeline) -> TrainingRequest:
    (result,) = [c.result for c in pipeline.local.lambda_calls if c.handler.startswith("lambdas.validate.")]
    return TrainingRequest.parse(result["validation"]["request"])


def _wait_for(pipeline: Pipeline, arn: str, sent: list[Any], operation: str) -> dict[str, Any]:
    pipeline.local.wait(arn, 60, until=lambda: any(o == operation for o, _ in sent))
    (params,) = [p for o, p in sent if o == operation]
    return params


def test_validate_builds_the_single_job_and_the_tuning_job_the_state_machine_sends(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory()
    with sent_requests() as sent:
        arn = pipeline.start(pipeline.input(), name="single")
        created = _wait_for(pipeline, arn, sent, "CreateTrainingJob")
        request = _validated(pipeline)
        assert created == create_training_job(sagemaker_constants(created)).values(RunState(request, 1, arn))
        assert api_problems("sagemaker", "CreateTrainingJob", created) == []

        pipeline.local.lambda_calls.clear()
        arn = pipeline.start(pipeline.input(hyperparameters={"max_steps": 100}, tuning=TUNING), name="tuned")
        tuning = _wait_for(pipeline, arn, sent, "CreateHyperParameterTuningJob")
        request = _validated(pipeline)
        constants = sagemaker_constants(
            {**tuning["TrainingJobDefinition"], "CheckpointConfig": created["CheckpointConfig"]}
        )
        assert tuning == create_tuning_job(constants).values(RunState(request, 1, arn))
        assert api_problems("sagemaker", "CreateHyperParameterTuningJob", tuning) == []


def test_validate_builds_the_fallback_job_the_state_machine_sends_after_insufficient_capacity(
    pipeline_factory: Any,
) -> None:
    pipeline = pipeline_factory(scripts=[[CAPACITY], [Poll(), COMPLETED]])
    with sent_requests() as sent:
        arn = pipeline.start(pipeline.input(**FALLBACK))
        pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = [p for o, p in sent if o == "CreateTrainingJob"]
    request = _validated(pipeline)
    (priced,) = [c.result for c in pipeline.local.lambda_calls if c.handler.startswith("lambdas.estimate.")]
    # The request NextCluster moves onto the fallback cluster, of which Validate checked this CreateTrainingJob.
    moved = next_cluster(request, CostEstimate.model_validate(priced)).request
    assert moved.cluster == "1 x ml.g5.12xlarge"
    assert second == create_training_job(sagemaker_constants(second)).values(RunState(moved, 2, arn))
    assert first == create_training_job(sagemaker_constants(first)).values(RunState(request, 1, arn))


def test_validate_builds_the_batch_job_the_state_machine_submits(batch_factory: Any) -> None:  # noqa: F811
    pipeline = batch_factory(no_capacity_for=3)  # the job waits for instances: no node starts
    with sent_requests() as sent:
        arn = pipeline.start(pipeline.batch_input())
        submitted = _wait_for(pipeline, arn, sent, "SubmitJob")
    pipeline.local.sfn.stop_execution(executionArn=arn)
    environment = {
        e["name"]: e["value"]
        for e in submitted["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["environment"]
    }
    constants = BatchJobConstants(
        job_queue=submitted["jobQueue"],
        job_definition=submitted["jobDefinition"],
        checkpoints_bucket=split_s3_uri(environment[CHECKPOINTS_ENV])[0],
        artifacts_bucket=split_s3_uri(environment[OUTPUT_ENV])[0],
    )
    assert submitted["tags"][EXECUTION_TAG] == arn
    assert submitted == submit_job(constants).values(RunState(_validated(pipeline), 1, arn))
    assert api_problems("batch", "SubmitJob", submitted) == []


def _too_many_ranges(pipeline: Pipeline) -> dict[str, Any]:
    fixed = {trainer_field(key) for key in pipeline.input()["hyperparameters"]} | {"model.name", "distribution"}
    fields = [spec for name, spec in HYPERPARAMETERS.items() if name not in fixed and spec.default != ""]
    return {spec.name: {"type": "categorical", "values": [spec.default]} for spec in fields[: TUNING_RANGES + 1]}


@pytest.mark.parametrize("case", ["31 ranges", "a 308-character categorical value"])
def test_an_input_sagemaker_would_refuse_ends_at_validate(pipeline: Pipeline, case: str) -> None:
    if case == "31 ranges":
        ranges, hint = _too_many_ranges(pipeline), f"{TUNING_RANGES + 1} ranges"
    else:
        factory = "models." + "m" * 289 + ":build_model"
        ranges, hint = (
            {"model.factory": {"type": "categorical", "values": [factory]}},
            "has 308 characters; at most 256",
        )
    assert len(ranges) in (1, TUNING_RANGES + 1)
    with sent_requests() as sent:
        arn = pipeline.start(pipeline.input(tuning={**TUNING, "ranges": ranges}), name="over-limit")
        described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    states = pipeline.local.states_entered(arn)
    assert (described["status"], error, states[-1]) == ("FAILED", "InvalidRequest", "Request rejected")
    assert hint in cause, cause
    assert not [s for s in states if "gate" in s.lower() or "estimate" in s.lower()], states
    assert sent == [] and pipeline.local.tuning.jobs == {} and pipeline.jobs() == []

"""Each request is defined once and both forms derive from it: for every shape of every request, what Step Functions
makes of the states form (executed by the local platform's engine) is what Validate checks (the values)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract.execution_state import TRAIN, TrainingRequest
from contract.service_requests import (
    ATTEMPT_JOB_NAME,
    BatchJobConstants,
    RunState,
    ServiceJobConstants,
    ServiceRequest,
    TrainingJobConstants,
    Variant,
    create_training_job,
    create_tuning_job,
    submit_job,
    submit_service_job,
)
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = TrainingJobConstants(
    role_arn="arn:aws:iam::123456789012:role/Training",
    training_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/training:1",
    key_arn="arn:aws:kms:us-east-1:123456789012:key/k",
    subnet="subnet-1",
    security_group="sg-1",
    checkpoints_bucket="checkpoints",
    artifacts_bucket="artifacts",
    inter_container_encryption=True,
    network_isolation=False,
    training_plan_arn="arn:aws:sagemaker:us-east-1:123456789012:training-plan/p",
)
BATCH = BatchJobConstants("arn:queue", "arn:definition", "checkpoints", "artifacts")
QUEUE = ServiceJobConstants(team_queue="arn:teams-queue", preemption_retries=3)


def _request(example: str, *, instance_store: bool = False, plan: bool = False, **update: Any) -> TrainingRequest:
    request = TrainingRequest.parse(
        resolve(json.loads((EXAMPLES / f"{example}.json").read_text()), execution_name="e", limits=LIMITS)
    )
    groups = [
        group.model_copy(update={"local_storage": instance_store, "training_plan": plan})
        for group in request.instance_groups
    ]
    return request.model_copy(update={"instance_groups": groups, **update})


# Every shape the state machine sends each request in (its Choice states pick them by the request's fields).
SHAPES = {
    "ebs": _request("single-node-ddp"),
    "instance store": _request("single-node-ddp", instance_store=True),
    "groups": _request("heterogeneous-cluster"),
    "groups, instance store": _request("heterogeneous-cluster", instance_store=True),
    "training plan": _request("single-node-ddp", plan=True),
    "training plan, instance store": _request("single-node-ddp", instance_store=True, plan=True),
}
CASES = [
    *((f"CreateTrainingJob ({shape})", create_training_job(JOB), request) for shape, request in SHAPES.items()),
    *(
        (f"CreateHyperParameterTuningJob ({shape})", create_tuning_job(JOB), _request("tuning", instance_store=store))
        for shape, store in (("ebs", False), ("instance store", True))
    ),
    ("SubmitJob", submit_job(BATCH), _request("batch-multi-node")),
    *(
        (f"SubmitServiceJob ({shape})", submit_service_job(QUEUE, JOB), request.model_copy(update={"team": "a"}))
        for shape, request in SHAPES.items()
        if not request.training_plan
    ),
]


@pytest.fixture(scope="module")
def sfn() -> Iterator[Any]:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield boto3.client("stepfunctions", region_name="us-east-1")


def _executed(sfn: Any, request: ServiceRequest, variant: Variant, state: dict[str, Any]) -> tuple[str, Any]:
    """The Task's parameters as Step Functions builds them from the execution's state (in Pass states)."""
    states = {
        "Stage": {
            "Type": "Pass",
            "Parameters": request.staged_parameters(TRAIN.submission, variant),
            "ResultPath": str(TRAIN.submission),
            "Next": "Task",
        },
        "Task": {"Type": "Pass", "Parameters": request.states_parameters(variant), "End": True},
    }
    machine = sfn.create_state_machine(
        name=f"m{time.monotonic_ns()}",
        definition=json.dumps({"StartAt": "Stage", "States": states}),
        roleArn="arn:aws:iam::123456789012:role/StateMachine",
    )
    execution = sfn.start_execution(stateMachineArn=machine["stateMachineArn"], input=json.dumps(state))["executionArn"]
    for _ in range(500):
        described = sfn.describe_execution(executionArn=execution)
        if described["status"] != "RUNNING":
            assert described["status"] == "SUCCEEDED", described
            return execution, json.loads(described["output"])
        time.sleep(0.01)
    raise TimeoutError(execution)


def _member_names(value: Any) -> Any:
    """Keys with a lower-case first letter: an AWS SDK integration takes the API's members in PascalCase."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _member_names(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_member_names(item) for item in value]
    return value


@pytest.mark.parametrize(("case", "request_", "training"), CASES, ids=[case for case, _, _ in CASES])
def test_step_functions_builds_from_the_states_form_what_validate_checks(
    sfn: Any, case: str, request_: ServiceRequest, training: TrainingRequest
) -> None:
    state = {"request": training.model_dump(mode="json"), "train": {"attempt": 3}}
    execution, built = _executed(sfn, request_, Variant.of(training), state)
    values = request_.values(RunState(training, 3, execution))
    assert _member_names(built) == _member_names(values)


def test_the_shapes_are_the_ones_named() -> None:
    assert [Variant.of(request) for request in SHAPES.values()] == [
        Variant(),
        Variant(local_storage=True),
        Variant(heterogeneous=True),
        Variant(local_storage=True, heterogeneous=True),
        Variant(training_plan=True),
        Variant(local_storage=True, training_plan=True),
    ]


def test_a_job_name_is_the_run_and_the_attempt() -> None:
    request = SHAPES["ebs"]
    assert ATTEMPT_JOB_NAME.states() == "States.Format('{}-{}', $.request.job_name_base, $.train.attempt)"
    assert ATTEMPT_JOB_NAME.value(RunState(request, 2, "e")) == f"{request.job_name_base}-2"

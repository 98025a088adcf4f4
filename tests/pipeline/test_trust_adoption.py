"""A job found under a run's name is adopted only when it is the job the platform asked for, on every backend.

Acted out in the local platform with IAM enforced. A run's job names are predictable (the run's identity is a hash
of its execution's ARN and start, which anyone who may describe executions reads), and a tag is anyone's to set:
someone who may create jobs makes one under the name the run will ask for, tagged with the run's execution, while
the run waits at its launch gate. The run's create then finds it; the adoption check
(lambdas/jobs/adoption.py) compares it with what the run asked for and fails the run, naming the differences.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC
from typing import Any

import boto3
import pytest
from moto.core.exceptions import JsonRESTError

from contract.execution_state import TrainingRequest
from contract.service_requests import RunState, TrainingJobConstants, create_training_job
from lambdas.validate.request import run_identity
from localrun.aws.cfn import REGION
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_batch import batch_factory  # noqa: F401 (the fixture's definition)
from tests.pipeline.test_queue import (
    TEAM_A,
    TEAM_APPROVER,
    team_input,
    teams,  # noqa: F401 (the fixture's definition)
)

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 4, "max_runtime_hours": 10}


def _asked(pipeline: Pipeline, arn: str) -> tuple[TrainingRequest, TrainingJobConstants]:
    """What the run will ask for, as anyone who reads its execution and the state machine's definition can work
    out: its request, and the constants of its CreateTrainingJob."""
    (validated,) = [
        c.result["validation"]["request"]
        for c in pipeline.local.lambda_calls
        if c.handler.startswith("lambdas.validate.") and c.event.get("execution") == arn
    ]
    (create, *_) = [
        state["Parameters"]
        for state in pipeline.local.definition["States"].values()
        if state.get("Resource", "").endswith(":createTrainingJob") and "InstanceType.$" in json.dumps(state)
    ]
    checkpoints = create["CheckpointConfig"]["S3Uri.$"].split("s3://", 1)[1].split("/", 1)[0]
    constants = TrainingJobConstants(
        role_arn=create["RoleArn"],
        training_image=create["AlgorithmSpecification"]["TrainingImage"],
        key_arn=create["OutputDataConfig"]["KmsKeyId"],
        subnet=create["VpcConfig"]["Subnets"][0],
        security_group=create["VpcConfig"]["SecurityGroupIds"][0],
        checkpoints_bucket=checkpoints,
        artifacts_bucket=create["OutputDataConfig"]["S3OutputPath"].split("/")[2],
        inter_container_encryption=create["EnableInterContainerTrafficEncryption"],
        network_isolation=create["EnableNetworkIsolation"],
    )
    return TrainingRequest.parse(validated), constants


def _first_job(request: TrainingRequest, constants: TrainingJobConstants, arn: str) -> dict[str, Any]:
    """The CreateTrainingJob the run's first attempt sends."""
    return create_training_job(constants).values(RunState(request, 1, arn))


def test_a_jobs_name_is_predictable_from_its_execution(pipeline: Pipeline) -> None:
    """Why a name or a tag cannot say whose a job is: both are known before the run creates the job."""
    arn = pipeline.start(pipeline.input(**EXPENSIVE))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    started = pipeline.local.sfn.describe_execution(executionArn=arn)["startDate"].astimezone(UTC)
    predicted = f"gpt2-small-{run_identity(arn, started.isoformat(timespec='milliseconds').replace('+00:00', 'Z'))}-1"
    request, _ = _asked(pipeline, arn)
    assert f"{request.job_name_base}-1" == predicted


def _mutated(params: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(params)
    *parents, last = path.split(".")
    node = changed
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        ("AlgorithmSpecification.ContainerEntrypoint", ["python", "-c", "print('mine')"], "ContainerEntrypoint"),
        ("HyperParameters.max_steps", "1", "HyperParameters.max_steps"),
        ("RoleArn", "arn:aws:iam::123456789012:role/SomeoneElsesTrainingRole", "RoleArn"),
        ("Environment.LD_PRELOAD", "/opt/ml/input/data/train/x.so", "Environment has LD_PRELOAD"),
    ],
)
def test_a_training_job_made_under_the_runs_name_is_not_adopted_unless_it_is_the_one_asked_for(
    pipeline: Pipeline, path: str, value: Any, said: str
) -> None:
    arn = pipeline.start(pipeline.input(**EXPENSIVE))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    request, constants = _asked(pipeline, arn)
    # Someone who may create training jobs makes the run's first job, tagged with the run's execution.
    planted = _mutated(_first_job(request, constants, arn), path, value)
    boto3.client("sagemaker", region_name=REGION).create_training_job(**planted)
    pipeline.decide("launch", "approve")
    described = pipeline.finish(arn)
    states = pipeline.local.states_entered(arn)
    assert "Adopt the created job" not in states and "Existing training job is not the one asked for" in states
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "TrainingJobNotCreated"), cause
    assert f"A training job named {planted['TrainingJobName']} already exists" in cause and said in cause, cause
    assert pipeline.model_packages() == []


def test_a_training_job_made_exactly_as_the_run_asks_is_the_runs_own(pipeline: Pipeline) -> None:
    """The check refuses what differs, not whatever exists: the same request is the run's job, whoever sent it."""
    arn = pipeline.start(pipeline.input(**EXPENSIVE))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    request, constants = _asked(pipeline, arn)
    boto3.client("sagemaker", region_name=REGION).create_training_job(**_first_job(request, constants, arn))
    pipeline.decide("launch", "approve")
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert "Adopt the created job" in pipeline.local.states_entered(arn)
    assert len(pipeline.jobs()) == 1


def test_a_batch_job_found_by_name_after_a_lost_submit_is_not_adopted_unless_asked_for(
    batch_factory: Any,  # noqa: F811
) -> None:
    pipeline = batch_factory(lose_submit_responses=1, no_capacity_for=2)
    submit = pipeline.batch.submit

    def planted_first(params: dict[str, Any]) -> dict[str, str]:
        # Someone's job of the attempt's name, on the platform's queue, tagged as the run's; another command.
        if not pipeline.batch.jobs:
            node = copy.deepcopy(params)
            overrides = node["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]
            overrides["command"] = ["python", "-c", "print('mine')"]
            lost, pipeline.batch.lose_submit_responses = pipeline.batch.lose_submit_responses, 0
            submit(node)  # its answer reaches its sender
            pipeline.batch.lose_submit_responses = lost
        return submit(params)  # type: ignore[no-any-return]

    pipeline.batch.submit = planted_first
    arn = pipeline.start(pipeline.batch_input())
    described = pipeline.finish(arn, timeout=120)
    states = pipeline.local.states_entered(arn)
    assert "Find submitted Batch job" in states and "Adopt the submitted Batch job" not in states, states
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "TrainingJobNotCreated"), cause
    assert "is not the one this run asked for" in cause and "container.command is" in cause, cause
    # Both jobs of the run's name and execution were stopped with the run: its own, and the one made as it.
    assert [job.status for job in pipeline.batch.jobs.values()] == ["FAILED", "FAILED"]


def _lose_the_answer_once(local: Any) -> Any:
    """The teams' queue queues the run's submit, then its answer is lost on the way back; returns the submit whose
    answers are not lost."""
    submit, lost = local.queue.submit, {"n": 0}

    def submit_and_lose(params: dict[str, Any]) -> dict[str, str]:
        answer = submit(params)
        lost["n"] += 1
        if lost["n"] == 1:
            raise JsonRESTError("ServerException", "the connection closed before the answer was read")
        return answer  # type: ignore[no-any-return]

    local.queue.submit = submit_and_lose
    return submit


def test_a_retried_submit_refused_for_its_client_token_adopts_the_job_it_queued(teams: Any) -> None:  # noqa: F811
    pipeline = teams([[Poll(), COMPLETED]])
    _lose_the_answer_once(pipeline.local)
    arn = pipeline.start(team_input(pipeline, "team-a", "lost-answer"), requester=TEAM_A)
    pipeline.pending("promotion", caller=TEAM_APPROVER)
    states = pipeline.local.states_entered(arn)
    assert "Find submitted service job" in states and "Adopt the submitted service job" in states, states
    assert len(pipeline.local.queue.jobs) == 1  # the retry was refused: one job, the run's


def test_a_service_job_of_the_runs_name_is_not_adopted_unless_asked_for(teams: Any) -> None:  # noqa: F811
    pipeline = teams([[Poll(), COMPLETED]])
    queue = pipeline.local.queue
    answered = _lose_the_answer_once(pipeline.local)
    losing = queue.submit

    def planted_first(params: dict[str, Any]) -> dict[str, str]:
        if not queue.jobs:  # someone's, under the attempt's name and client token, with a payload of their own
            payload = json.loads(params["serviceRequestPayload"])
            payload["HyperParameters"]["max_steps"] = "1"
            answered({**params, "serviceRequestPayload": json.dumps(payload)})
        return losing(params)  # type: ignore[no-any-return]

    queue.submit = planted_first
    arn = pipeline.start(team_input(pipeline, "team-a", "planted"), requester=TEAM_A)
    described = pipeline.finish(arn, timeout=120)
    states = pipeline.local.states_entered(arn)
    assert "Adopt the submitted service job" not in states, states
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "ServiceJobNotSubmitted"), cause
    assert "serviceRequestPayload.HyperParameters.max_steps is" in cause, cause

"""A team's run on the queue backend, executed: its SageMaker request submitted as an AWS Batch service job under its
team's quota share (as Validate built it), queued for capacity with the scheduler's reason, preempted and resumed
from the run's checkpoints, and terminated on every way out (examples/teams.json's platform: two ml.m5.xlarge,
team-a lends its one, team-b borrows)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from botocore.client import BaseClient

from contract.execution_state import TrainingRequest
from contract.service_requests import (
    EXECUTION_TAG,
    TEAM_TAG,
    RunState,
    create_training_job,
    submit_service_job,
)
from lambdas.shared import history
from lambdas.validate.api_requests import PLACEHOLDERS, api_problems
from localrun.aws.cfn import ACCOUNT
from localrun.aws.clock import Clock
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from localrun.demo import scenario
from tests.conftest import TEAMS_SCENARIO
from tests.pipeline.conftest import COMPLETED, HANDOVER_BUDGET, Pipeline, sagemaker_constants

TEAM_A = f"arn:aws:iam::{ACCOUNT}:role/TeamAScientist"
TEAM_B = f"arn:aws:iam::{ACCOUNT}:role/TeamBScientist"
TEAM_APPROVER = f"arn:aws:iam::{ACCOUNT}:role/DemoApprover"
RUNNING = Poll()


@contextmanager
def submitted() -> Iterator[list[dict[str, Any]]]:
    """Every SubmitServiceJob call's parameters, as the state machine sent them."""
    sent: list[dict[str, Any]] = []
    original = BaseClient._make_api_call

    def record(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if operation == "SubmitServiceJob":
            sent.append(copy.deepcopy(params))
        return original(client, operation, params)

    with mock.patch.object(BaseClient, "_make_api_call", record):
        yield sent


def team_input(pipeline: Pipeline, team: str, run_name: str, **overrides: Any) -> dict[str, Any]:
    return {
        "run_name": run_name,
        "model": "tiny",
        "dataset": f"s3://{pipeline.datasets_bucket}/{team}/corpus/",
        "instance_type": "ml.m5.xlarge",
        "instance_count": 1,
        "max_runtime_hours": 1,
        "backend": "queue",
        "team": team,
        "priority": 5,
        "hyperparameters": {"max_steps": 100},
        "quality": {"metric": "validation:loss", "max": 3.0},
        **overrides,
    }


def progress_polls(pipeline: Pipeline, arn: str) -> list[dict[str, Any]]:
    """What PollServiceJob answered for this execution, in order."""
    return [
        c.result
        for c in pipeline.local.lambda_calls
        if c.handler.startswith("lambdas.queue.monitor") and c.event.get("execution") == arn and c.result
    ]


@pytest.fixture
def teams(teams_assembly: Path) -> Iterator[Any]:
    """The teams platform with scripted training; its polls wait a little, so that a stopped execution ends."""
    opened: list[LocalPlatform] = []

    def open_(scripts: list[list[Poll]]) -> Pipeline:
        training = ScriptedTraining(scripts=scripts)
        local = LocalPlatform(teams_assembly, training=training, clock=Clock(wait_scale=0.001))
        opened.append(local.__enter__())
        for role, tags in scenario.parse(json.loads(TEAMS_SCENARIO.read_text())).principal_tags.items():
            local.person(role, tags=tags)  # team-b admits its members by their tag
        return Pipeline(local, training)

    yield open_
    for local in opened:
        local.__exit__(None, None, None)


def test_a_teams_run_is_the_sagemaker_request_submitted_to_its_share_and_trained(teams: Any) -> None:
    pipeline = teams([[RUNNING, COMPLETED]])
    with submitted() as sent:
        arn = pipeline.start(team_input(pipeline, "team-a", "queued-a"), requester=TEAM_A)
        request_id = pipeline.pending("promotion", caller=TEAM_APPROVER)["request_id"]
        body = {"request_id": request_id, "decision": "approve", "reason": "team-a's lead"}
        assert pipeline.decide_raw(TEAM_APPROVER, body=body)["statusCode"] == 200
        described = pipeline.finish(arn)
    assert described["status"] == "SUCCEEDED", described
    (params,) = sent
    (validate,) = [c.result for c in pipeline.local.lambda_calls if c.handler.startswith("lambdas.validate.")]
    request = TrainingRequest.parse(validate["validation"]["request"])
    payload = json.loads(params["serviceRequestPayload"])
    constants = sagemaker_constants(payload)
    queue = dataclasses.replace(PLACEHOLDERS.queue, team_queue=params["jobQueue"])
    state = RunState(request, 1, arn)
    # Exactly what Validate built and checked against both services' models, SageMaker's request inside Batch's.
    assert payload == create_training_job(constants).values(state)
    assert {**params, "serviceRequestPayload": payload} == {
        **submit_service_job(queue, constants).values(state),
        "serviceRequestPayload": payload,
    }
    assert (
        api_problems("batch", "SubmitServiceJob", params)
        == []
        == api_problems("sagemaker", "CreateTrainingJob", payload)
    )
    assert params["quotaShareName"] == "team-a" and params["tags"][TEAM_TAG] == "team-a"
    assert params["tags"][EXECUTION_TAG] == arn and params["jobQueue"] == pipeline.local.queue.queue_arn
    # Batch ran it as a training job of its own name; the run's job is that training job.
    (training_job,) = pipeline.training.created_names
    assert training_job.startswith(f"AWSBatch{params['jobName']}")
    assert progress_polls(pipeline, arn)[-1]["job_name"] == training_job
    assert any(c.handler.startswith("lambdas.queue.cleanup") for c in pipeline.local.lambda_calls)


def test_a_borrowing_job_is_preempted_when_the_lender_submits_and_resumes_from_the_runs_checkpoints(
    teams: Any,
) -> None:
    # Creation order: b1 (team-b's own), b2 (borrows team-a's idle one), a1 (reclaims it), b2 again.
    pipeline = teams([[RUNNING], [RUNNING], [RUNNING, RUNNING, RUNNING, COMPLETED], [RUNNING, COMPLETED]])
    local, jobs = pipeline.local, pipeline.local.queue
    b1 = pipeline.start(team_input(pipeline, "team-b", "b-one"), name="b1", requester=TEAM_B)
    local.wait(b1, 60, until=lambda: len(pipeline.training.created_names) == 1)
    b2 = pipeline.start(team_input(pipeline, "team-b", "b-two"), name="b2", requester=TEAM_B)
    local.wait(b2, 60, until=lambda: len(pipeline.training.created_names) == 2)
    borrowed = pipeline.training.created_names[1]
    a1 = pipeline.start(team_input(pipeline, "team-a", "a-one"), name="a1", requester=TEAM_A)
    local.wait(b2, 60, until=lambda: any(p.get("preemptions") for p in progress_polls(pipeline, b2)))
    assert borrowed in pipeline.training.stopped_names
    (preempted,) = [j for j in jobs.jobs.values() if j.name.startswith("b-two-")]
    assert preempted.preemptions[0].status_reason == "Preempted to return capacity lent by share team-a"
    # a1 trains on the capacity it lent; when it ends, b2 starts again as a new training job of the same run.
    local.wait(b2, 90, until=lambda: len(pipeline.training.created_names) == 4)
    resumed = pipeline.training.created_names[3]
    assert resumed.startswith(f"AWSBatch{borrowed.removeprefix('AWSBatch')[: len('b-two')]}")
    requests = pipeline.training.requests
    assert requests[resumed]["CheckpointConfig"] == requests[borrowed]["CheckpointConfig"]
    assert any(f"{jobs.jobs[j].name}: requeued after preemption 1" in jobs.log for j in jobs.jobs)
    for arn in (b1, b2, a1):
        local.sfn.stop_execution(executionArn=arn)

    # Every way out terminates the execution's service jobs (the ended-execution rule runs StopServiceJobs): those
    # still waiting or running; the local scheduler moves on when called, as Batch would on its own.
    def cleaned() -> set[str]:
        return {
            c.event["detail"]["executionArn"]
            for c in local.lambda_calls
            if c.handler.startswith("lambdas.queue.cleanup") and "detail" in c.event and c.result is not None
        }

    def ended() -> bool:
        jobs.advance()
        return all(j.status in ("SUCCEEDED", "FAILED") for j in jobs.jobs.values())

    # The rule's cleanup runs once per stopped execution, however soon its jobs end by themselves.
    local.wait(b1, 60, until=lambda: {b1, b2, a1} <= cleaned())
    local.wait(b1, 60, until=ended)


def test_a_teams_second_job_waits_while_its_quota_is_full_and_is_terminated_when_its_run_is_stopped(
    teams: Any,
) -> None:
    pipeline = teams([[RUNNING], [RUNNING]])
    local, jobs = pipeline.local, pipeline.local.queue
    first = pipeline.start(team_input(pipeline, "team-a", "a-first"), name="a-first", requester=TEAM_A)
    local.wait(first, 60, until=lambda: len(pipeline.training.created_names) == 1)
    second = pipeline.start(team_input(pipeline, "team-a", "a-second"), name="a-second", requester=TEAM_A)
    local.wait(second, 60, until=lambda: any(p["status"] == "Queued" for p in progress_polls(pipeline, second)))
    queued = [p for p in progress_polls(pipeline, second) if p["status"] == "Queued"][-1]["queued"]
    assert queued == "queued for capacity: waiting for capacity: share team-a uses 1 of 1 ml.m5.xlarge"
    (waiting,) = [j for j in jobs.jobs.values() if j.name.startswith("a-second-")]
    # Stopped while it waits: no training job to stop, only its service job, which StopServiceJobs terminates.
    local.sfn.stop_execution(executionArn=second)
    local.wait(second, 60, until=lambda: waiting.terminated)
    assert waiting.status == "FAILED" and waiting.status_reason.startswith("Stopped by the training platform")
    assert len(pipeline.training.created_names) == 1
    local.sfn.stop_execution(executionArn=first)


def test_a_throttled_submit_is_retried_and_queues_one_service_job(teams: Any) -> None:
    """Batch throttles with HTTP 429 TooManyRequestsException, which its model does not declare: Step Functions
    reports it as Batch.AWSBatchException, which the submit retries."""
    pipeline = teams([[RUNNING, COMPLETED]])
    pipeline.local.faults.sdk_errors["SubmitServiceJob"] = ["TooManyRequestsException"] * 2
    with submitted() as sent:
        arn = pipeline.start(team_input(pipeline, "team-a", "throttled-a"), requester=TEAM_A)
        pipeline.run_until(arn, "Check progress (queue)", timeout=60)
    assert len(sent) == 3  # two throttled, one accepted
    assert len(pipeline.local.queue.jobs) == 1
    pipeline.local.sfn.stop_execution(executionArn=arn)


def test_a_submit_batch_refuses_fails_the_run_at_once_without_a_retry(teams: Any) -> None:
    """A ClientException (a missing quota share, a bad request) does not pass: the run fails with Batch's cause."""
    pipeline = teams([[RUNNING, COMPLETED]])
    pipeline.local.faults.sdk_errors["SubmitServiceJob"] = ["ClientException"] * 6
    with submitted() as sent:
        arn = pipeline.start(team_input(pipeline, "team-a", "refused-a"), requester=TEAM_A)
        described = pipeline.finish(arn, 60)
    assert described["status"] == "FAILED"
    assert pipeline.error(described)[0] == "ServiceJobNotSubmitted"
    assert "The quota share does not exist (injected)" in pipeline.error(described)[1]
    assert len(sent) == 1
    assert pipeline.local.queue.jobs == {}


def test_a_job_that_has_waited_long_is_polled_less_often(teams: Any) -> None:
    """A team's job waiting for its share is polled at the run's interval at first, and at most hourly once it has
    waited hours: the state machine waits what the progress handler says (lambdas/jobs/pacing.py)."""
    pipeline = teams([[RUNNING], [RUNNING]])
    local, jobs = pipeline.local, pipeline.local.queue
    first = pipeline.start(team_input(pipeline, "team-a", "a-first"), name="a-first", requester=TEAM_A)
    local.wait(first, 60, until=lambda: len(pipeline.training.created_names) == 1)
    second = pipeline.start(team_input(pipeline, "team-a", "a-second"), name="a-second", requester=TEAM_A)
    local.wait(second, 60, until=lambda: any(p["status"] == "Queued" for p in progress_polls(pipeline, second)))
    (early, *_) = [p for p in progress_polls(pipeline, second) if p["status"] == "Queued"]
    (waiting,) = [j for j in jobs.jobs.values() if j.name.startswith("a-second-")]
    waiting.created_at -= 5 * 3600 * 1000  # submitted five hours ago, as far as the next poll can tell

    def long_waits() -> list[dict[str, Any]]:
        return [p for p in progress_polls(pipeline, second) if (p.get("queued_seconds") or 0) >= 5 * 3600]

    local.wait(second, 60, until=lambda: len(long_waits()) >= 2)
    interval = early["poll_seconds"]
    assert interval < history.WAITING_POLL_CAP_SECONDS == long_waits()[0]["poll_seconds"]
    assert history.WAITING_POLL_CAP_SECONDS in local.clock.waits  # the Wait state waited what it was told
    local.sfn.stop_execution(executionArn=second)
    local.sfn.stop_execution(executionArn=first)


def test_a_job_that_waits_longer_than_its_run_allows_ends_the_run_and_says_why(teams: Any) -> None:
    pipeline = teams([[RUNNING], [RUNNING]])
    local, jobs = pipeline.local, pipeline.local.queue
    first = pipeline.start(team_input(pipeline, "team-a", "a-first"), name="a-first", requester=TEAM_A)
    local.wait(first, 60, until=lambda: len(pipeline.training.created_names) == 1)
    second_input = team_input(pipeline, "team-a", "a-second", max_queue_wait_minutes=30)
    second = pipeline.start(second_input, name="a-second", requester=TEAM_A)
    local.wait(second, 60, until=lambda: any(p["status"] == "Queued" for p in progress_polls(pipeline, second)))
    (waiting,) = [j for j in jobs.jobs.values() if j.name.startswith("a-second-")]
    waiting.created_at -= 31 * 60 * 1000  # submitted 31 minutes ago, as far as the next poll can tell
    described = pipeline.finish(second, 60)
    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "QueueWaitExceeded"
    assert f"service job {waiting.name} waited 31 min for capacity, longer than the run allows (30 min" in cause
    assert "share team-a uses 1 of 1 ml.m5.xlarge" in cause
    (told,) = [m for m in local.messages("TopicsRuns") if m.get("Subject") == "Training run failed"]
    assert json.loads(told["Message"])["error"] == "QueueWaitExceeded"
    local.wait(second, 60, until=lambda: waiting.terminated)  # the cleanup ended the waiting job
    local.sfn.stop_execution(executionArn=first)


@pytest.fixture(scope="module")
def teams_handing_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The teams platform whose executions hand their runs over after HANDOVER_BUDGET polls."""
    from localrun.demo.cli import synthesize

    settings = copy.deepcopy(scenario.parse(json.loads(TEAMS_SCENARIO.read_text())).settings)
    settings.setdefault("pipeline", {})["polls_per_execution"] = HANDOVER_BUDGET
    return synthesize(tmp_path_factory.mktemp("teams-handover"), lambda _: None, settings=settings)


def test_a_teams_run_handed_over_to_new_executions_ends_with_its_one_service_job(
    teams_handing_assembly: Path,
) -> None:
    """The loop every backend shares hands over (stacks/pipeline/handover.py): 3 polls per execution."""
    training = ScriptedTraining(scripts=[[*[RUNNING] * 7, COMPLETED]])
    local = LocalPlatform(teams_handing_assembly, training=training, clock=Clock(wait_scale=0.001))
    try:
        pipeline = Pipeline(local.__enter__(), training)
        with submitted() as sent:
            first = pipeline.start(team_input(pipeline, "team-a", "long-queued-a"), requester=TEAM_A)
            arn, executions = first, [first]

            def gate_or_end() -> bool:
                ended = pipeline.local.sfn.describe_execution(executionArn=arn)["status"] != "RUNNING"
                return ended or "Approval gate (promotion)" in pipeline.local.states_entered(arn)

            while (handed := pipeline.local.wait(arn, 120, until=gate_or_end))["status"] != "RUNNING":
                output = json.loads(handed.get("output") or "{}")
                assert output.get("run", {}).get("execution") == first, pipeline.error(handed)
                arn = output["continues_in"]
                executions.append(arn)
            request_id = pipeline.pending("promotion", caller=TEAM_APPROVER)["request_id"]
            body = {"request_id": request_id, "decision": "approve", "reason": "team-a's lead"}
            assert pipeline.decide_raw(TEAM_APPROVER, body=body)["statusCode"] == 200
            described = pipeline.finish(arn)
        assert described["status"] == "SUCCEEDED", pipeline.error(described)
        assert len(executions) >= 2
        assert len(sent) == 1 and len(training.created_names) == 1  # one service job, followed by every execution
        assert "Validate request" not in pipeline.local.states_entered(arn)
        # Every execution's polls name the run's first execution; each counts its own from 1, at most 3.
        polls = [p["polls"] for p in progress_polls(pipeline, first)]
        assert polls[:4] == [1, 2, 3, 1] and max(polls) == HANDOVER_BUDGET
    finally:
        local.__exit__(None, None, None)

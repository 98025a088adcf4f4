"""PollServiceJob and StopServiceJobs: a team's service job as the queue step follows it, and as cleanup ends it.

Batch's and SageMaker's answers are given as their APIs describe them (botocore's output shapes); S3 is moto's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract.execution_state import QueuePoll, TrainingRequest
from contract.layout import run_checkpoints, run_goodput
from contract.service_requests import EXECUTION_TAG
from lambdas.jobs.environment import MonitorEnvironment
from lambdas.jobs.prune import Ended
from lambdas.queue import cleanup
from lambdas.queue.environment import QueueCleanupEnvironment
from lambdas.queue.monitor import QUEUED, SERVICE_JOB_FAILED, poll
from lambdas.queue.waits import QUEUE_WAIT_EXCEEDED
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
ENVIRONMENT = MonitorEnvironment(checkpoints_bucket="ckpt", artifacts_bucket="art", checkpoint_stale_minutes=30)
REQUEST = TrainingRequest.parse(
    resolve(
        {
            "run_name": "queued",
            "model": "tiny",
            "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
            "instance_type": "ml.p5.48xlarge",
            "instance_count": 2,
            "max_runtime_hours": 2,
        },
        execution_name="e",
        limits=LIMITS,
    )
).model_copy(update={"backend": "queue", "team": "vision", "priority": 5})
NAME = f"{REQUEST.job_name_base}-1"


def _event() -> QueuePoll:
    return QueuePoll.model_validate(
        {
            "request": REQUEST.model_dump(mode="json"),
            "execution": "arn:aws:states:us-east-1:123456789012:execution:p:e",
            "job": {"job_name": NAME, "arn": "arn:aws:batch:us-east-1:123456789012:service-job/j1", "job_id": "j1"},
            "previous": {"stale_warned": False},
            "hourly_usd": 36.0,
        }
    )


def _attempt(training_job: str, reason: str = "") -> dict[str, Any]:
    arn = f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{training_job.lower()}"
    return {"serviceResourceId": {"name": "TrainingJobArn", "value": arn}, "startedAt": 1, "statusReason": reason}


def _service_job(status: str, *attempts: dict[str, Any], reason: str = "", preempted: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jobId": "j1",
        "jobName": NAME,
        "jobArn": "arn:aws:batch:us-east-1:123456789012:service-job/j1",
        "jobQueue": "teams",
        "serviceJobType": "SAGEMAKER_TRAINING",
        "serviceRequestPayload": "{}",
        "status": status,
        "statusReason": reason,
        "createdAt": 1,
        "attempts": list(attempts),
        "tags": {EXECUTION_TAG: "arn:aws:states:us-east-1:123456789012:execution:p:e"},
    }
    if preempted:
        out["preemptionSummary"] = {"preemptedAttemptCount": preempted, "recentPreemptedAttempts": list(attempts[:-1])}
    return out


def _training(name: str, status: str, secondary: str, *, billed: int | None = None, reason: str = "") -> dict[str, Any]:
    described: dict[str, Any] = {
        "TrainingJobName": name,
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "TrainingStartTime": T0,
        "SecondaryStatusTransitions": [{"Status": "Training", "StartTime": T0}],
        "FinalMetricDataList": [{"MetricName": "validation:loss", "Value": 2.0}] if status == "Completed" else [],
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://art/{name}/model.tar.gz"},
    }
    if billed is not None:
        described |= {
            "TrainingEndTime": T0 + timedelta(seconds=billed),
            "BillableTimeInSeconds": billed,
            "TrainingTimeInSeconds": billed,
        }
    if reason:
        described["FailureReason"] = reason
    return described


class _Batch:
    def __init__(self, described: dict[str, Any]) -> None:
        self.described = described

    def describe_service_job(self, *, jobId: str) -> dict[str, Any]:  # noqa: N803 (boto3's name)
        assert jobId == "j1"
        return self.described


class _SageMaker:
    """DescribeTrainingJob by the name as created (the ARN Batch gives has it lowercased); ListTrainingJobs."""

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.jobs = {job["TrainingJobName"]: job for job in jobs}

    def describe_training_job(self, *, TrainingJobName: str) -> dict[str, Any]:  # noqa: N803
        return self.jobs[TrainingJobName]

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_training_jobs"
        return self

    def paginate(self, *, NameContains: str) -> list[dict[str, Any]]:  # noqa: N803
        arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/{}"
        return [
            {
                "TrainingJobSummaries": [
                    {"TrainingJobName": name, "TrainingJobArn": arn.format(name)}
                    for name in self.jobs
                    if NameContains.lower() in name.lower()
                ]
            }
        ]


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        for bucket in ("ckpt", "art"):
            client.create_bucket(Bucket=bucket)
        yield client


def _poll(s3: Any, described: dict[str, Any], *jobs: dict[str, Any]) -> Any:
    return poll(_event(), batch=_Batch(described), sagemaker=_SageMaker(*jobs), s3=s3, environment=ENVIRONMENT, now=T0)


def test_a_waiting_job_is_queued_for_capacity_with_the_schedulers_reason(s3: Any) -> None:
    reason = "waiting for capacity: share vision uses 2 of 2 ml.p5.48xlarge; 1 job ahead"
    progress = _poll(s3, _service_job("RUNNABLE", reason=reason))
    assert (progress.status, progress.finished, progress.error) == (QUEUED, False, None)
    assert progress.queued == f"queued for capacity: {reason}"
    assert not progress.warn_stale and progress.cost is None


def test_a_running_job_is_its_training_jobs_progress(s3: Any) -> None:
    first = f"AWSBatch{NAME}0123"
    progress = _poll(s3, _service_job("RUNNING", _attempt(first)), _training(first, "InProgress", "Training"))
    assert (progress.job_name, progress.status, progress.finished, progress.queued) == (
        first,
        "InProgress",
        False,
        None,
    )


def test_a_scheduled_job_without_its_training_job_yet_holds_capacity_and_is_not_queued(s3: Any) -> None:
    progress = _poll(s3, _service_job("SCHEDULED"))
    assert (progress.status, progress.finished, progress.queued) == ("SCHEDULED", False, None)


def test_a_preempted_job_waits_again_and_counts_its_preemption(s3: Any) -> None:
    first = f"AWSBatch{NAME}0123"
    stopping = _poll(s3, _service_job("RUNNING", _attempt(first)), _training(first, "Stopped", "Stopped", billed=60))
    # Its training job has stopped while Batch still holds the capacity: not an end of the run.
    assert not stopping.finished and stopping.cost is None
    requeued = _poll(s3, _service_job("RUNNABLE", _attempt(first, "Preempted"), reason="Preempted", preempted=1))
    assert (requeued.status, requeued.preemptions, requeued.finished) == (QUEUED, 1, False)


def test_a_succeeded_job_costs_every_attempt_and_writes_each_attempts_ledger(s3: Any) -> None:
    first, second = f"AWSBatch{NAME}0123", f"AWSBatch{NAME}4567"
    described = _service_job("SUCCEEDED", _attempt(first, "Preempted"), _attempt(second), preempted=1)
    progress = _poll(
        s3,
        described,
        _training(first, "Stopped", "Stopped", billed=100),
        _training(second, "Completed", "Completed", billed=200),
    )
    assert (progress.status, progress.finished, progress.error, progress.preemptions) == ("Completed", True, None, 1)
    assert progress.job_name == second and progress.final_metrics == {"validation:loss": 2.0}
    assert progress.cost is not None and progress.cost.actual_usd == pytest.approx(36.0 * 300 / 3600)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="art")["Contents"]}
    assert {f"{run_goodput(REQUEST.job_name_base)}{name}.json" for name in (first, second)} <= keys
    assert progress.goodput is not None and progress.goodput["job"] == second


def test_a_job_ended_by_the_service_fails_with_its_reason(s3: Any) -> None:
    terminated = _poll(s3, _service_job("FAILED", reason="Stopped by the training platform"))
    assert (terminated.status, terminated.finished, terminated.error) == ("Failed", True, SERVICE_JOB_FAILED)
    assert "Stopped by the training platform" in terminated.failure_reason
    first = f"AWSBatch{NAME}0123"
    exhausted = _poll(
        s3,
        _service_job("FAILED", _attempt(first, "Preempted"), reason="preemption retries exhausted (0)", preempted=1),
        _training(first, "Stopped", "Stopped", billed=50),
    )
    assert exhausted.error == SERVICE_JOB_FAILED and not exhausted.retry_on_new_nodes
    assert exhausted.cost is not None and exhausted.cost.actual_usd == pytest.approx(0.5)


def test_a_training_job_that_failed_its_pre_flight_check_is_replaced_on_fresh_nodes(s3: Any) -> None:
    first = f"AWSBatch{NAME}0123"
    reason = "AlgorithmError: PreflightFailed: host algo-2 has 7 GPUs, expected 8"
    progress = _poll(
        s3,
        _service_job("FAILED", _attempt(first), reason="Received status from SageMaker: " + reason),
        _training(first, "Failed", "Failed", billed=30, reason=reason),
    )
    assert (progress.finished, progress.error, progress.retry_on_new_nodes) == (True, "PreflightFailed", True)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _waited(s3: Any, described: dict[str, Any], *, limit_minutes: int) -> Any:
    event = _event()
    event = event.model_copy(
        update={"request": event.request.model_copy(update={"max_queue_wait_seconds": 60 * limit_minutes})}
    )
    return poll(event, batch=_Batch(described), sagemaker=_SageMaker(), s3=s3, environment=ENVIRONMENT, now=T0)


def test_a_job_that_waits_longer_than_the_run_allows_ends_the_run_saying_how_long(s3: Any) -> None:
    reason = "waiting for capacity: share vision uses 2 of 2 ml.p5.48xlarge; 3 jobs ahead"
    described = _service_job("RUNNABLE", reason=reason) | {"createdAt": _ms(T0 - timedelta(hours=5, minutes=2))}
    within = _waited(s3, described, limit_minutes=6 * 60)
    assert (within.status, within.finished, within.queued_seconds) == (QUEUED, False, 5 * 3600 + 120)
    over = _waited(s3, described, limit_minutes=5 * 60)
    assert (over.status, over.finished, over.error, over.retry_on_new_nodes) == (
        "Failed",
        True,
        QUEUE_WAIT_EXCEEDED,
        False,
    )
    assert over.failure_reason == (
        f"service job {NAME} waited 5 h 2 min for capacity, longer than the run allows (5 h, max_queue_wait_minutes); "
        f"the scheduler's last reason: {reason}"
    )


def test_a_wait_after_a_preemption_counts_from_the_preemption(s3: Any) -> None:
    first = f"AWSBatch{NAME}0123"
    preempted = _attempt(first, "Preempted") | {"stoppedAt": _ms(T0 - timedelta(minutes=30))}
    described = _service_job("RUNNABLE", preempted, reason="Preempted", preempted=1)
    described["createdAt"] = _ms(T0 - timedelta(days=3))
    progress = _waited(s3, described, limit_minutes=60)
    assert (progress.status, progress.finished, progress.queued_seconds) == (QUEUED, False, 1800)


def test_a_job_the_queue_terminated_for_its_wait_ends_the_run_saying_why(s3: Any) -> None:
    reason = "Terminated by JobStateTimeLimit action due to reason: MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
    described = _service_job("FAILED", reason=reason) | {
        "createdAt": _ms(T0 - timedelta(hours=25)),
        "stoppedAt": _ms(T0 - timedelta(hours=1)),
    }
    progress = _poll(s3, described)
    assert (progress.finished, progress.error) == (True, QUEUE_WAIT_EXCEEDED)
    assert progress.failure_reason == (
        f"service job {NAME} FAILED: the teams' queue terminated the job after it had waited 1 d for capacity, blocked "
        "at the head of the queue because the job needs more instances than its team's quota share can hold "
        "(teams[].quota_share.capacity) (the queue's limit: service_environment.max_queue_wait_minutes)"
    )


class _Queue:
    """ListServiceJobs and DescribeServiceJob over a few jobs; TerminateServiceJob recorded."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs, self.terminated = {job["jobId"]: job for job in jobs}, []

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_service_jobs"
        return self

    def paginate(self, *, jobQueue: str, jobStatus: str) -> list[dict[str, Any]]:  # noqa: N803
        assert jobQueue == "teams"
        return [{"jobSummaryList": [j for j in self.jobs.values() if j["status"] == jobStatus]}]

    def describe_service_job(self, *, jobId: str) -> dict[str, Any]:  # noqa: N803
        return self.jobs[jobId]

    def terminate_service_job(self, *, jobId: str, reason: str) -> None:  # noqa: N803
        self.terminated.append((jobId, reason))


def test_cleanup_terminates_the_executions_waiting_and_running_service_jobs_only(s3: Any) -> None:
    mine, other = "arn:aws:states:us-east-1:1:execution:p:mine", "arn:aws:states:us-east-1:1:execution:p:other"
    jobs = [
        {"jobId": "a", "jobName": "run-aaaa-1", "status": "RUNNABLE", "tags": {EXECUTION_TAG: mine}},
        {"jobId": "b", "jobName": "run-aaaa-2", "status": "RUNNING", "tags": {EXECUTION_TAG: mine}},
        {"jobId": "c", "jobName": "run-bbbb-1", "status": "RUNNING", "tags": {EXECUTION_TAG: other}},
        # Another run's job that someone tagged with this execution: its name is not this run's.
        {"jobId": "f", "jobName": "run-bbbb-2", "status": "RUNNING", "tags": {EXECUTION_TAG: mine}},
        {"jobId": "d", "jobName": "run-aaaa-3", "status": "SUCCEEDED", "tags": {EXECUTION_TAG: mine}},
        {
            "jobId": "e",
            "jobName": "run-aaaa-4",
            "status": "RUNNING",
            "tags": {EXECUTION_TAG: mine},
            "isTerminated": True,
        },
    ]
    queue = _Queue(jobs)
    stores = QueueCleanupEnvironment(checkpoints_bucket="ckpt", artifacts_bucket="ckpt", job_queue="teams")
    result = cleanup.clean_up(Ended(mine, None, "aaaa"), queue="teams", stores=stores, batch=queue, s3=s3)
    assert [job for job, _ in queue.terminated] == ["a", "b"]
    assert all(mine in reason for _, reason in queue.terminated)
    assert result["stopped"] == ["run-aaaa-1", "run-aaaa-2"]
    assert [p["prefix"] for p in result["pruned"]] == [f"s3://ckpt/{run_checkpoints('run-aaaa')}"]

"""PollServiceJob handler: one poll of a team's AWS Batch service job and of the training job it runs.

The service job waits in the teams' queue until its quota share has capacity (RUNNABLE, with the
scheduler's reason), then Batch runs its payload as a SageMaker training job; when the scheduler
preempts it, that training job is stopped and the service job waits again, and its next training job
resumes from the run's checkpoints. While it waits the poll says why ("queued for capacity: ...");
while a training job runs it is summarised as the SageMaker step summarises its own
(lambdas/sagemaker/monitor.py: checkpoints, freshness, spot interruptions); when the service job ends,
the cost is every attempt's and each attempt's goodput ledger is written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from contract.execution_state import JobCost, JobProgress, QueuePoll
from lambdas.jobs.environment import MonitorEnvironment
from lambdas.jobs.progress import answer, observe_checkpoints
from lambdas.queue.waits import QUEUE_WAIT_EXCEEDED, in_words, queue_terminated
from lambdas.sagemaker.monitor import job_cost, sagemaker_ledger, summarize
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.TRAINING)

WAITING = ("SUBMITTED", "PENDING", "RUNNABLE")
"""A service job without capacity: it holds none of its share."""
QUEUED = "Queued"
"""The poll's status while the service job waits (JobProgress.status)."""
SERVICE_JOB_FAILED = "ServiceJobFailed"
"""The error of a service job that ended without a training job's own verdict (terminated, preemptions exhausted)."""


def training_jobs(sagemaker: Any, described: dict[str, Any]) -> list[str]:
    """The names of the training jobs the service job's attempts ran, oldest first.

    Batch names them after the service job and gives their ARNs, in which SageMaker may have lowercased the name;
    the name as SageMaker knows it is found by listing the jobs whose names contain the service job's.
    """
    arns = [
        str(resource["value"])
        for attempt in described.get("attempts", [])
        if (resource := attempt.get("serviceResourceId") or {}).get("name") == "TrainingJobArn"
        and resource.get("value")
    ]
    if not arns:
        return []
    named = {
        summary["TrainingJobArn"].lower(): summary["TrainingJobName"]
        for page in sagemaker.get_paginator("list_training_jobs").paginate(NameContains=described["jobName"])
        for summary in page["TrainingJobSummaries"]
    }
    return [named.get(arn.lower(), arn.rsplit("/", 1)[-1]) for arn in arns]


def preemptions(described: dict[str, Any]) -> int:
    return int((described.get("preemptionSummary") or {}).get("preemptedAttemptCount", 0))


def wait_started(described: dict[str, Any]) -> datetime:
    """When the service job began its present (or last) wait: its submission, or its last preemption."""
    stopped = [attempt["stoppedAt"] for attempt in described.get("attempts", []) if attempt.get("stoppedAt")]
    return datetime.fromtimestamp((stopped[-1] if stopped else described["createdAt"]) / 1000, UTC)


def waiting(
    described: dict[str, Any], event: QueuePoll, checkpoint: dict[str, Any] | None, *, now: datetime
) -> JobProgress:
    """A service job that waits for its share's capacity (first, or again after a preemption); past the run's
    maximum wait, the run's end (the cleanup terminates the job)."""
    reason = described.get("statusReason") or "waiting for capacity"
    waited = max(0.0, (now - wait_started(described)).total_seconds())
    progress = JobProgress.untrained(
        described["jobName"],
        QUEUED,
        described["status"],
        checkpoint=checkpoint,
        stale_warned=event.previous.stale_warned,
        queued=f"queued for capacity: {reason}",
        queued_seconds=round(waited),
        preemptions=preemptions(described),
    )
    limit = event.request.max_queue_wait_seconds
    if limit is None or waited <= limit:
        return progress
    return progress.model_copy(
        update={
            "status": "Failed",
            "finished": True,
            "error": QUEUE_WAIT_EXCEEDED,
            "failure_reason": (
                f"service job {described['jobName']} waited {in_words(waited)} for capacity, longer than the run "
                f"allows ({in_words(limit)}, max_queue_wait_minutes); the scheduler's last reason: {reason}"
            ),
        }
    )


def ended(
    described: dict[str, Any],
    summary: JobProgress | None,
    attempts: list[dict[str, Any]],
    *,
    event: QueuePoll,
    s3: Any,
    environment: MonitorEnvironment,
    now: datetime,
) -> JobProgress:
    """The service job's end: its last training job's verdict, every attempt's cost and goodput ledger.

    A service job that failed while its training job did not (terminated, or preempted more often than its
    preemption configuration allows) fails with the service's reason; one the queue terminated for waiting too
    long, with QUEUE_WAIT_EXCEEDED and the wait in words.
    """
    status, reason = described["status"], described.get("statusReason", "")
    ledgers = [sagemaker_ledger(s3, job, environment=environment, poll=event, into=metrics) for job in attempts]
    cost = JobCost.total(*(job_cost(job, event.hourly_usd) for job in attempts))
    if summary is None or (status == "FAILED" and summary.status != "Failed"):
        name = summary.job_name if summary else described["jobName"]
        base = summary or waiting(described, event, None, now=now)
        stopped = datetime.fromtimestamp(described.get("stoppedAt", described["createdAt"]) / 1000, UTC)
        too_long = queue_terminated(reason, waited_seconds=(stopped - wait_started(described)).total_seconds())
        return base.model_copy(
            update={
                "job_name": name,
                "status": "Failed",
                "finished": True,
                "error": QUEUE_WAIT_EXCEEDED if too_long else SERVICE_JOB_FAILED,
                "failure_reason": f"service job {described['jobName']} {status}: {too_long or reason}",
                "retry_on_new_nodes": False,
                "cost": cost,
                "queued": None,
                "queued_seconds": None,
                "goodput": ledgers[-1] if ledgers else None,
                "preemptions": preemptions(described),
            }
        )
    return summary.model_copy(
        update={"cost": cost, "goodput": ledgers[-1] if ledgers else None, "preemptions": preemptions(described)}
    )


def poll(
    event: QueuePoll, *, batch: Any, sagemaker: Any, s3: Any, environment: MonitorEnvironment, now: datetime
) -> JobProgress:
    """DescribeServiceJob, its latest training job and the run's checkpoints, summarised."""
    assert event.job.job_id is not None, "a service job is followed by the ID SubmitServiceJob answered"
    described = batch.describe_service_job(jobId=event.job.job_id)
    checkpoint = observe_checkpoints(
        s3,
        checkpoints_bucket=environment.checkpoints_bucket,
        artifacts_bucket=environment.artifacts_bucket,
        poll=event,
        job=event.job.job_name,
        into=metrics,
    )
    status = described["status"]
    if status in WAITING:
        return waiting(described, event, checkpoint, now=now)
    names = training_jobs(sagemaker, described)
    latest = sagemaker.describe_training_job(TrainingJobName=names[-1]) if names else None
    summary = (
        summarize(
            latest,
            checkpoint=checkpoint,
            now=now,
            stale_minutes=environment.checkpoint_stale_minutes,
            hourly_usd=event.hourly_usd,
            stale_warned=event.previous.stale_warned,
        ).model_copy(update={"preemptions": preemptions(described)})
        if latest is not None
        else None
    )
    if status not in ("SUCCEEDED", "FAILED"):
        # SCHEDULED, STARTING or RUNNING: its training job's progress, not yet its end (Batch's is the verdict).
        if summary is None:  # the capacity is the job's; Batch has not yet created its training job
            held = waiting(described, event, checkpoint, now=now)
            return held.model_copy(update={"status": status, "queued": None, "queued_seconds": None})
        return summary.model_copy(update={"finished": False, "cost": None}) if summary.finished else summary
    attempts = [sagemaker.describe_training_job(TrainingJobName=name) for name in names[:-1]]
    return ended(
        described,
        summary,
        [*attempts, *([latest] if latest else [])],
        event=event,
        s3=s3,
        environment=environment,
        now=now,
    )


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: a `QueuePoll`. One poll of the team's service job (one state per poll keeps the history short)."""
    parsed = QueuePoll.model_validate(event)
    summary = poll(
        parsed,
        batch=boto3.client("batch"),
        sagemaker=boto3.client("sagemaker"),
        s3=boto3.client("s3"),
        environment=MonitorEnvironment.from_environ(),
        now=datetime.now(UTC),
    )
    return answer(
        summary,
        parsed,
        into=metrics,
        message="service job polled",
        logged={"job_name", "status", "secondary_status", "queued", "preemptions"},
    )

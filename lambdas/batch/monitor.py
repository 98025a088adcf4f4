"""PollBatchJob handler: one poll of an AWS Batch multi-node job -> the same `JobProgress` SageMaker's Monitor gives.

Batch has no MetricDefinitions and no model artifacts of its own: the final metrics, the model's
URI and a failed node's reason come from the result each node's entrypoint writes under the job's
output prefix (training/batch_contract.py). A job still waiting for instances after the capacity
limit is terminated here and reported as insufficient capacity, which the step retries as a new job.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from contract import goodput
from contract.execution_state import BatchPoll, JobCost, JobProgress
from contract.layout import (
    INSUFFICIENT_CAPACITY,
    PEER_SYMPTOMS,
    RETRIED_ON_FRESH_NODES,
    result_key,
    run_output,
    split_s3_uri,
)
from lambdas.batch.environment import BatchMonitorEnvironment
from lambdas.jobs.progress import answer, freshness, observe_checkpoints, record_goodput
from lambdas.jobs.queue_cleanup import STOP_REASON
from lambdas.sagemaker.monitor import metrics
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")

# What StopBatchJobs and this handler give TerminateJob: a job ended this way was stopped, not failed.
CAPACITY_REASON = f"{STOP_REASON}: no capacity"
# Batch's statusReason for an attempt whose instance EC2 terminated (a lost node).
HOST_LOST = "Host EC2"
_SECONDARY = {"SUBMITTED": "Starting", "PENDING": "Starting", "RUNNABLE": "Starting", "STARTING": "Starting"}


def _ms(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, UTC) if value else None


def status_of(describe: dict[str, Any]) -> tuple[str, str]:
    """SageMaker's vocabulary for Batch's status: (status, secondary status)."""
    batch_status, reason = describe["status"], describe.get("statusReason", "")
    if batch_status == "SUCCEEDED":
        return "Completed", "Completed"
    if batch_status == "FAILED":
        stopped = reason.startswith(STOP_REASON) and not reason.startswith(CAPACITY_REASON)
        return ("Stopped", "Stopped") if stopped else ("Failed", "Failed")
    return "InProgress", _SECONDARY.get(batch_status, "Training")


def _seconds(describe: dict[str, Any]) -> int | None:
    """Instance time the job's attempts ran (from each attempt's start to its stop)."""
    spans = [(a.get("startedAt"), a.get("stoppedAt")) for a in describe.get("attempts", [])]
    spans = [(start, stop) for start, stop in spans if start and stop]
    return sum(round((stop - start) / 1000) for start, stop in spans) if spans else None


def attempt_transitions(describe: dict[str, Any]) -> list[goodput.Transition]:
    """The job's attempts as the ledger reads them: each attempt's run is training, a gap between two a stall
    (Batch replaced a lost node and started the job again)."""
    spans = sorted(
        (start, stop)
        for a in describe.get("attempts", [])
        if (start := _ms(a.get("startedAt"))) is not None and (stop := _ms(a.get("stoppedAt"))) is not None
    )
    transitions = []
    for i, (start, stop) in enumerate(spans):
        transitions.append(goodput.Transition("Training", start, stop))
        if i + 1 < len(spans):
            transitions.append(goodput.Transition("Restarting", stop, spans[i + 1][0]))
    return transitions


def job_cost(seconds: int | None, hourly_usd: float) -> JobCost | None:
    """On-Demand only (Batch runs no multi-node job on Spot): the attempts' run time at the estimate's price.

    That price is the catalog's SageMaker list price of the `ml.` type (contract/catalog.py). The
    instances are billed as the EC2 type behind it, whose On-Demand price AWS lists lower and the catalog
    does not hold, so this is an upper bound, as the estimate is.
    """
    if seconds is None:
        return None
    actual = round(hourly_usd * seconds / 3600, 4)
    return JobCost(actual_usd=actual, on_demand_usd=actual, spot_savings_usd=0.0)


def summarize(
    describe: dict[str, Any],
    *,
    results: list[dict[str, Any]],
    checkpoint: dict[str, Any] | None,
    now: datetime,
    stale_minutes: int,
    hourly_usd: float,
    capacity_error: str | None = None,
    stale_warned: bool = False,
) -> JobProgress:
    """The poll's verdict from DescribeJobs and the final attempt's node results (empty while running);
    `stale_warned`: the previous poll warned of a stall."""
    status, secondary = status_of(describe)
    if capacity_error:
        status, secondary = "Failed", "Failed"
    main = next((r for r in results if r.get("node") == describe.get("nodeProperties", {}).get("mainNode", 0)), None)
    failures = [r for r in sorted(results, key=lambda r: r["node"]) if r.get("failure")]
    # A node whose training failed leaves its peers waiting until their hang check ends them, or losing their link
    # to it: its failure is the cause.
    symptoms = tuple(f"{word}: " for word in PEER_SYMPTOMS)
    failed_node = next((r for r in failures if not r["failure"].startswith(symptoms)), None)
    failed_node = failed_node or next(iter(failures), None)
    reason = capacity_error or (failed_node or {}).get("failure") or ""
    error: str | None = None
    retry = False
    if capacity_error:
        error, retry = INSUFFICIENT_CAPACITY, True
    elif status == "Completed" and (main is None or not main.get("model_artifacts")):
        status, secondary = "Failed", "Failed"
        error, reason = "TrainingJobFailed", "the job succeeded but its main node recorded no model in S3"
    elif status == "Failed":
        cause = next((word for word in RETRIED_ON_FRESH_NODES if reason.startswith(f"{word}: ")), None)
        retry = cause is not None
        error = cause or "TrainingJobFailed"
        reason = reason or describe.get("statusReason", "") or f"{describe['jobName']} failed"
    elif status == "Stopped":
        error, reason = "TrainingJobStopped", describe.get("statusReason", "")
    started = _ms(describe.get("startedAt"))
    since = datetime.fromisoformat(checkpoint["written_at"]) if checkpoint else started
    seconds = _seconds(describe)
    finished = status != "InProgress"
    return JobProgress(
        job_name=describe["jobName"],
        status=status,
        secondary_status=secondary,
        finished=finished,
        error=error,
        failure_reason=reason,
        retry_on_new_nodes=retry,
        interruptions=sum(1 for a in describe.get("attempts", []) if a.get("statusReason", "").startswith(HOST_LOST)),
        checkpoint=checkpoint,
        **freshness(since, status, secondary, now=now, stale_minutes=stale_minutes, stale_warned=stale_warned),
        final_metrics=(main or {}).get("final_metrics", {}),
        billable_seconds=seconds,
        training_seconds=seconds,
        cost=job_cost(seconds, hourly_usd) if finished else None,
        model_artifacts=(main or {}).get("model_artifacts"),
    )


def node_results(s3: Any, output: str, attempt: int, nodes: int) -> list[dict[str, Any]]:
    """What each node of an attempt wrote (nodes that wrote nothing are left out)."""
    results = []
    for node in range(nodes):
        bucket, key = split_s3_uri(result_key(output, attempt, node))
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                raise
            continue
        results.append(json.loads(body))
    return results


def capacity_wait_exceeded(describe: dict[str, Any], now: datetime, minutes: int) -> bool:
    created = _ms(describe.get("createdAt"))
    return describe["status"] == "RUNNABLE" and created is not None and (now - created).total_seconds() > minutes * 60


def poll(event: BatchPoll, *, batch: Any, s3: Any, environment: BatchMonitorEnvironment, now: datetime) -> JobProgress:
    """DescribeJobs, the nodes' results once the job has ended, and the run's checkpoints, summarised.

    A job that waited too long for its nodes is terminated here.
    """
    if event.job.arn is None:
        raise ValueError(f"the submitted job {event.job.job_name} has no ARN to follow")
    job_id = event.job.arn.rsplit("/", 1)[1]
    (describe,) = batch.describe_jobs(jobs=[job_id])["jobs"]
    capacity_error = None
    wait = environment.capacity_wait_minutes
    if capacity_wait_exceeded(describe, now, wait):
        capacity_error = f"{CAPACITY_REASON}: the job waited {wait} minutes for its nodes"
        batch.terminate_job(jobId=job_id, reason=capacity_error)
    results: list[dict[str, Any]] = []
    if describe["status"] in ("SUCCEEDED", "FAILED"):
        output = f"s3://{environment.artifacts_bucket}/{run_output(describe['jobName'])}"
        attempts = max(1, len(describe.get("attempts", [])))
        results = node_results(s3, output, attempts, int(describe.get("nodeProperties", {}).get("numNodes", 1)))
    checkpoint = observe_checkpoints(
        s3,
        checkpoints_bucket=environment.checkpoints_bucket,
        artifacts_bucket=environment.artifacts_bucket,
        poll=event,
        job=event.job.job_name,
        into=metrics,
    )
    summary = summarize(
        describe,
        results=results,
        checkpoint=checkpoint,
        now=now,
        stale_minutes=environment.checkpoint_stale_minutes,
        hourly_usd=event.hourly_usd,
        capacity_error=capacity_error,
        stale_warned=event.previous.stale_warned,
    )
    if summary.finished and (transitions := attempt_transitions(describe)):
        summary.goodput = record_goodput(
            s3,
            checkpoints_bucket=environment.checkpoints_bucket,
            artifacts_bucket=environment.artifacts_bucket,
            poll=event,
            job=event.job.job_name,
            billed=(transitions[0].start, transitions[-1].end or transitions[-1].start),
            transitions=transitions,
            into=metrics,
            failure_reason=summary.failure_reason,
        )
    return summary


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: a `BatchPoll` (the job: {"arn", "job_name"})."""
    parsed = BatchPoll.model_validate(event)
    summary = poll(
        parsed,
        batch=boto3.client("batch"),
        s3=boto3.client("s3"),
        environment=BatchMonitorEnvironment.from_environ(),
        now=datetime.now(UTC),
    )
    return answer(
        summary,
        parsed,
        into=metrics,
        message="batch job polled",
        logged={"job_name", "status", "secondary_status", "interruptions"},
    )

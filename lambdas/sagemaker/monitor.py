"""SageMaker's monitor: one poll of a running training job -> status, spot interruptions, checkpoint freshness.

It describes the job (DescribeTrainingJob), turns the answer into the few fields the state
machine's Choice branches on, and looks at the run's checkpoint prefix in S3 (SageMaker uploads
/opt/ml/checkpoints there as the job writes it), recording each new complete checkpoint in the
run's ledger, from which the run's later jobs take what they may load.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from contract import goodput
from contract.execution_state import JobCost, JobProgress, Poll, SageMakerPoll
from contract.layout import INSUFFICIENT_CAPACITY, RETRIED_ON_FRESH_NODES
from lambdas.jobs.environment import MonitorEnvironment
from lambdas.jobs.progress import answer, freshness, observe_checkpoints, record_goodput
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.TRAINING)

# SageMaker's FailureReason for a cluster it could not provision.
_CAPACITY = ("CapacityError", "InsufficientInstanceCapacity", "Insufficient capacity")
# The pre-flight check failed, the straggler check stopped training or the launcher found the workers hung:
# SageMaker's FailureReason is "AlgorithmError: " and the failure file's first line.
_FRESH_NODES = re.compile(rf"(?:^|AlgorithmError: )({'|'.join(RETRIED_ON_FRESH_NODES)}): ")


def sagemaker_ledger(
    s3: Any,
    described: dict[str, Any],
    *,
    environment: MonitorEnvironment,
    poll: Poll,
    into: StageMetrics,
    trial: bool = False,
) -> dict[str, Any] | None:
    """The goodput ledger of an ended SageMaker training job (`described`), or None if it was never billed;
    `into`: the calling handler's metrics."""
    start, end = _time(described.get("TrainingStartTime")), _time(described.get("TrainingEndTime"))
    if start is None or end is None:
        return None
    return record_goodput(
        s3,
        checkpoints_bucket=environment.checkpoints_bucket,
        artifacts_bucket=environment.artifacts_bucket,
        poll=poll,
        job=described["TrainingJobName"],
        billed=(start, end),
        transitions=sagemaker_transitions(described),
        into=into,
        trial=trial,
        failure_reason=described.get("FailureReason", ""),
    )


def sagemaker_transitions(describe: dict[str, Any]) -> list[goodput.Transition]:
    """SecondaryStatusTransitions as the ledger reads them."""
    return [
        goodput.Transition(str(t["Status"]), start, _time(t.get("EndTime")))
        for t in describe.get("SecondaryStatusTransitions", [])
        if (start := _time(t.get("StartTime"))) is not None
    ]


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)


def retry_cause(status: str, reason: str) -> str | None:
    """Why a failed job is worth a new job on fresh instances ("InsufficientCapacity", or one of
    RETRIED_ON_FRESH_NODES); None when nothing says so."""
    if status != "Failed":
        return None
    if any(marker in reason for marker in _CAPACITY):
        return INSUFFICIENT_CAPACITY
    if match := _FRESH_NODES.search(reason):
        return match.group(1)
    return None


def _error(status: str, secondary: str, cause: str | None) -> str | None:
    if status == "Completed":
        return None
    if secondary in ("MaxWaitTimeExceeded", "MaxRuntimeExceeded"):
        return secondary
    if status == "Failed":
        return cause or "TrainingJobFailed"
    if status == "Stopped":
        return "TrainingJobStopped"
    return None


def job_cost(describe: dict[str, Any], hourly_usd: float) -> JobCost | None:
    """What a finished job cost, from SageMaker's billable seconds, and what managed spot saved.

    `hourly_usd` is the whole cluster's list price per hour (the estimate's). SageMaker bills each
    instance for BillableTimeInSeconds, which for spot is already reduced by the savings, so the
    same job on demand would have cost TrainingTimeInSeconds at the list price.
    """
    billable, training = describe.get("BillableTimeInSeconds"), describe.get("TrainingTimeInSeconds")
    if billable is None:
        return None
    actual = hourly_usd * billable / 3600
    on_demand = hourly_usd * max(billable, training or 0) / 3600
    return JobCost(
        actual_usd=round(actual, 4), on_demand_usd=round(on_demand, 4), spot_savings_usd=round(on_demand - actual, 4)
    )


def summarize(
    describe: dict[str, Any],
    *,
    checkpoint: dict[str, Any] | None,
    now: datetime,
    stale_minutes: int,
    hourly_usd: float,
    stale_warned: bool = False,
) -> JobProgress:
    """The poll's verdict from DescribeTrainingJob; `stale_warned`: the previous poll warned of a stall."""
    status = describe["TrainingJobStatus"]
    secondary = describe.get("SecondaryStatus", "")
    reason = describe.get("FailureReason", "")
    cause = retry_cause(status, reason)
    interruptions = sum(1 for t in describe.get("SecondaryStatusTransitions", []) if t.get("Status") == "Interrupted")

    since = _time(checkpoint["written_at"]) if checkpoint else _time(describe.get("TrainingStartTime"))
    error = _error(status, secondary, cause)
    finished = status in ("Completed", "Failed", "Stopped")
    return JobProgress(
        job_name=describe["TrainingJobName"],
        status=status,
        secondary_status=secondary,
        finished=finished,
        error=error,
        failure_reason=reason or (f"{describe['TrainingJobName']} ended {status} ({secondary})" if error else ""),
        retry_on_new_nodes=cause is not None,
        interruptions=interruptions,
        checkpoint=checkpoint,
        **freshness(since, status, secondary, now=now, stale_minutes=stale_minutes, stale_warned=stale_warned),
        final_metrics={m["MetricName"]: m["Value"] for m in describe.get("FinalMetricDataList", [])},
        billable_seconds=describe.get("BillableTimeInSeconds"),
        training_seconds=describe.get("TrainingTimeInSeconds"),
        cost=job_cost(describe, hourly_usd) if finished else None,
        model_artifacts=describe.get("ModelArtifacts", {}).get("S3ModelArtifacts"),
    )


def poll(
    event: SageMakerPoll, *, sagemaker: Any, s3: Any, environment: MonitorEnvironment, now: datetime
) -> JobProgress:
    """DescribeTrainingJob and the run's checkpoints, summarised."""
    described = sagemaker.describe_training_job(TrainingJobName=event.job_name)
    checkpoint = observe_checkpoints(
        s3,
        checkpoints_bucket=environment.checkpoints_bucket,
        artifacts_bucket=environment.artifacts_bucket,
        poll=event,
        job=event.job_name,
        into=metrics,
    )
    summary = summarize(
        described,
        checkpoint=checkpoint,
        now=now,
        stale_minutes=environment.checkpoint_stale_minutes,
        hourly_usd=event.hourly_usd,
        stale_warned=event.previous.stale_warned,
    )
    if summary.finished:
        summary.goodput = sagemaker_ledger(s3, described, environment=environment, poll=event, into=metrics)
    return summary


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: a `SageMakerPoll`. One poll: DescribeTrainingJob and the run's checkpoints, summarised
    (one state per poll keeps the execution's history short)."""
    parsed = SageMakerPoll.model_validate(event)
    summary = poll(
        parsed,
        sagemaker=boto3.client("sagemaker"),
        s3=boto3.client("s3"),
        environment=MonitorEnvironment.from_environ(),
        now=datetime.now(UTC),
    )
    return answer(
        summary,
        parsed,
        into=metrics,
        message="training job polled",
        logged={"job_name", "status", "secondary_status", "interruptions", "stale"},
    )

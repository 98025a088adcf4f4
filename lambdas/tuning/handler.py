"""Tuning monitor handler: one poll of a hyperparameter tuning job -> the contract's JobProgress.

While the tuning job runs, the progress names the tuning job and counts its trials. Once it has
ended, the progress is that of its best training job (DescribeTrainingJob, summarised as the
single-job Monitor does), with `tuning` saying which tuning job and trial it is and what it tuned,
so Evaluate and Register read it as they read any job. Its seconds and cost are those of every
trial the tuning job ran, which is what the run cost; `tuning` keeps the best trial's own cost.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from contract.execution_state import JobCost, JobProgress, Poll, TunedTrial
from contract.layout import run_goodput
from lambdas.jobs.environment import MonitorEnvironment
from lambdas.jobs.pacing import paced
from lambdas.jobs.progress import observe_checkpoints, record_metrics, with_run_cost
from lambdas.sagemaker.monitor import job_cost, sagemaker_ledger, summarize
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.TRAINING)

_ENDED = ("Completed", "Failed", "Stopped")


def _counters(described: dict[str, Any]) -> tuple[int, int]:
    """Trials completed, and trials launched so far."""
    counters = described.get("TrainingJobStatusCounters", {})
    return int(counters.get("Completed", 0)), sum(int(v) for v in counters.values())


def _progress(name: str, status: str, *, error: str | None, reason: str) -> JobProgress:
    """A JobProgress of the tuning job itself (no trial to report yet, or none to report)."""
    return JobProgress.untrained(name, status, status, finished=status in _ENDED, error=error, failure_reason=reason)


def trials_total(sagemaker: Any, name: str, *, hourly_usd: float) -> dict[str, Any]:
    """Every trial's billed and trained seconds and cost, summed (trials never billed add nothing)."""
    billable = training = billed = 0
    actual = on_demand = 0.0
    pages = sagemaker.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
        HyperParameterTuningJobName=name, PaginationConfig={"PageSize": 100}
    )
    for page in pages:
        for trial in page["TrainingJobSummaries"]:
            described = sagemaker.describe_training_job(TrainingJobName=trial["TrainingJobName"])
            cost = job_cost(described, hourly_usd)
            if cost is None:
                continue
            billed += 1
            billable += int(described["BillableTimeInSeconds"])
            training += int(described.get("TrainingTimeInSeconds") or 0)
            actual += cost.actual_usd
            on_demand += cost.on_demand_usd
    return {
        "billable_seconds": billable,
        "training_seconds": training,
        "cost": JobCost(
            actual_usd=round(actual, 4),
            on_demand_usd=round(on_demand, 4),
            spot_savings_usd=round(on_demand - actual, 4),
        ),
        "trials_billed": billed,
    }


def record_trial_ledgers(
    sagemaker: Any, s3: Any, name: str, *, poll: Poll, environment: MonitorEnvironment
) -> list[dict[str, Any]]:
    """Each ended trial's goodput ledger, into the run's lineage (written once; see record_goodput). Trials whose
    ledger is written already are skipped, so a retried poll goes on where a timed-out one stopped."""
    prefix = run_goodput(poll.request.job_name_base)
    written = {
        item["Key"].removeprefix(prefix)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=environment.artifacts_bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    }
    ledgers = []
    pages = sagemaker.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
        HyperParameterTuningJobName=name, PaginationConfig={"PageSize": 100}
    )
    for page in pages:
        for trial in page["TrainingJobSummaries"]:
            if trial["TrainingJobStatus"] not in _ENDED or f"{trial['TrainingJobName']}.json" in written:
                continue
            described = sagemaker.describe_training_job(TrainingJobName=trial["TrainingJobName"])
            ledger = sagemaker_ledger(s3, described, environment=environment, poll=poll, into=metrics, trial=True)
            if ledger is not None:
                ledgers.append(ledger)
    return ledgers


def poll(sagemaker: Any, name: str, *, hourly_usd: float, now: datetime) -> JobProgress:
    """Describe the tuning job; once it has ended, describe and summarise its best training job."""
    described = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    status = described["HyperParameterTuningJobStatus"]
    completed, launched = _counters(described)
    best = described.get("BestTrainingJob")
    if status not in _ENDED:
        return _progress(name, "InProgress", error=None, reason="")
    if status != "Completed" or best is None:
        reason = described.get("FailureReason") or (
            f"{name} ended {status}: {completed} of {launched} trials completed"
            + ("" if best is not None else ", none with the objective metric")
        )
        error = "TuningJobStopped" if status == "Stopped" else "TuningJobFailed"
        return _progress(name, "Stopped" if status == "Stopped" else "Failed", error=error, reason=reason)
    trial = sagemaker.describe_training_job(TrainingJobName=best["TrainingJobName"])
    summary = summarize(trial, checkpoint=None, now=now, stale_minutes=10**6, hourly_usd=hourly_usd)
    objective = best.get("FinalHyperParameterTuningJobObjectiveMetric", {})
    config = described["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    total = trials_total(sagemaker, name, hourly_usd=hourly_usd)
    tuning = TunedTrial(
        tuning_job=name,
        best_training_job=best["TrainingJobName"],
        hyperparameters=dict(best.get("TunedHyperParameters", {})),
        objective_metric=objective.get("MetricName", config["MetricName"]),
        objective_type=config["Type"],
        objective_value=objective.get("Value"),
        trials_completed=completed,
        trials_launched=launched,
        trials_billed=total.pop("trials_billed"),
        best_trial_cost=summary.cost,
    )
    return summary.model_copy(update={"tuning": tuning, **total})


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: a `Poll`; the tuning job is the request's."""
    parsed = Poll.model_validate(event)
    if parsed.request.tuning is None:
        raise ValueError("the request has no tuning job to poll")
    name = parsed.request.tuning.job_name
    summary = poll(boto3.client("sagemaker"), name, hourly_usd=parsed.hourly_usd, now=datetime.now(UTC))
    environment = MonitorEnvironment.from_environ()
    # Each trial's checkpoints, under the run's prefix, are recorded in the run's ledger as the single job's are.
    observe_checkpoints(
        boto3.client("s3"),
        checkpoints_bucket=environment.checkpoints_bucket,
        artifacts_bucket=environment.artifacts_bucket,
        poll=parsed,
        job=name,
        into=metrics,
    )
    if summary.tuning is not None:
        record_metrics(summary, metrics, team=parsed.request.team)
    if summary.finished:
        record_trial_ledgers(boto3.client("sagemaker"), boto3.client("s3"), name, poll=parsed, environment=environment)
    logger.info("tuning job polled", extra=summary.model_dump(include={"job_name", "status", "error"}))
    return paced(with_run_cost(summary, parsed), parsed).model_dump(mode="json")

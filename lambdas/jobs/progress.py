"""What a poll of any backend's job records: the run's checkpoints in its ledger, a finished job's goodput ledger,
the checkpoint's freshness and the job's metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools import Logger

from contract import goodput, hang, ledger
from contract.execution_state import JobCost, JobProgress, Poll
from contract.layout import run_checkpoints, run_goodput
from contract.stored_checkpoints import complete_checkpoints
from lambdas.jobs.pacing import paced
from lambdas.shared.errors import is_transient
from lambdas.shared.metrics import GOODPUT_LOG_MESSAGE, Metric, StageMetrics

logger = Logger(service="training-platform")


def observe_checkpoints(
    s3: Any, *, checkpoints_bucket: str, artifacts_bucket: str, poll: Poll, job: str, into: StageMetrics
) -> dict[str, Any] | None:
    """Record the run's complete checkpoints in its ledger (contract/ledger.py); the newest one the run may resume
    from (`ledger.resumable`).

    A checkpoint whose manifest is not the one recorded of it was changed after the platform saw it:
    it is logged and counted (`into`, the calling handler's metrics), and never reported or loaded.
    """
    run = poll.request.job_name_base
    stored = complete_checkpoints(s3, checkpoints_bucket, run_checkpoints(run))
    seen = ledger.record_seen(s3, artifacts_bucket, run, stored, job=job, execution=poll.execution)
    for uri in seen.not_as_recorded:
        logger.warning("checkpoint changed after it was recorded; it will not be loaded", extra={"checkpoint": uri})
        into.record(Metric.CHECKPOINTS_NOT_AS_RECORDED)
    for recorded in seen.recorded:
        logger.info("checkpoint recorded", extra={"checkpoint": recorded.checkpoint, "job": job})
    newest = ledger.resumable(stored, seen.ledger, run)
    return newest[0].summary() if newest else None


def record_goodput(
    s3: Any,
    *,
    checkpoints_bucket: str,
    artifacts_bucket: str,
    poll: Poll,
    job: str,
    billed: tuple[datetime, datetime],
    transitions: list[goodput.Transition],
    into: StageMetrics,
    trial: bool = False,
    failure_reason: str = "",
) -> dict[str, Any] | None:
    """A finished job's goodput ledger (contract/goodput.py) from its billed interval, its service's transitions
    and its trainer's progress records, written once into the run's lineage and counted in `into`; as JSON.

    A job's ledger is written by the first poll that sees it end; a poll after that (a retried invocation)
    finds it and counts nothing again. A tuning trial (`trial`) keeps its progress records in its own folder.
    The ledger is accounting: an error in it that would not pass if tried again is logged and the ledger left
    out (None), never the run's end; one that passes (throttling, a timeout) is raised for the retry.
    """
    try:
        run = poll.request.job_name_base
        instances = sum(group.instance_count for group in poll.request.instance_groups)
        records = goodput.stored_records(s3, checkpoints_bucket, run, job, trial=trial)
        found = goodput.job_ledger(
            job,
            instances=instances,
            billed_start=billed[0],
            billed_end=billed[1],
            transitions=transitions,
            records=records,
            hung_seconds=hang.hung_seconds(failure_reason),
        )
        body = found.to_json()
        if ledger.put_once(s3, artifacts_bucket, f"{run_goodput(run)}{job}.json", body):
            into.record(Metric.BILLED_INSTANCE_SECONDS, found.billed_seconds * instances)
            into.record(Metric.PRODUCTIVE_INSTANCE_SECONDS, found.parts["productive"] * instances)
            into.record(Metric.GOODPUT, 100 * found.goodput)
            logger.info(
                GOODPUT_LOG_MESSAGE,
                extra={
                    "run": run,
                    "job": job,
                    "goodput": body["goodput"],
                    "billed_seconds": found.billed_seconds,
                    "parts": found.parts,
                },
            )
        return body
    except Exception as error:
        if is_transient(error):
            raise
        logger.exception("goodput ledger not written", extra={"job": job})
        return None


def freshness(
    since: datetime | None, status: str, secondary: str, *, now: datetime, stale_minutes: int, stale_warned: bool
) -> dict[str, Any]:
    """A poll's checkpoint_age_minutes, stale, warn_stale and stale_warned (JobProgress's fields).

    `since`: the newest complete checkpoint's time, or training's start if none yet.
    """
    age = round((now - since).total_seconds() / 60, 1) if since else None
    stale = status == "InProgress" and secondary == "Training" and age is not None and age > stale_minutes
    # Warn once per stall; a fresh checkpoint re-arms the warning.
    return {
        "checkpoint_age_minutes": age,
        "stale": stale,
        "warn_stale": stale and not stale_warned,
        "stale_warned": stale,
    }


def record_metrics(summary: JobProgress, into: StageMetrics, *, team: str | None) -> None:
    """Checkpoint age while training; a finished job's outcome, duration, interruptions and cost, once; the cost
    also as the team's (`team`: the request's, None for a run of no team).

    `into` is the calling handler's own metrics, which its `flushed` decorator emits.
    """
    if summary.status == "InProgress" and summary.checkpoint_age_minutes is not None:
        into.record(Metric.CHECKPOINT_AGE, summary.checkpoint_age_minutes * 60)
    if not summary.finished:
        return
    into.record(Metric.JOBS_COMPLETED if summary.status == "Completed" else Metric.JOBS_FAILED)
    into.record(Metric.SPOT_INTERRUPTIONS, summary.interruptions)
    if summary.training_seconds is not None:
        into.record(Metric.JOB_DURATION, summary.training_seconds)
    if summary.cost is not None:
        into.record(Metric.TRAINING_COST, summary.cost.actual_usd)
        into.record(Metric.SPOT_SAVINGS, summary.cost.spot_savings_usd)
        if team is not None:
            into.record_for_team(Metric.TEAM_TRAINING_COST, team, summary.cost.actual_usd)


def with_run_cost(summary: JobProgress, poll: Poll) -> JobProgress:
    """A finished job's `summary` with the run's cost so far: its job's and the earlier attempts' (`poll.billed`)."""
    if not summary.finished:
        return summary
    return summary.model_copy(update={"run_cost": JobCost.total(poll.billed, summary.cost)})


def answer(summary: JobProgress, poll: Poll, *, into: StageMetrics, message: str, logged: set[str]) -> dict[str, Any]:
    """A progress handler's answer to `poll`: `summary`'s metrics recorded into the handler's own `into`
    (`record_metrics`), `message` logged with the summary's `logged` fields (where the handler called this), and the
    summary with the run's cost so far (`with_run_cost`) and the next poll's wait (`paced`), as the state machine
    reads it."""
    record_metrics(summary, into, team=poll.request.team)
    logger.info(message, extra=summary.model_dump(include=logged), stacklevel=3)
    return paced(with_run_cost(summary, poll), poll).model_dump(mode="json")

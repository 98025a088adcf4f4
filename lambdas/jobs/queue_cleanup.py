"""The cleanup of an ended execution's jobs on an AWS Batch job queue, the Batch backend's (multi-node parallel jobs)
and the teams' queue's (service jobs) alike: the execution's jobs that have not ended (each backend lists its own)
terminated with the platform's reason, then the run's checkpoints pruned (lambdas/jobs/prune.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.jobs.environment import CleanupEnvironment, JobQueueCleanupEnvironment
from lambdas.jobs.prune import CLEANUP_EVENT, Ended, ended_execution, prune_runs
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")
STOP_REASON = "Stopped by the training platform"
"""How the reason the platform gives a job it terminates begins (the Batch monitor tells such a job by it)."""


def terminate_and_prune(
    ended: Ended,
    jobs: Iterable[dict[str, str]],
    terminate: Callable[..., object],
    *,
    noun: str,
    stores: CleanupEnvironment,
    s3: Any,
) -> dict[str, Any]:
    """Terminate each of `jobs` ({"job_id", "job_name"}) with `terminate` (AWS Batch's TerminateJob or
    TerminateServiceJob, which take the same arguments), logged as a `noun` terminated; then prune the checkpoints of
    the execution's run and of the jobs terminated."""
    terminated = []
    for job in jobs:
        terminate(jobId=job["job_id"], reason=f"{STOP_REASON}: execution {ended.execution} ended")
        terminated.append(job["job_name"])
        logger.info(f"{noun} terminated", extra={"job": job["job_name"], "execution": ended.execution})
    runs = [ended.run] if ended.run is not None else []
    return {"stopped": terminated, "pruned": prune_runs(s3, stores, runs, terminated)}


def queue_cleanup_handler(
    environment: Callable[[], JobQueueCleanupEnvironment], clean_up: Callable[..., dict[str, Any]], *, message: str
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """A queue's cleanup handler: the ended execution from the event, cleaned up by the backend's
    `clean_up(ended, queue=, stores=, batch=, s3=)` on the queue `environment()` names; `message` logs the result."""

    @classified
    @logger.inject_lambda_context(log_event=False)
    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        """State machine: {"execution", "job_name_base"}; EventBridge: an Execution Status Change event."""
        stores = environment()
        ended = ended_execution(CLEANUP_EVENT.validate_python(event), boto3.client("stepfunctions"))
        batch, s3 = boto3.client("batch"), boto3.client("s3")
        result = clean_up(ended, queue=stores.job_queue, stores=stores, batch=batch, s3=s3)
        logger.info(message, extra={"execution": ended.execution, **result})
        return result

    return handler

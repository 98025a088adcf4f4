"""StopServiceJobs handler: no team's service job outlives its execution, and a run's checkpoints stop growing.

Invoked by the state machine on every way out of a queued run, and by EventBridge when an execution
ends ABORTED, TIMED_OUT or FAILED: terminates the teams' queue's service jobs that have not ended and
are the execution's (`Ended.owns`; waiting or running: Batch stops a running one's training job), then prunes
the run's checkpoints to the newest one it may resume from (lambdas/sagemaker/cleanup.py's pruning).
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import CLEANUP_EVENT, Ended, ended_execution, prune_runs
from lambdas.queue.environment import QueueCleanupEnvironment
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")
ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
STOP_REASON = "Stopped by the training platform"


def active_jobs(batch: Any, queue: str, ended: Ended) -> list[dict[str, str]]:
    """The queue's service jobs that have not ended and are the ended execution's (`Ended.owns`)."""
    found = []
    for status in ACTIVE:
        for page in batch.get_paginator("list_service_jobs").paginate(jobQueue=queue, jobStatus=status):
            for summary in page["jobSummaryList"]:
                job = batch.describe_service_job(jobId=summary["jobId"])
                if ended.owns(job["jobName"], job.get("tags") or {}) and not job.get("isTerminated"):
                    found.append({"job_id": job["jobId"], "job_name": job["jobName"]})
    return found


def clean_up(ended: Ended, *, queue: str, stores: CleanupEnvironment, batch: Any, s3: Any) -> dict[str, Any]:
    """Terminate the execution's service jobs, then prune the checkpoints of the given runs and of those jobs."""
    terminated = []
    execution = ended.execution
    for job in active_jobs(batch, queue, ended):
        batch.terminate_service_job(jobId=job["job_id"], reason=f"{STOP_REASON}: execution {execution} ended")
        terminated.append(job["job_name"])
        logger.info("service job terminated", extra={"job": job["job_name"], "execution": execution})
    runs = [ended.run] if ended.run is not None else []
    return {"stopped": terminated, "pruned": prune_runs(s3, stores, runs, terminated)}


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """State machine: {"execution", "job_name_base"}; EventBridge: an Execution Status Change event."""
    environment = QueueCleanupEnvironment.from_environ()
    ended = ended_execution(CLEANUP_EVENT.validate_python(event))
    result = clean_up(
        ended,
        queue=environment.job_queue,
        stores=environment,
        batch=boto3.client("batch"),
        s3=boto3.client("s3"),
    )
    logger.info("queued run cleaned up", extra={"execution": ended.execution, **result})
    return result

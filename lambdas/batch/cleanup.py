"""StopBatchJobs handler: no AWS Batch job outlives its execution, and a run's checkpoints stop growing.

Invoked by the state machine on every way out of a Batch run, and by EventBridge when an execution
ends ABORTED, TIMED_OUT or FAILED: terminates the queue's active jobs of the execution (`Ended.owns`),
then prunes the run's checkpoints to the newest one it may resume from (lambdas/sagemaker/cleanup.py's pruning).
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.batch.environment import BatchCleanupEnvironment
from lambdas.batch.monitor import STOP_REASON
from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import CLEANUP_EVENT, Ended, ended_execution, prune_runs
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")
ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")


def active_jobs(batch: Any, queue: str, ended: Ended) -> list[dict[str, str]]:
    """The queue's jobs that have not ended and are the ended execution's (`Ended.owns`)."""
    summaries = [
        summary
        for status in ACTIVE
        for page in batch.get_paginator("list_jobs").paginate(jobQueue=queue, jobStatus=status)
        for summary in page["jobSummaryList"]
    ]
    ids = [s["jobId"] for s in summaries]
    found = []
    for start in range(0, len(ids), 100):
        for job in batch.describe_jobs(jobs=ids[start : start + 100])["jobs"]:
            if ended.owns(job["jobName"], job.get("tags") or {}):
                found.append({"job_id": job["jobId"], "job_name": job["jobName"]})
    return found


def clean_up(ended: Ended, *, queue: str, stores: CleanupEnvironment, batch: Any, s3: Any) -> dict[str, Any]:
    """Terminate the execution's jobs, then prune the checkpoints of the given runs and of the jobs terminated."""
    terminated = []
    execution = ended.execution
    for job in active_jobs(batch, queue, ended):
        batch.terminate_job(jobId=job["job_id"], reason=f"{STOP_REASON}: execution {execution} ended")
        terminated.append(job["job_name"])
        logger.info("batch job terminated", extra={"job": job["job_name"], "execution": execution})
    runs = [ended.run] if ended.run is not None else []
    return {"stopped": terminated, "pruned": prune_runs(s3, stores, runs, terminated)}


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """State machine: {"execution", "job_name_base"}; EventBridge: an Execution Status Change event."""
    environment = BatchCleanupEnvironment.from_environ()
    ended = ended_execution(CLEANUP_EVENT.validate_python(event))
    result = clean_up(
        ended,
        queue=environment.job_queue,
        stores=environment,
        batch=boto3.client("batch"),
        s3=boto3.client("s3"),
    )
    logger.info("batch run cleaned up", extra={"execution": ended.execution, **result})
    return result

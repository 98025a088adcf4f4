"""StopBatchJobs handler: no AWS Batch job outlives its execution, and a run's checkpoints stop growing.

Invoked by the state machine on every way out of a Batch run, and by EventBridge when an execution
ends ABORTED, TIMED_OUT or FAILED: terminates the queue's active jobs of the execution (`Ended.owns`),
then prunes the run's checkpoints to the newest one it may resume from (lambdas/sagemaker/cleanup.py's pruning).
"""

from __future__ import annotations

from typing import Any

from lambdas.batch.environment import BatchCleanupEnvironment
from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import Ended
from lambdas.jobs.queue_cleanup import queue_cleanup_handler, terminate_and_prune

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
    """Terminate the execution's jobs, then prune the checkpoints of its run and of the jobs terminated."""
    jobs = active_jobs(batch, queue, ended)
    return terminate_and_prune(ended, jobs, batch.terminate_job, noun="batch job", stores=stores, s3=s3)


handler = queue_cleanup_handler(BatchCleanupEnvironment.from_environ, clean_up, message="batch run cleaned up")

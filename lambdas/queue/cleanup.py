"""StopServiceJobs handler: no team's service job outlives its execution, and a run's checkpoints stop growing.

Invoked by the state machine on every way out of a queued run, and by EventBridge when an execution
ends ABORTED, TIMED_OUT or FAILED: terminates the teams' queue's service jobs that have not ended and
are the execution's (`Ended.owns`; waiting or running: Batch stops a running one's training job), then prunes
the run's checkpoints to the newest one it may resume from (lambdas/sagemaker/cleanup.py's pruning).
"""

from __future__ import annotations

from typing import Any

from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import Ended
from lambdas.jobs.queue_cleanup import queue_cleanup_handler, terminate_and_prune
from lambdas.queue.environment import QueueCleanupEnvironment

ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")


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
    """Terminate the execution's service jobs, then prune the checkpoints of its run and of those jobs."""
    jobs = active_jobs(batch, queue, ended)
    return terminate_and_prune(ended, jobs, batch.terminate_service_job, noun="service job", stores=stores, s3=s3)


handler = queue_cleanup_handler(QueueCleanupEnvironment.from_environ, clean_up, message="queued run cleaned up")

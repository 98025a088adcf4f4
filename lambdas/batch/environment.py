"""The AWS Batch handlers' environments (stacks/pipeline/batch_step.py sets them)."""

from __future__ import annotations

from lambdas.jobs.environment import JobQueueCleanupEnvironment
from lambdas.shared.env import HandlerEnvironment


class BatchMonitorEnvironment(HandlerEnvironment):
    """PollBatchJob's."""

    checkpoints_bucket: str
    artifacts_bucket: str
    """Where each node's entrypoint writes its result under the job's output prefix."""
    checkpoint_stale_minutes: int
    capacity_wait_minutes: int
    """A job still waiting for its nodes after this long is terminated and retried as a new job."""


class BatchCleanupEnvironment(JobQueueCleanupEnvironment):
    """StopBatchJobs': the Batch backend's job queue."""

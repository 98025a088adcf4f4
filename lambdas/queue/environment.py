"""The team queue handlers' environments (stacks/pipeline/queue_step.py sets them)."""

from __future__ import annotations

from lambdas.jobs.environment import JobQueueCleanupEnvironment


class QueueCleanupEnvironment(JobQueueCleanupEnvironment):
    """StopServiceJobs': the teams' queue."""

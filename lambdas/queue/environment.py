"""The team queue handlers' environments (stacks/pipeline/queue_step.py sets them)."""

from __future__ import annotations

from lambdas.jobs.environment import CleanupEnvironment


class QueueCleanupEnvironment(CleanupEnvironment):
    """StopServiceJobs'."""

    job_queue: str
    """The teams' queue, whose service jobs of an ended execution are terminated."""

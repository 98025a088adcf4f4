"""The Cleanup handler's environment (stacks/pipeline/polled_job.py's `cleanup_function` sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class CleanupEnvironment(HandlerEnvironment):
    checkpoints_bucket: str
    """Where the run's checkpoints are pruned."""

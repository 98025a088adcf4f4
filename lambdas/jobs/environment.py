"""The environments of every backend's job handlers: the monitors' and the cleanups' (stacks/pipeline sets them)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class MonitorEnvironment(HandlerEnvironment):
    """A job monitor's: where the run's checkpoints and ledgers are, and when a checkpoint is stale."""

    checkpoints_bucket: str
    """Where SageMaker uploads the run's checkpoints."""
    artifacts_bucket: str
    """Where the run's checkpoint ledger (contract/ledger.py) and its jobs' goodput ledgers (goodput.py) are."""
    checkpoint_stale_minutes: int
    """A training job whose newest checkpoint is older than this is stale."""


class CleanupEnvironment(HandlerEnvironment):
    """A job cleanup's: where the run's checkpoints are pruned, and its ledger that says which to keep."""

    checkpoints_bucket: str
    """Where the run's checkpoints are pruned."""
    artifacts_bucket: str
    """Where the run's checkpoint ledger (contract/ledger.py) is."""

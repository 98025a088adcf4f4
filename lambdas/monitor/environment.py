"""The Monitor handler's environment (stacks/pipeline/sagemaker_step.py sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class MonitorEnvironment(HandlerEnvironment):
    checkpoints_bucket: str
    """Where SageMaker uploads the run's checkpoints."""
    artifacts_bucket: str
    """Where the run's checkpoint ledger (training/ledger.py) and its jobs' goodput ledgers (goodput.py) are."""
    checkpoint_stale_minutes: int
    """A training job whose newest checkpoint is older than this is stale."""

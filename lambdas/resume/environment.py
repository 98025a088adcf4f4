"""The ledger-opening handler's environment (stacks/pipeline/continuation.py sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class CarryOverEnvironment(HandlerEnvironment):
    checkpoints_bucket: str
    """Where both runs' checkpoints are: the continued run's is copied into the new run's prefix."""
    artifacts_bucket: str
    """Where both runs' ledgers are (training/ledger.py)."""

"""The ledger-opening handler's environment (stacks/pipeline/resume.py sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class ResumeEnvironment(HandlerEnvironment):
    checkpoints_bucket: str
    """Where both runs' checkpoints are: the resumed run's is copied into the new run's prefix."""
    artifacts_bucket: str
    """Where both runs' ledgers are (contract/ledger.py)."""

"""The approval handlers' environments (stacks/constructs/approval_gate.py sets them)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class ApprovalsEnvironment(HandlerEnvironment):
    """Every approval handler's (the pending gauge needs no more)."""

    table_name: str
    """The approval requests' table."""


class DecideEnvironment(ApprovalsEnvironment):
    approvers: list[str]
    """The principals (role or user ARNs) who may list and decide requests."""
    forbid_self_approval: bool


class RequestEnvironment(ApprovalsEnvironment):
    topic_arn: str
    """Where approvers are notified."""
    decision_url: str
    approval_timeout_hours: int

"""The approval handlers' environments (stacks/constructs/approval_gate.py sets them)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class ApprovalsEnvironment(HandlerEnvironment):
    """Every approval handler's (the pending gauge needs no more)."""

    table_name: str
    """The approval requests' table."""


class TokenKeyEnvironment(ApprovalsEnvironment):
    """The handlers that seal (request) or open (decide) task tokens."""

    token_key_arn: str
    """The approval token key: only the request function encrypts with it, only the decision function decrypts."""


class DecideEnvironment(TokenKeyEnvironment):
    approvers: list[str]
    """The principals (role or user ARNs) who may list and decide requests."""
    forbid_self_approval: bool


class RequestEnvironment(TokenKeyEnvironment):
    topic_arn: str
    """Where approvers are notified."""
    decision_url: str
    approval_timeout_hours: int

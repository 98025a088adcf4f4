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
    """The platform's approvers (role or user ARNs): they decide the runs no team's approvers decide."""
    team_approvers: dict[str, list[str]]
    """Each team that names approvers: their ARNs; they alone decide the team's runs."""
    forbid_self_approval: bool


class RequestEnvironment(TokenKeyEnvironment):
    topic_arn: str
    """Where approvers are notified."""
    decision_url: str
    approval_timeout_hours: int

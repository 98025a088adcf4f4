"""The platform's encrypted SNS topics and their e-mail subscriptions."""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.settings import NotificationSettings


class PlatformTopics(Construct):
    """`runs`: approval requests and run outcomes; `alarms`: alarms and budget alerts.

    Run messages carry `kind` (approval | run) and `recipients` attributes, approval requests of a
    team's run a `team` attribute. Approvers receive every approval request; each address in
    notifications.run_emails or a team's `notification_emails` receives the runs whose `recipients`
    name it; a team's addresses also receive the team's approval requests.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        key: kms.IKey,
        settings: NotificationSettings,
        team_emails: dict[str, list[str]],
    ) -> None:
        super().__init__(scope, id_)
        self.runs = sns.Topic(self, "Runs", master_key=key, enforce_ssl=True, display_name="Training runs")
        self.alarms = sns.Topic(
            self, "Alarms", master_key=key, enforce_ssl=True, display_name="Training platform alarms"
        )
        for email, policy in run_filter_policies(settings, team_emails).items():
            subscription = self.runs.add_subscription(subscriptions.EmailSubscription(email))
            # One subscription per address (SNS knows a subscription by topic and endpoint): what the address
            # receives for each of its roles is one `$or` policy, which the CDK's filter_policy cannot express.
            cast(sns.CfnSubscription, subscription.node.default_child).filter_policy = policy
        for email in settings.alarm_emails:
            self.alarms.add_subscription(subscriptions.EmailSubscription(email))


def run_filter_policies(settings: NotificationSettings, team_emails: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each address subscribed to the runs topic, and the filter policy of what it receives."""
    teams_of: dict[str, list[str]] = {}
    for team, emails in sorted(team_emails.items()):
        for email in emails:
            teams_of.setdefault(email, []).append(team)
    addresses = dict.fromkeys([*settings.approval_emails, *settings.run_emails, *teams_of])
    policies: dict[str, dict[str, Any]] = {}
    for email in addresses:
        clauses: list[dict[str, list[str]]] = []
        if email in settings.approval_emails:
            clauses.append({"kind": ["approval"]})
        elif email in teams_of:
            clauses.append({"kind": ["approval"], "team": teams_of[email]})
        if email in settings.run_emails or email in teams_of:
            clauses.append({"kind": ["run"], "recipients": [email]})
        policies[email] = clauses[0] if len(clauses) == 1 else {"$or": clauses}
    return policies

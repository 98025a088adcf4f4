"""The platform's encrypted SNS topics and their e-mail subscriptions."""

from __future__ import annotations

from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.settings import NotificationSettings


class PlatformTopics(Construct):
    """`runs`: approval requests and run outcomes; `alarms`: alarms and budget alerts.

    Run messages carry `kind` (approval | run) and `recipients` attributes; approvers receive
    approval requests, and each address in notifications.run_emails receives only the runs
    whose `notify` list names it.
    """

    def __init__(self, scope: Construct, id_: str, *, key: kms.IKey, settings: NotificationSettings) -> None:
        super().__init__(scope, id_)
        self.runs = sns.Topic(self, "Runs", master_key=key, enforce_ssl=True, display_name="Training runs")
        self.alarms = sns.Topic(
            self, "Alarms", master_key=key, enforce_ssl=True, display_name="Training platform alarms"
        )
        for email in settings.approval_emails:
            self.runs.add_subscription(
                subscriptions.EmailSubscription(
                    email, filter_policy={"kind": sns.SubscriptionFilter.string_filter(allowlist=["approval"])}
                )
            )
        for email in settings.run_emails:
            self.runs.add_subscription(
                subscriptions.EmailSubscription(
                    email,
                    filter_policy={
                        "kind": sns.SubscriptionFilter.string_filter(allowlist=["run"]),
                        "recipients": sns.SubscriptionFilter.string_filter(allowlist=[email]),
                    },
                )
            )
        for email in settings.alarm_emails:
            self.alarms.add_subscription(subscriptions.EmailSubscription(email))

"""Data stack (stateful, retained): the platform key, the S3 buckets, the Lustre file system and the tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from contract.layout import ANY_CODE, team_code
from contract.service_requests import TEAM_TAG
from lambdas.approvals.store import PENDING_INDEX
from lambdas.validate import membership
from stacks.constructs.buckets import TrainingBuckets, deny_puts
from stacks.constructs.keys import account_key
from stacks.constructs.logs import allow_cloudwatch_logs
from stacks.constructs.lustre import LustreDataRepository
from stacks.constructs.nag import acknowledge
from stacks.constructs.network import TrainingNetwork
from stacks.settings import PlatformSettings, TeamSettings


class DataStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: PlatformSettings,
        network: TrainingNetwork,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id_, termination_protection=True, **kwargs)
        self.key = self._platform_key()
        self.buckets = TrainingBuckets(self, "Buckets", key=self.key, stage=settings.stage, settings=settings.storage)
        for team in settings.teams:
            if team.member_tag is not None:
                self._membership_by_tag(team.name, team.member_tag, network.s3_endpoint.vpc_endpoint_id)
        self._code_written_once(settings.teams)
        self.lustre = LustreDataRepository(
            self,
            "Lustre",
            vpc=network.vpc,
            subnet=network.training_subnet,
            security_group=network.lustre_sg,
            key=self.key,
            datasets=self.buckets.datasets,
            artifacts=self.buckets.artifacts,
            settings=settings.storage,
        )
        self.approvals = self._approvals_table()
        self.start_proofs = self._start_proofs_table()
        # Retrain triggers (settings `retrain`): new objects reach EventBridge, their windows a table.
        self.retrain_windows: dynamodb.Table | None = None
        if settings.retrain:
            self.buckets.enable_event_bridge(self.buckets.datasets)
            self.retrain_windows = self._retrain_windows_table()
        self.model_registry = sagemaker.CfnModelPackageGroup(
            self,
            "ModelRegistry",
            model_package_group_name=f"{settings.name_prefix}-models",
            model_package_group_description="Models trained by the distributed training platform, with lineage",
        )
        self.model_registry.apply_removal_policy(RemovalPolicy.RETAIN)

    def _membership_by_tag(self, team: str, member_tag: str, s3_endpoint: str) -> None:
        """Listing the team's membership prefix of the artifacts bucket is for the principals tagged
        `platform-team` = `member_tag` alone, whatever else their policies allow: Validate replays a starter's
        signed listing, and S3's answer is IAM's verdict on the starter's tag (lambdas/validate/membership.py).
        The allow holds only through the VPC's S3 endpoint, where Validate sends it (a fixed aws:SourceVpce also
        keeps the policy non-public, which Block Public Access requires)."""
        bucket = self.buckets.artifacts
        on_prefix = {"s3:prefix": membership.prefix(team)}
        tag = f"aws:PrincipalTag/{TEAM_TAG}"
        name = _sid(team)
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid=f"{name}MembershipOnlyByTag",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringEquals": on_prefix, "StringNotEquals": {tag: member_tag}},
            )
        )
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid=f"{name}MembershipByTag",
                principals=[iam.AnyPrincipal()],
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={
                    "StringEquals": {
                        **on_prefix,
                        tag: member_tag,
                        "aws:PrincipalAccount": self.account,
                        "aws:SourceVpce": s3_endpoint,
                    }
                },
            )
        )

    def _code_written_once(self, teams: Sequence[TeamSettings]) -> None:
        """Runs' packed code (contract/layout.py `run_code`) is written once, and a team's by its members alone.

        Every put must carry If-None-Match, so no archive is replaced (S3 refuses the put where one exists, and
        refuses the parts of a multipart upload, which cannot carry it). A team's prefix is written only by the
        principals its `members` name or its `member_tag` tags, as Validate judges membership
        (lambdas/validate/teams.py), so no one else can plant an archive under a name a member will upload.
        """
        bucket = self.buckets.artifacts
        deny_puts(bucket, "CodeIsWrittenOnce", ANY_CODE, {"Null": {"s3:if-none-match": "true"}})
        for team in teams:
            conditions: dict[str, Any] = {}
            if team.members:
                conditions["ArnNotEquals"] = {"aws:PrincipalArn": list(team.members)}
            if team.member_tag is not None:
                conditions["StringNotEquals"] = {f"aws:PrincipalTag/{TEAM_TAG}": team.member_tag}
            deny_puts(bucket, f"{_sid(team.name)}CodeByMembersOnly", f"{team_code(team.name)}*", conditions)

    def _platform_key(self) -> kms.Key:
        """The one customer-managed key of the platform's data; AWS services may use it for this account only."""
        key = account_key(
            self, "DataKey", description="Encrypts the training platform's data: S3, FSx, ECR, logs, topics, tables"
        )
        allow_cloudwatch_logs(key)
        # Alarms and budget alerts publish to topics, and EventBridge rules dead-letter to queues,
        # encrypted with this key: this account's only.
        for sid, service, source in (
            (
                "AlarmNotifications",
                "cloudwatch.amazonaws.com",
                f"arn:{self.partition}:cloudwatch:{self.region}:{self.account}:alarm:*",
            ),
            ("BudgetNotifications", "budgets.amazonaws.com", f"arn:{self.partition}:budgets::{self.account}:*"),
            (
                "EventDeadLetters",
                "events.amazonaws.com",
                f"arn:{self.partition}:events:{self.region}:{self.account}:rule/*",
            ),
        ):
            key.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=sid,
                    principals=[iam.ServicePrincipal(service)],
                    actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                    resources=["*"],
                    conditions={
                        "StringEquals": {"aws:SourceAccount": self.account},
                        "ArnLike": {"aws:SourceArn": source},
                    },
                )
            )
        return key

    def _retrain_windows_table(self) -> dynamodb.Table:
        """One item per retrain trigger: its open window of new data and the last run it started."""
        return self._table("RetrainWindows", partition_key="trigger", records="the retrain windows")

    def _start_proofs_table(self) -> dynamodb.Table:
        """One item per start proof Validate accepted (a digest of its signature), so none starts two runs."""
        return self._table(
            "StartProofs", partition_key="proof", records="the used start proofs", time_to_live_attribute="ttl"
        )

    def _approvals_table(self) -> dynamodb.Table:
        """Approval requests: the audit record of who decided what; the task tokens are encrypted here."""
        table = self._table(
            "Approvals", partition_key="request_id", records="the approval records", time_to_live_attribute="ttl"
        )
        # Pending requests, newest first; the index holds what a listing shows and never the task token.
        table.add_global_secondary_index(
            index_name=PENDING_INDEX,
            partition_key=dynamodb.Attribute(name="status", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="requested_at", type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=["gate", "execution", "run_name", "summary", "expires_at", "requested_by"],
        )
        return table

    def _table(
        self, id_: str, *, partition_key: str, records: str, time_to_live_attribute: str | None = None
    ) -> dynamodb.Table:
        """An on-demand table under the platform key, retained, with point-in-time recovery for ``records``."""
        table = dynamodb.Table(
            self,
            id_,
            partition_key=dynamodb.Attribute(name=partition_key, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=self.key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=time_to_live_attribute,
            deletion_protection=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        for pack in ("NIST.800.53.R5", "HIPAA.Security"):
            acknowledge(
                table,
                f"{pack}-DynamoDBInBackupPlan",
                f"Point-in-time recovery (35 days) protects {records}; an AWS Backup plan is the "
                "platform team's account-wide choice.",
            )
        return table


def _sid(team: str) -> str:
    """A team's name as a statement ID's start (letters and digits only)."""
    return "".join(part.capitalize() for part in team.split("-"))

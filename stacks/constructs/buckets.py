"""Versioned, KMS-encrypted, TLS-only S3 buckets for datasets, checkpoints and model artifacts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.layout import ANY_CHECKPOINT
from stacks.constructs.nag import acknowledge
from stacks.naming import bucket_name, checkpoint_writers_arn
from stacks.settings import StorageSettings

REPLICATION_REASON = (
    "Single-Region platform by design: every bucket is versioned and retained; cross-Region "
    "replication is a disaster-recovery choice the platform team adds with its own target Region."
)


class TrainingBuckets(Construct):
    """The platform's buckets and the bucket their server access logs go to."""

    def __init__(self, scope: Construct, id_: str, *, key: kms.IKey, stage: str, settings: StorageSettings) -> None:
        super().__init__(scope, id_)
        self._key, self._stage, self._settings = key, stage, settings
        self.access_logs = self._access_logs_bucket()
        self.datasets = self._bucket("Datasets")
        expire = settings.checkpoint_expiry_days
        self.checkpoints = self._bucket(
            "Checkpoints",
            *([s3.LifecycleRule(id="expire-checkpoints", expiration=Duration.days(expire))] if expire else []),
        )
        self._checkpoints_by_writers_only(self.checkpoints)
        self.artifacts = self._bucket("Artifacts")
        for b in (self.access_logs, self.datasets, self.checkpoints, self.artifacts):
            for pack in ("NIST.800.53.R5", "HIPAA.Security"):
                acknowledge(b, f"{pack}-S3BucketReplicationEnabled", REPLICATION_REASON)

    def _access_logs_bucket(self) -> s3.Bucket:
        """S3 delivers server access logs only to SSE-S3 buckets, so this one cannot use the CMK."""
        settings = self._settings
        bucket = s3.Bucket(
            self,
            "AccessLogs",
            bucket_name=bucket_name(self, self._stage, "access-logs"),
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-logs",
                    expiration=Duration.days(settings.access_log_retention_days),
                    noncurrent_version_expiration=Duration.days(settings.noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=Duration.days(settings.incomplete_upload_days),
                )
            ],
        )
        for pack in ("NIST.800.53.R5", "HIPAA.Security"):
            acknowledge(
                bucket,
                f"{pack}-S3DefaultEncryptionKMS",
                "S3 server access logging delivers only to SSE-S3 buckets; the logs hold no training data.",
            )
        return bucket

    def _checkpoints_by_writers_only(self, bucket: s3.Bucket) -> None:
        """Only the roles on the checkpoint writers' path (stacks/naming.py) write or delete runs' checkpoints.

        Whatever its identity policy grants (s3:PutObject on `*`), no other principal of the account can plant,
        replace, copy over or delete a checkpoint: an explicit Deny in the bucket policy wins. CopyObject and
        every part of a multipart upload are authorized as s3:PutObject. The data key cannot add a per-prefix
        rule: with S3 Bucket Keys the encryption context S3 gives KMS is the bucket's ARN, not the object's
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-key.html), so the key policy sees no key.
        """
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CheckpointsByTrainingRolesOnly",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"],
                resources=[bucket.arn_for_objects(ANY_CHECKPOINT)],
                conditions={"ArnNotLike": {"aws:PrincipalArn": checkpoint_writers_arn(self)}},
            )
        )

    @staticmethod
    def enable_event_bridge(bucket: s3.Bucket) -> None:
        """Send the bucket's object events to EventBridge: a property of the bucket, updated in place.

        Set on the bucket resource itself, not through CDK's notifications custom resource (a Lambda
        of its own in this stack); changing it never replaces the bucket.
        """
        cfn = bucket.node.default_child
        assert isinstance(cfn, s3.CfnBucket)
        cfn.add_property_override("NotificationConfiguration.EventBridgeConfiguration.EventBridgeEnabled", True)

    def _bucket(self, id_: str, *extra_rules: s3.LifecycleRule) -> s3.Bucket:
        """A data bucket: the platform key, TLS only, versioned, access-logged, retained."""
        settings = self._settings
        bucket = s3.Bucket(
            self,
            id_,
            bucket_name=bucket_name(self, self._stage, id_.lower()),
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self._key,
            bucket_key_enabled=True,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix=f"{id_.lower()}/",
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="noncurrent-and-incomplete",
                    noncurrent_version_expiration=Duration.days(settings.noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=Duration.days(settings.incomplete_upload_days),
                ),
                *extra_rules,
            ],
        )
        # Uploads that name an encryption must name the platform key; unnamed ones get it by default.
        for sid, header, allowed in (
            ("DenyOtherEncryption", "s3:x-amz-server-side-encryption", "aws:kms"),
            ("DenyOtherKeys", "s3:x-amz-server-side-encryption-aws-kms-key-id", self._key.key_arn),
        ):
            deny_puts(bucket, sid, "*", {"Null": {header: "false"}, "StringNotEquals": {header: allowed}})
        return bucket


def deny_puts(bucket: s3.IBucket, sid: str, keys: str, conditions: Mapping[str, Any]) -> None:
    """Refuse every principal's PutObject of `keys` (a key pattern) under `conditions`, whatever else it may do."""
    bucket.add_to_resource_policy(
        iam.PolicyStatement(
            sid=sid,
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=["s3:PutObject"],
            resources=[bucket.arn_for_objects(keys)],
            conditions=dict(conditions),
        )
    )

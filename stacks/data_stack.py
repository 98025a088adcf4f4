"""Data stack (stateful, retained): the platform key, the S3 buckets and the Lustre file system."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.constructs.buckets import TrainingBuckets
from stacks.constructs.logs import allow_cloudwatch_logs
from stacks.constructs.lustre import LustreDataRepository
from stacks.constructs.network import TrainingNetwork
from stacks.settings import PlatformSettings


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
        self.key = kms.Key(
            self,
            "DataKey",
            description="Encrypts the training platform's data: S3, FSx, ECR, logs, topics, tables",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        allow_cloudwatch_logs(self.key)
        self.buckets = TrainingBuckets(self, "Buckets", key=self.key, settings=settings.storage)
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

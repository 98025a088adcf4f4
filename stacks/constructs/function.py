"""A Python Lambda function with the platform's defaults: Powertools, encrypted logs, tracing."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import cast

from aws_cdk import Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from lambdas.shared.metrics import SERVICE
from stacks.constructs.logs import encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.naming import ec2_arn_prefix

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME = lambda_.Runtime.PYTHON_3_14
# The handlers import `lambdas.<module>` and `contract.<module>` (what they share with the image and the stacks:
# tests/test_imports.py keeps them off `training/`), so the asset is the repository root reduced to those two.
ASSET_PACKAGES = ("lambdas", "contract")
_ASSET_EXCLUDE = [
    ".*",
    "*",
    *(rule for package in ASSET_PACKAGES for rule in (f"!{package}", f"!{package}/**")),
    "**/__pycache__",
    "**/*.pyc",
]


def powertools_layer(scope: Construct) -> lambda_.ILayerVersion:
    """The public Powertools layer (with pydantic) of the version pinned in requirements.txt.

    Its ARN is read at deploy time from the public SSM parameter Powertools publishes per
    Region, so synth needs no lookup and the layer always matches what the tests ran against.
    """
    stack = Stack.of(scope)
    existing = stack.node.try_find_child("PowertoolsLayer")
    if existing is not None:
        return cast(lambda_.ILayerVersion, existing)
    version = metadata.version("aws-lambda-powertools")
    arn = ssm.StringParameter.value_for_string_parameter(
        stack, f"/aws/service/powertools/python/x86_64/{RUNTIME.name}/{version}"
    )
    return lambda_.LayerVersion.from_layer_version_arn(stack, "PowertoolsLayer", arn)


class PlatformFunction(Construct):
    """One handler of `lambdas/`, e.g. `lambdas.image_build.handler.on_event`.

    The function runs in the VPC's service subnets unless `outside_vpc_reason` says why it
    cannot; its role starts with nothing but writing its own log group.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        handler: str,
        description: str,
        log_key: kms.IKey,
        log_retention_days: int = 365,
        timeout: Duration | None = None,
        memory_mb: int = 256,
        environment: dict[str, str] | None = None,
        vpc: ec2.IVpc | None = None,
        vpc_subnets: ec2.SubnetSelection | None = None,
        security_groups: list[ec2.ISecurityGroup] | None = None,
        role_path: str | None = None,
        outside_vpc_reason: str | None = None,
        reserved_concurrency: int = 5,
        dead_letter_queue: sqs.IQueue | None = None,
        no_dead_letters_reason: str = (
            "Invoked synchronously (Step Functions, CloudFormation); the caller receives and handles "
            "every failure, and a dead-letter queue applies only to asynchronous invocations."
        ),
    ) -> None:
        super().__init__(scope, id_)
        if (vpc is None) == (outside_vpc_reason is None):
            raise ValueError(f"{id_}: give either a vpc or the reason the function must run outside one")
        self.log_group = encrypted_log_group(self, "Logs", key=log_key, retention_days=log_retention_days)
        self.role = self._role(description, role_path)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=lambda_.Architecture.X86_64,
            handler=handler,
            code=lambda_.Code.from_asset(str(REPO_ROOT), exclude=_ASSET_EXCLUDE),
            description=description,
            role=self.role,
            layers=[powertools_layer(self)],
            timeout=timeout or Duration.seconds(30),
            memory_size=memory_mb,
            environment={
                "POWERTOOLS_SERVICE_NAME": SERVICE,
                "POWERTOOLS_LOG_LEVEL": "INFO",
                **(environment or {}),
            },
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=reserved_concurrency,
            dead_letter_queue=dead_letter_queue,
            vpc=vpc,
            vpc_subnets=vpc_subnets,
            security_groups=security_groups,
        )
        if vpc is not None:
            self._grant_vpc_attachment(vpc, vpc_subnets)
        self._acknowledge(
            in_vpc=vpc is not None,
            no_dead_letters_reason=None if dead_letter_queue is not None else no_dead_letters_reason,
            outside_vpc_reason=outside_vpc_reason,
        )

    def _role(self, description: str, path: str | None) -> iam.Role:
        """A role that may write this function's log group (and, in a VPC, attach the function to it); `path`: the
        IAM path a bucket policy admits it by (stacks/naming.py)."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=description,
            path=path,
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
            )
        )
        return role

    def _grant_vpc_attachment(self, vpc: ec2.IVpc, vpc_subnets: ec2.SubnetSelection | None) -> None:
        """What Lambda needs to attach the function to the VPC (the actions of the managed
        AWSLambdaVPCAccessExecutionRole policy), each on what the Service Authorization Reference lets
        it name: interfaces are created only in the function's subnets with its security groups, and
        changed or deleted only in its VPC. The describe actions take no resource."""
        ec2_arn = ec2_arn_prefix(self)
        interfaces = f"{ec2_arn}:network-interface/*"
        selection = vpc_subnets or ec2.SubnetSelection()
        subnets = vpc.select_subnets(
            availability_zones=selection.availability_zones,
            one_per_az=selection.one_per_az,
            subnet_filters=selection.subnet_filters,
            subnet_group_name=selection.subnet_group_name,
            subnets=selection.subnets,
            subnet_type=selection.subnet_type,
        ).subnet_ids
        groups = [group.security_group_id for group in self.function.connections.security_groups]
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="DescribeTheNetwork",
                actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"],
                resources=["*"],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateInterfacesInTheFunctionSubnets",
                actions=["ec2:CreateNetworkInterface"],
                resources=[
                    interfaces,
                    *(f"{ec2_arn}:subnet/{subnet}" for subnet in subnets),
                    *(f"{ec2_arn}:security-group/{group}" for group in groups),
                ],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ManageInterfacesInTheVpc",
                actions=[
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                ],
                resources=[interfaces],
                conditions={"ArnEquals": {"ec2:Vpc": f"{ec2_arn}:vpc/{vpc.vpc_id}"}},
            )
        )
        acknowledge_wildcard(
            self.role,
            interfaces,
            "Lambda creates the function's network interfaces, whose IDs nobody knows in advance; creation "
            "is bound to the function's subnets and security groups, changes to the platform VPC by condition.",
        )

    def _acknowledge(self, *, in_vpc: bool, no_dead_letters_reason: str | None, outside_vpc_reason: str | None) -> None:
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray trace upload takes no resource scope"
            + (
                "; nor do ec2:DescribeNetworkInterfaces and ec2:DescribeSubnets, which Lambda needs to attach the "
                "function to the VPC."
                if in_vpc
                else "."
            ),
        )
        acknowledge_inline_policy(self.role)
        for pack in ("NIST.800.53.R5", "HIPAA.Security"):
            if no_dead_letters_reason is not None:
                acknowledge(self.function, f"{pack}-LambdaDLQ", no_dead_letters_reason)
            if outside_vpc_reason is not None:
                acknowledge(self.function, f"{pack}-LambdaInsideVPC", outside_vpc_reason)

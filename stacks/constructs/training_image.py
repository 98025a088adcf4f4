"""The platform's ECR repository and the training image, built by CodeBuild on deploy from `training/` and
`contract/`."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr
from constructs import Construct

from stacks.constructs.function import PlatformFunction
from stacks.constructs.logs import encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.images import BaseImage

IMAGE_PACKAGES = ("training", "contract")
"""What the image holds of the repository: the runtime and the contract it shares with the handlers."""
DOCKERFILE = "training/Dockerfile"
# The source is the repository root reduced to the image's packages.
_SOURCE_EXCLUDE = [
    ".*",
    "*",
    *(rule for package in IMAGE_PACKAGES for rule in (f"!{package}", f"!{package}/**")),
    "**/__pycache__",
    "**/*.pyc",
    "**/.pytest_cache",
    "**/.mypy_cache",
]

# The build logs in to both registries, skips the build when the content-addressed tag already
# exists (tags are immutable, so a retried deploy must not try to overwrite one), then pushes.
_BUILDSPEC = {
    "version": "0.2",
    "env": {"shell": "bash"},
    "phases": {
        "pre_build": {
            "commands": [
                "set -euo pipefail",
                'aws ecr get-login-password --region "$BASE_REGION"'
                ' | docker login --username AWS --password-stdin "$BASE_REGISTRY"',
                'aws ecr get-login-password --region "$AWS_REGION"'
                ' | docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"',
            ]
        },
        "build": {
            "commands": [
                'if aws ecr describe-images --repository-name "$REPOSITORY_NAME"'
                ' --image-ids imageTag="$IMAGE_TAG" >/dev/null 2>&1; then'
                ' echo "image $IMAGE_TAG exists; nothing to build"; else'
                f' docker build --pull --build-arg BASE_IMAGE="$BASE_IMAGE" -f {DOCKERFILE}'
                ' -t "$REPOSITORY_URI:$IMAGE_TAG" .'
                ' && docker push "$REPOSITORY_URI:$IMAGE_TAG"; fi',
            ]
        },
    },
}


class TrainingImage(Construct):
    """Immutable, scanned, KMS-encrypted repository plus the image built from the training package.

    No Docker engine is needed where `cdk deploy` runs: the package travels as an S3 asset and
    CodeBuild builds it next to ECR. The image tag is the asset's content hash, so every deploy
    of the same `training/` and `contract/` resolves to the same image, and `image_uri` pins its digest.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        source_dir: Path,
        base_image: BaseImage,
        key: kms.IKey,
        keep_images: int,
        log_retention_days: int = 365,
    ) -> None:
        super().__init__(scope, id_)
        self.repository = self._repository(key, keep_images)
        source = s3_assets.Asset(self, "Source", path=str(source_dir), exclude=_SOURCE_EXCLUDE)
        self.image_tag = source.asset_hash
        self.project = self._build_project(source, base_image, key, log_retention_days)
        provider = self._provider(key, log_retention_days)
        self.build = CustomResource(
            self,
            "Image",
            service_token=provider.service_token,
            resource_type="Custom::TrainingImage",
            properties={
                "ProjectName": self.project.project_name,
                "RepositoryName": self.repository.repository_name,
                "ImageTag": self.image_tag,
            },
        )
        self.image_digest = self.build.get_att_string("ImageDigest")
        # `<repository URI>@sha256:...`: the exact image this deploy built, for training jobs.
        self.image_uri = self.build.get_att_string("ImageUri")

    def _repository(self, key: kms.IKey, keep_images: int) -> ecr.Repository:
        return ecr.Repository(
            self,
            "Repository",
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            image_scan_on_push=True,
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=key,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="Drop untagged layers left by failed pushes",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(1),
                    rule_priority=1,
                ),
                ecr.LifecycleRule(
                    description=f"Keep the newest {keep_images} images",
                    tag_status=ecr.TagStatus.ANY,
                    max_image_count=keep_images,
                    rule_priority=2,
                ),
            ],
        )

    def _build_project(
        self, source: s3_assets.Asset, base_image: BaseImage, key: kms.IKey, log_retention_days: int
    ) -> codebuild.Project:
        """CodeBuild, privileged for docker: pulls the base image, builds, pushes to the repository."""
        build_logs = encrypted_log_group(self, "BuildLogs", key=key, retention_days=log_retention_days)
        project = codebuild.Project(
            self,
            "Build",
            description="Builds the training image from the training/ package",
            source=codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                compute_type=codebuild.ComputeType.LARGE,
                privileged=True,
            ),
            environment_variables={
                "BASE_IMAGE": codebuild.BuildEnvironmentVariable(value=base_image.uri),
                "BASE_REGISTRY": codebuild.BuildEnvironmentVariable(value=base_image.registry),
                "BASE_REGION": codebuild.BuildEnvironmentVariable(value=base_image.region),
                "REPOSITORY_URI": codebuild.BuildEnvironmentVariable(value=self.repository.repository_uri),
                "REPOSITORY_NAME": codebuild.BuildEnvironmentVariable(value=self.repository.repository_name),
            },
            build_spec=codebuild.BuildSpec.from_object(_BUILDSPEC),
            encryption_key=key,
            timeout=Duration.minutes(55),
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=build_logs)),
        )
        self.repository.grant_pull_push(project)
        self.repository.grant_read(project)
        partition = Stack.of(self).partition
        base_repository = (
            f"arn:{partition}:ecr:{base_image.region}:{base_image.account}:repository/{base_image.repository}"
        )
        project.add_to_role_policy(
            iam.PolicyStatement(
                sid="PullDeepLearningContainer",
                actions=[
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchCheckLayerAvailability",
                ],
                resources=[base_repository],
            )
        )
        return project

    def _provider(self, key: kms.IKey, log_retention_days: int) -> cr.Provider:
        """The custom resource's handlers: start the build, then report when the image is in the repository."""
        outside_vpc = (
            "Deploy-time custom-resource handler that calls only the CodeBuild and ECR APIs; it holds "
            "no training data, and the data VPC deliberately has no route or endpoint for CodeBuild."
        )
        on_event, is_complete = (
            PlatformFunction(
                self,
                id_,
                handler=f"lambdas.image_build.handler.{handler}",
                description=description,
                log_key=key,
                log_retention_days=log_retention_days,
                outside_vpc_reason=outside_vpc,
            )
            for id_, handler, description in (
                ("StartBuild", "on_event", "Starts the training-image build"),
                ("CheckBuild", "is_complete", "Reports when the training-image build has finished"),
            )
        )
        on_event.function.add_to_role_policy(
            iam.PolicyStatement(actions=["codebuild:StartBuild"], resources=[self.project.project_arn])
        )
        is_complete.function.add_to_role_policy(
            iam.PolicyStatement(actions=["codebuild:BatchGetBuilds"], resources=[self.project.project_arn])
        )
        is_complete.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecr:DescribeImages", "ecr:DescribeRepositories"], resources=[self.repository.repository_arn]
            )
        )
        provider_logs = encrypted_log_group(self, "ProviderLogs", key=key, retention_days=log_retention_days)
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=on_event.function,
            is_complete_handler=is_complete.function,
            query_interval=Duration.seconds(30),
            total_timeout=Duration.hours(1),
            log_group=provider_logs,
            disable_waiter_state_machine_logging=False,
            waiter_state_machine_log_options=cr.LogOptions(
                destination=provider_logs, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
        )
        _acknowledge_build_role(self.project)
        _acknowledge_provider(provider, handlers=(on_event.function, is_complete.function))
        return provider


def _acknowledge_build_role(project: codebuild.Project) -> None:
    """Findings on the CodeBuild project and the policy CDK generates for its role."""
    stack = Stack.of(project)
    acknowledge(
        project,
        "HIPAA.Security-CodeBuildProjectSourceRepoUrl",
        "The source is the training package as an S3 asset, not a Git repository: there are no credentials.",
    )
    role = project.role
    assert role is not None
    acknowledge_inline_policy(role)
    key_grant = "CDK's grant on the platform key for encrypted build artifacts and logs; scoped to that one key."
    asset_read = "CDK's read grant on the CDK asset bucket holding the training package source."
    reasons = {
        "AwsSolutions-IAM5[Resource::*]": "ecr:GetAuthorizationToken has no resource-level permissions.",
        "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]": key_grant,
        "AwsSolutions-IAM5[Action::kms:ReEncrypt*]": key_grant,
        "AwsSolutions-IAM5[Action::s3:GetBucket*]": asset_read,
        "AwsSolutions-IAM5[Action::s3:GetObject*]": asset_read,
        "AwsSolutions-IAM5[Action::s3:List*]": asset_read,
    }

    def arn(service: str) -> str:
        return f"arn:{stack.partition}:{service}:{stack.region}:{stack.account}"

    name = project.project_name
    acknowledge_wildcard(
        role,
        f"{arn('codebuild')}:report-group/{name}-*",
        "CodeBuild's default report-group permission, limited to this project's report groups.",
    )
    acknowledge_wildcard(
        role,
        f"{arn('logs')}:log-group:/aws/codebuild/{name}:*",
        "CodeBuild's default log-group permission, limited to this project's own log group.",
    )
    for finding, reason in reasons.items():
        acknowledge(role, finding, reason)


WAITER_LOGGING = (
    "The provider framework's statement for its waiter's Step Functions logging: logs:CreateLogDelivery, "
    "logs:GetLogDelivery, logs:UpdateLogDelivery, logs:DeleteLogDelivery, logs:ListLogDeliveries, "
    "logs:PutResourcePolicy, logs:DescribeResourcePolicies and logs:DescribeLogGroups take no resource scope; "
    "logs:CreateLogStream and logs:PutLogEvents do, and the framework grants them on every log group, a "
    "statement of its own that the platform does not narrow."
)
"""The acknowledgement of the waiter's one statement on "*", naming each of its actions."""


def _acknowledge_provider(provider: cr.Provider, *, handlers: tuple[lambda_.IFunction, ...]) -> None:
    """Findings on the CDK custom-resource provider framework's own functions, roles and waiter."""
    framework = ("framework-onEvent", "framework-isComplete", "framework-onTimeout")
    outside_vpc = (
        "CDK provider-framework function: it must reach CloudFormation's pre-signed S3 response URL, "
        "which the isolated, account-scoped VPC cannot."
    )
    for name in framework:
        function = provider.node.find_child(name)
        for handler in handlers:
            acknowledge_wildcard(
                function,
                f"{handler.function_arn}:*",
                "The framework invokes any version of the platform's own handler function.",
            )
        acknowledge(
            function,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
            "CDK provider-framework function: the managed policy only writes its own logs.",
        )
        acknowledge_inline_policy(function)
        for pack in ("NIST.800.53.R5", "HIPAA.Security"):
            acknowledge(function, f"{pack}-LambdaInsideVPC", outside_vpc)
            acknowledge(
                function,
                f"{pack}-LambdaDLQ",
                "CDK provider-framework function invoked synchronously by CloudFormation and its waiter.",
            )
            acknowledge(
                function,
                f"{pack}-LambdaConcurrency",
                "CDK provider-framework function: runs once per image build during a deploy.",
            )
    waiter = provider.node.find_child("waiter-state-machine")
    for name in ("framework-isComplete", "framework-onTimeout"):
        function = cast(lambda_.IFunction, provider.node.find_child(name))
        acknowledge_wildcard(
            waiter,
            f"{function.function_arn}:*",
            "The waiter invokes any version of the provider framework's own functions.",
        )
    acknowledge_inline_policy(waiter)
    acknowledge(waiter, "AwsSolutions-IAM5[Resource::*]", WAITER_LOGGING)
    acknowledge(waiter, "AwsSolutions-SF2", "CDK provider-framework waiter; the provider exposes no X-Ray setting.")

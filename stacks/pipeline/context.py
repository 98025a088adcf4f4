"""What every part of the pipeline is built from: settings, the platform key, buckets, topics, network.

Parts create their handlers through `PipelineContext.function`, at the stack's scope: a
function's logical ID is its name alone (Validate, Monitor, ...), whichever part owns it, so
moving states between parts never replaces a deployed function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from contract.execution_state import REQUEST, Path
from stacks.constructs.function import PlatformFunction
from stacks.constructs.notifications import PlatformTopics
from stacks.constructs.queue import TeamQueue
from stacks.constructs.tasks import NOTIFY_TRANSIENT, SDK, retry
from stacks.constructs.training_image import TrainingImage
from stacks.data_stack import DataStack
from stacks.naming import bucket_name
from stacks.network_stack import NetworkStack
from stacks.settings import PipelineSettings, PlatformSettings

NOTIFY_TIMEOUT = Duration.seconds(30)


def string(path: Path) -> str:
    return sfn.JsonPath.string_at(str(path))


def obj(path: Path) -> Any:
    return sfn.JsonPath.object_at(str(path))


@dataclass
class PipelineContext:
    stack: Stack
    settings: PlatformSettings
    network: NetworkStack
    data: DataStack
    image: TrainingImage
    revision: str
    topics: PlatformTopics
    datasets: s3.IBucket
    checkpoints: s3.IBucket
    artifacts: s3.IBucket
    teams: TeamQueue | None = None
    """The teams' Batch queue and quota shares; None when settings name no teams."""
    functions: dict[str, PlatformFunction] = field(default_factory=dict)
    """Every handler made by `function`, by name, in the order they were made."""
    goodput_writers: list[PlatformFunction] = field(default_factory=list)
    """The progress handlers that write jobs' goodput ledgers (and log them), for the dashboard."""
    shared: dict[str, Construct] = field(default_factory=dict)
    """Constructs several steps use, made once by the first that asks (by construct ID)."""

    @classmethod
    def create(
        cls,
        stack: Stack,
        *,
        settings: PlatformSettings,
        network: NetworkStack,
        data: DataStack,
        image: TrainingImage,
        revision: str,
    ) -> PipelineContext:
        datasets, checkpoints, artifacts = (
            s3.Bucket.from_bucket_attributes(
                stack,
                f"{purpose.title()}Bucket",
                bucket_name=bucket_name(stack, settings.stage, purpose),
                encryption_key=data.key,
            )
            for purpose in ("datasets", "checkpoints", "artifacts")
        )
        topics = PlatformTopics(
            stack,
            "Topics",
            key=data.key,
            settings=settings.notifications,
            team_emails={team.name: team.notification_emails for team in settings.teams},
        )
        teams = (
            TeamQueue(stack, "Teams", capacity=settings.service_environment.capacity, teams=settings.teams)
            if settings.teams
            else None
        )
        return cls(stack, settings, network, data, image, revision, topics, datasets, checkpoints, artifacts, teams)

    @property
    def pipeline(self) -> PipelineSettings:
        return self.settings.pipeline

    @property
    def key(self) -> kms.IKey:
        return self.data.key

    def arn(self, service: str, resource: str) -> str:
        """An ARN in this stack's partition, Region and account."""
        stack = self.stack
        return f"arn:{stack.partition}:{service}:{stack.region}:{stack.account}:{resource}"

    def function(
        self,
        name: str,
        handler: str,
        description: str,
        environment: dict[str, str],
        *,
        timeout: Duration | None = None,
        dead_letter_queue: sqs.IQueue | None = None,
    ) -> PlatformFunction:
        """A handler in the services subnets, logging under the platform key."""
        network = self.network.network
        function = PlatformFunction(
            self.stack,
            name,
            handler=handler,
            description=description,
            log_key=self.key,
            environment=environment,
            timeout=timeout,
            dead_letter_queue=dead_letter_queue,
            vpc=network.vpc,
            vpc_subnets=network.services_subnets,
            security_groups=[network.services_sg],
        )
        self.functions[name] = function
        return function

    def run_fields(self) -> dict[str, Any]:
        """What every run notification names: the run and its execution."""
        return {"run_name": string(REQUEST.run_name), "execution": sfn.JsonPath.execution_id}

    def notify(self, scope: Construct, id_: str, *, subject: str, fields: dict[str, Any]) -> tasks.SnsPublish:
        """A run notification; subscribers filter on its kind ("run") and on the run's `recipients`.

        A publish that fails for a moment (throttling, the topic key's KMS) is retried; beyond that the
        state fails, into its Catch.
        """
        notice = tasks.SnsPublish(
            scope,
            id_,
            topic=self.topics.runs,
            subject=subject,
            message=sfn.TaskInput.from_object({**self.run_fields(), **fields}),
            message_attributes={
                "kind": tasks.MessageAttribute(value="run"),
                "recipients": tasks.MessageAttribute(
                    # SNS takes a String.Array as the JSON text of the array.
                    value=sfn.JsonPath.json_to_string(sfn.JsonPath.list_at(str(REQUEST.recipients))),
                    data_type=tasks.MessageAttributeDataType.STRING_ARRAY,
                ),
            },
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(NOTIFY_TIMEOUT),
        )
        retry(notice, NOTIFY_TRANSIENT, SDK)
        return notice

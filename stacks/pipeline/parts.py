"""What the pipeline's parts are built from: handlers in the services subnets, the run buckets, run notifications.

Each is immutable and made once by the pipeline stack; a part takes the ones it uses and exposes what it makes.
Handlers are made at the stack's scope (`Handlers.function`): a function's logical ID is its name alone
(Validate, Monitor, ...), whichever part owns it, so moving states between parts never replaces a deployed
function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aws_cdk import Duration, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from contract.execution_state import REQUEST, RUN, Path
from stacks.constructs.function import PlatformFunction
from stacks.constructs.network import TrainingNetwork
from stacks.constructs.tasks import NOTIFY_TRANSIENT, SDK, retry
from stacks.naming import bucket_name
from stacks.settings import PipelineSettings

NOTIFY_TIMEOUT = Duration.seconds(30)


def string(path: Path) -> str:
    return sfn.JsonPath.string_at(str(path))


def obj(path: Path) -> Any:
    return sfn.JsonPath.object_at(str(path))


def stack_arn(scope: Construct, service: str, resource: str) -> str:
    """An ARN in the partition, Region and account of `scope`'s stack."""
    stack = Stack.of(scope)
    return f"arn:{stack.partition}:{service}:{stack.region}:{stack.account}:{resource}"


@dataclass(frozen=True)
class Buckets:
    """The data stack's datasets, checkpoints and artifacts buckets, and the platform key that encrypts them."""

    datasets: s3.IBucket
    checkpoints: s3.IBucket
    artifacts: s3.IBucket
    key: kms.IKey

    @classmethod
    def imported(cls, stack: Stack, *, stage: str, key: kms.IKey) -> Buckets:
        datasets, checkpoints, artifacts = (
            s3.Bucket.from_bucket_attributes(
                stack,
                f"{purpose.title()}Bucket",
                bucket_name=bucket_name(stack, stage, purpose),
                encryption_key=key,
            )
            for purpose in ("datasets", "checkpoints", "artifacts")
        )
        return cls(datasets, checkpoints, artifacts, key)


@dataclass(frozen=True)
class Handlers:
    """Makes the pipeline's handlers: at `stack`'s scope, in the services subnets, logging under the platform key."""

    stack: Stack
    key: kms.IKey
    network: TrainingNetwork

    def function(
        self,
        name: str,
        handler: str,
        description: str,
        environment: dict[str, str],
        *,
        timeout: Duration | None = None,
        dead_letter_queue: sqs.IQueue | None = None,
        role_path: str | None = None,
    ) -> PlatformFunction:
        network = self.network
        return PlatformFunction(
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
            role_path=role_path,
        )


def _run_fields() -> dict[str, Any]:
    """What every run notification names: the run and its first execution (however many it was handed over to)."""
    return {"run_name": string(REQUEST.run_name), "execution": string(RUN.execution)}


@dataclass(frozen=True)
class Notifier:
    """Run notifications on the runs topic."""

    topic: sns.ITopic

    def notify(self, scope: Construct, id_: str, *, subject: str, fields: dict[str, Any]) -> tasks.SnsPublish:
        """A run notification; subscribers filter on its kind ("run") and on the run's `recipients`.

        A publish that fails for a moment (throttling, the topic key's KMS) is retried; beyond that the
        state fails, into its Catch.
        """
        notice = tasks.SnsPublish(
            scope,
            id_,
            topic=self.topic,
            subject=subject,
            message=sfn.TaskInput.from_object({**_run_fields(), **fields}),
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


class HandOverLoops(Protocol):
    """What a polling loop hands its run over by (stacks/pipeline/handover.py `HandOver`)."""

    def way_out(
        self, scope: Construct, names: Callable[[str], str], wait: sfn.Wait, stop: sfn.IChainable
    ) -> sfn.IChainable: ...

    def cleans_up(self, cleanup: PlatformFunction) -> None:
        """`cleanup` stops the jobs of ended executions: those a run was handed over to too."""


@dataclass(frozen=True)
class StepParts:
    """What every training step builds its loop from (stacks/pipeline/polled_job.py)."""

    handlers: Handlers
    notifier: Notifier
    buckets: Buckets
    pipeline: PipelineSettings
    handover: HandOverLoops | None = None
    """Where a loop's execution hands its run over once it has made its polls (stacks/pipeline/handover.py)."""

"""Retraining on new data: objects created under a registered prefix start one run per quiet period.

An EventBridge rule on the datasets bucket's "Object Created" events (registered prefixes only)
invokes `RetrainRecord`, which notes the object in its trigger's window (lambdas/retrain/window.py).
Every five minutes `RetrainSweep` starts the run of each window that has been quiet for its
`quiet_minutes`, under a name derived from the trigger and the window, so a duplicate event or a
retried sweep cannot start two. The run carries the sweep's own requester proof: Validate records
the sweep's role as `requested_by`, and `pipeline.forbid_self_approval` holds for these runs too.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.retrain.environment import RecordEnvironment, SweepEnvironment
from stacks.constructs.function import PlatformFunction
from stacks.pipeline.parts import Handlers
from stacks.settings import PlatformSettings, SettingsError

SWEEP_MINUTES = 5


class RetrainTriggers(Construct):
    """The rule, the recording and starting functions, and their dead-letter queue, for settings `retrain`."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        handlers: Handlers,
        settings: PlatformSettings,
        datasets: s3.IBucket,
        table: dynamodb.ITable,
        state_machine: sfn.IStateMachine,
        execution_key: kms.IKey,
        backends: list[str],
    ) -> None:
        super().__init__(scope, id_)
        _check_triggers(settings, backends)
        triggers = [asdict(t.as_trigger()) for t in settings.retrain]
        self._handlers, self._datasets = handlers, datasets
        self.record = self._record(table, triggers)
        self.sweep = self._sweep(table, state_machine, triggers)
        self._grant(table, state_machine, execution_key)
        self._rules(triggers)

    @property
    def functions(self) -> list[PlatformFunction]:
        """Alarmed on and on the dashboard like the pipeline's other handlers."""
        return [self.record, self.sweep]

    def _record(self, table: dynamodb.ITable, triggers: list[dict[str, Any]]) -> PlatformFunction:
        """RetrainRecord and the dead-letter queue of the events it failed to record."""
        # EventBridge invokes RetrainRecord asynchronously: events that fail every retry are kept here.
        self.dead_letter_queue = sqs.Queue(
            Stack.of(self),
            "RetrainDeadLetters",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=self._handlers.key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        return self._handlers.function(
            "RetrainRecord",
            "lambdas.retrain.handler.record_handler",
            "Notes new objects under the datasets bucket's registered retrain prefixes",
            RecordEnvironment(
                table_name=table.table_name,
                datasets_bucket=self._datasets.bucket_name,
                retrain_triggers=[{"name": t["name"], "prefix": t["prefix"]} for t in triggers],
            ).variables(),
            dead_letter_queue=self.dead_letter_queue,
        )

    def _sweep(
        self, table: dynamodb.ITable, state_machine: sfn.IStateMachine, triggers: list[dict[str, Any]]
    ) -> PlatformFunction:
        handlers = self._handlers
        network = handlers.network
        return PlatformFunction(
            handlers.stack,
            "RetrainSweep",
            handler="lambdas.retrain.handler.sweep_handler",
            description="Starts one pipeline run per retrain trigger whose new data has been quiet long enough",
            log_key=handlers.key,
            environment=SweepEnvironment(
                table_name=table.table_name,
                datasets_bucket=self._datasets.bucket_name,
                state_machine_arn=state_machine.state_machine_arn,
                retrain_triggers=triggers,
            ).variables(),
            reserved_concurrency=1,
            no_dead_letters_reason=(
                "A schedule: the next sweep, five minutes later, finds the same open window and starts its run "
                "under the same name; there is no event worth keeping, and its errors alarm like every handler's."
            ),
            vpc=network.vpc,
            vpc_subnets=network.services_subnets,
            security_groups=[network.services_sg],
        )

    def _rules(self, triggers: list[dict[str, Any]]) -> None:
        """New objects under a registered prefix invoke RetrainRecord; a schedule invokes RetrainSweep."""
        prefixes = sorted({t["prefix"] for t in triggers})
        stack = Stack.of(self)
        events.Rule(
            stack,
            "RetrainNewData",
            description="New objects under the datasets bucket's registered retrain prefixes",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [self._datasets.bucket_name]},
                    "object": {"key": [{"prefix": p} for p in prefixes]},
                },
            ),
            targets=[
                targets.LambdaFunction(
                    self.record.function,
                    dead_letter_queue=self.dead_letter_queue,
                    retry_attempts=8,
                    max_event_age=Duration.hours(24),
                )
            ],
        )
        events.Rule(
            stack,
            "RetrainSweepSchedule",
            description="Starts the runs of retrain windows that have been quiet long enough",
            schedule=events.Schedule.rate(Duration.minutes(SWEEP_MINUTES)),
            targets=[targets.LambdaFunction(self.sweep.function, retry_attempts=0)],
        )

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {"RetrainRecord": self.dead_letter_queue}

    def _grant(self, table: dynamodb.ITable, state_machine: sfn.IStateMachine, execution_key: kms.IKey) -> None:
        # The windows table and the dead-letter queue are encrypted with the platform key.
        self._handlers.key.grant(self.record.function, "kms:Decrypt", "kms:GenerateDataKey")
        self._handlers.key.grant(self.sweep.function, "kms:Decrypt", "kms:GenerateDataKey")
        self.record.function.add_to_role_policy(
            iam.PolicyStatement(sid="RecordNewData", actions=["dynamodb:UpdateItem"], resources=[table.table_arn])
        )
        self.sweep.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="CloseQuietWindows",
                actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
                resources=[table.table_arn],
            )
        )
        self.sweep.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="StartRetrainRuns", actions=["states:StartExecution"], resources=[state_machine.state_machine_arn]
            )
        )
        # StartExecution encrypts the new execution's input with the state machine's key, through Step Functions.
        self.sweep.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="EncryptRunInput",
                actions=["kms:GenerateDataKey"],
                resources=[execution_key.key_arn],
                conditions={
                    "ArnEquals": {"kms:EncryptionContext:aws:states:stateMachineArn": state_machine.state_machine_arn},
                    "StringEquals": {"kms:ViaService": f"states.{Stack.of(self).region}.amazonaws.com"},
                },
            )
        )


def _check_triggers(settings: PlatformSettings, backends: list[str]) -> None:
    """Settings checked each template without knowing the training backends; the pipeline knows them."""
    for trigger in settings.retrain:
        problems = settings.retrain_problems(trigger, backends=tuple(backends))
        if problems:
            raise SettingsError(f"Invalid platform settings:\n  - retrain trigger {trigger.name!r}: {problems}")

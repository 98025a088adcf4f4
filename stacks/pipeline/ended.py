"""Every way a run ends reaches its recipients: those its states cannot tell are told on the execution's end.

The state machine tells a run's `notify` list how it ended on each way out it takes itself. An execution that is
stopped, times out, or is failed by Step Functions itself (States.Runtime: the history limit among them), or that
ends in one of the few Fail states no notification precedes, cannot: an EventBridge rule on its end invokes
TellEndedRun (lambdas/ended/handler.py), which tells them the cause in words.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.ended.handler import TellEnvironment
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.pipeline.parts import Handlers
from stacks.pipeline.polled_job import watch_ended_executions


class EndedRuns(Construct):
    """TellEndedRun, its dead-letter queue, and (`bind`) the rule on the state machine's executions that ended."""

    def __init__(self, scope: Construct, id_: str, *, handlers: Handlers, topic: sns.ITopic, key: kms.IKey) -> None:
        super().__init__(scope, id_)
        self.dead_letters = sqs.Queue(
            handlers.stack,
            "TellEndedRunDeadLetters",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.function = handlers.function(
            "TellEndedRun",
            "lambdas.ended.handler.handler",
            "Tells a run's recipients how it ended when none of its states could (stopped, timed out, failed by "
            "Step Functions)",
            TellEnvironment(runs_topic=topic.topic_arn).variables(),
            dead_letter_queue=self.dead_letters,
        )
        self.function.function.add_to_role_policy(
            iam.PolicyStatement(sid="TellRuns", actions=["sns:Publish"], resources=[topic.topic_arn])
        )
        # The topic and the dead-letter queue are encrypted with the platform key.
        key.grant(self.function.function, "kms:GenerateDataKey", "kms:Decrypt")

    def bind(self, state_machine: sfn.StateMachine, execution_key: ExecutionDataKey) -> events.Rule:
        """Read the ended executions' status and history (the run's request, its recipients); the rule."""
        execution_key.allow_reading_executions(
            self,
            "ReadEndedExecutions",
            self.function.role,
            state_machine,
            why="Executions of this state machine that ended.",
        )
        return watch_ended_executions(
            self,
            "RunEnded",
            description="Tells a run's recipients how its execution ended when none of its states could",
            state_machine=state_machine,
            cleanup=self.function,
            dead_letters=self.dead_letters,
        )

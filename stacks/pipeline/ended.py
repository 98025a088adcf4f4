"""Every way a run ends reaches its recipients: those its states cannot tell are told on the execution's end.

The state machine tells a run's `notify` list how it ended on each way out it takes itself. An execution that is
stopped, times out, or is failed by Step Functions itself (States.Runtime: the history limit among them), or that
ends in one of the few Fail states no notification precedes, cannot: an EventBridge rule on its end invokes
TellEndedRun (lambdas/ended/handler.py), which tells them the cause in words.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.ended.handler import TellEnvironment
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.constructs.nag import acknowledge_inline_policy, acknowledge_wildcard
from stacks.pipeline.parts import Handlers


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
        executions = Stack.of(self).format_arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine.state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        policy = iam.Policy(
            self,
            "ReadEndedExecutions",
            roles=[self.function.role],
            statements=[
                iam.PolicyStatement(
                    actions=["states:DescribeExecution", "states:GetExecutionHistory"], resources=[executions]
                )
            ],
        )
        acknowledge_inline_policy(policy)
        execution_key.allow_reading(self.function.role)
        acknowledge_wildcard(self, executions, "Executions of this state machine that ended.")
        return events.Rule(
            Stack.of(self),
            "RunEnded",
            description="Tells a run's recipients how its execution ended when none of its states could",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [state_machine.state_machine_arn],
                    "status": ["ABORTED", "TIMED_OUT", "FAILED"],
                },
            ),
            targets=[
                targets.LambdaFunction(
                    self.function.function,
                    dead_letter_queue=self.dead_letters,
                    retry_attempts=8,
                    max_event_age=Duration.hours(6),
                )
            ],
        )

"""A reusable human approval gate for Step Functions: task token in DynamoDB, decision over IAM."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from lambdas.approvals.environment import ApprovalsEnvironment, DecideEnvironment, RequestEnvironment
from lambdas.approvals.store import PENDING_INDEX
from lambdas.execution_state import REQUEST, Path
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy


class ApprovalGate(Construct):
    """Request and decide functions shared by every gate of a state machine.

    `gate()` adds one gate to a definition: a `.waitForTaskToken` task that stores the request
    (the token stays in the table) and notifies approvers, then a Choice on the decision.
    Decisions arrive through a Lambda function URL with AWS_IAM auth that only the configured
    approver principals may invoke; the handler checks the allow-list again, records who
    decided and why, and accepts one decision per request.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        table: dynamodb.ITable,
        topic: sns.ITopic,
        key: kms.IKey,
        approvers: list[str],
        forbid_self_approval: bool,
        timeout: Duration,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, id_)
        self.timeout = timeout
        placement: dict[str, Any] = {"vpc": vpc, "vpc_subnets": subnets, "security_groups": [security_group]}
        self.decide = PlatformFunction(
            self,
            "Decide",
            handler="lambdas.approvals.handler.decide",
            description="Records an approver's decision and resumes the waiting execution",
            log_key=key,
            environment=DecideEnvironment(
                table_name=table.table_name, approvers=sorted(approvers), forbid_self_approval=forbid_self_approval
            ).variables(),
            **placement,
        )
        self.url = self.decide.function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        for principal in sorted(approvers):
            self.decide.function.grant_invoke_url(iam.ArnPrincipal(principal))
        self.request = PlatformFunction(
            self,
            "Request",
            handler="lambdas.approvals.handler.request",
            description="Stores an approval request with its task token and notifies approvers",
            log_key=key,
            environment=RequestEnvironment(
                table_name=table.table_name,
                topic_arn=topic.topic_arn,
                decision_url=self.url.url,
                approval_timeout_hours=int(timeout.to_hours()),
            ).variables(),
            **placement,
        )
        self.pending = self._pending_gauge(table_name=table.table_name, key=key, placement=placement)
        # Exactly the calls of lambdas/approvals: the request stores (conditional put) and publishes;
        # the decision lists, reads and updates; the gauge lists. The platform key encrypts the table
        # and the topic.
        pending_index = f"{table.table_arn}/index/{PENDING_INDEX}"
        grants = {
            self.request: {"StoreRequests": (["dynamodb:PutItem"], table.table_arn)},
            self.decide: {
                "ListPendingRequests": (["dynamodb:Query"], pending_index),
                "DecideRequests": (["dynamodb:GetItem", "dynamodb:UpdateItem"], table.table_arn),
            },
            self.pending: {"ListPendingRequests": (["dynamodb:Query"], pending_index)},
        }
        for function, statements in grants.items():
            for sid, (actions, resource) in statements.items():
                function.function.add_to_role_policy(
                    iam.PolicyStatement(sid=sid, actions=actions, resources=[resource])
                )
        self.request.function.add_to_role_policy(
            iam.PolicyStatement(sid="NotifyApprovers", actions=["sns:Publish"], resources=[topic.topic_arn])
        )
        for function in (self.request, self.decide):
            key.grant(function.function, "kms:Decrypt", "kms:GenerateDataKey")
        key.grant(self.pending.function, "kms:Decrypt")

    def _pending_gauge(self, *, table_name: str, key: kms.IKey, placement: dict[str, Any]) -> PlatformFunction:
        """Every five minutes: requests waiting for a decision and the oldest one's age, as metrics."""
        gauge = PlatformFunction(
            self,
            "Pending",
            handler="lambdas.approvals.handler.report_pending",
            description="Counts approval requests waiting for a decision, for the dashboard",
            log_key=key,
            environment=ApprovalsEnvironment(table_name=table_name).variables(),
            reserved_concurrency=1,
            no_dead_letters_reason=(
                "A scheduled gauge: a failed run loses one five-minute datapoint, which the next run replaces; "
                "there is no event worth keeping, and its errors alarm like every handler's."
            ),
            **placement,
        )
        events.Rule(
            self,
            "EveryFiveMinutes",
            description="Approvals pending, for the platform dashboard",
            schedule=events.Schedule.rate(Duration.minutes(5)),
            targets=[targets.LambdaFunction(gauge.function, retry_attempts=0)],
        )
        return gauge

    def grant_decisions(self, state_machine: sfn.StateMachine) -> None:
        """Let the decision function resume the executions of `state_machine` that wait on a gate.

        A policy of its own, not the role's default policy: the function waits for its default
        policy at deploy, and the state machine (through the request function's DECISION_URL)
        waits for the function, so granting there would be a circular dependency.
        """
        policy = iam.Policy(
            self,
            "ResumeExecutions",
            # The reference lets SendTaskSuccess name no resource (on the state machine's ARN it grants
            # nothing): the task token alone says which execution resumes.
            statements=[iam.PolicyStatement(actions=["states:SendTaskSuccess"], resources=["*"])],
            roles=[self.decide.role],
        )
        acknowledge_inline_policy(policy)
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            "states:SendTaskSuccess takes no resource scope; the task token says which execution resumes.",
        )

    def gate(
        self,
        scope: Construct,
        id_: str,
        *,
        name: str,
        summary: dict[str, Any],
        result: Path,
        on_timeout: sfn.IChainable,
    ) -> tuple[sfn.TaskStateBase, sfn.Condition]:
        """The waiting task and the condition "approved" on its result; a timeout goes to `on_timeout`."""
        task = tasks.LambdaInvoke(
            scope,
            id_,
            lambda_function=self.request.function,
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            payload=sfn.TaskInput.from_object(
                {
                    "gate": name,
                    "token": sfn.JsonPath.task_token,
                    "execution": sfn.JsonPath.execution_id,
                    "run_name": sfn.JsonPath.string_at(str(REQUEST.run_name)),
                    "requested_by": sfn.JsonPath.string_at(str(REQUEST.requested_by)),
                    "summary": summary,
                }
            ),
            task_timeout=sfn.Timeout.duration(self.timeout),
            result_path=str(result),
            comment=f"Waits for an approver's {name} decision; no decision in time counts as a rejection",
        )
        task.add_catch(
            on_timeout,
            errors=["States.Timeout", "States.HeartbeatTimeout"],
            result_path=f"{result}_error",
        )
        approved = sfn.Condition.string_equals(str(result.decision), "approved")
        return task, approved

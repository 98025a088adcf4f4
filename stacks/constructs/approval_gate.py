"""A reusable human approval gate for Step Functions: sealed task token in DynamoDB, decision over IAM, verified."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy
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

from contract.execution_state import REQUEST, Path
from lambdas.approvals.environment import ApprovalsEnvironment, DecideEnvironment, RequestEnvironment
from lambdas.approvals.store import PENDING_INDEX
from stacks.constructs.function import PlatformFunction
from stacks.constructs.keys import ADMINISTRATION, grants_for_aws_services_only
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy
from stacks.constructs.tasks import GATE_TRANSIENT, SHORT, invoke, retry


class ApprovalGate(Construct):
    """Request and decide functions shared by every gate of a state machine.

    `gate()` adds one gate to a definition: a `.waitForTaskToken` task that stores the request
    (the token sealed under `token_key`) and notifies approvers, then a check that the decision
    it resumed with is the one the decision function recorded. Decisions arrive through a Lambda
    function URL with AWS_IAM auth that only the configured approver principals (the platform's and
    the teams') may invoke; the handler checks who decides the request's team, records who decided
    and why, and accepts one decision per request.
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
        team_approvers: dict[str, list[str]],
        forbid_self_approval: bool,
        timeout: Duration,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, id_)
        self.timeout = timeout
        placement: dict[str, Any] = {"vpc": vpc, "vpc_subnets": subnets, "security_groups": [security_group]}
        self.token_key = self._token_key()
        self.decide = PlatformFunction(
            self,
            "Decide",
            handler="lambdas.approvals.handler.decide",
            description="Records an approver's decision and resumes the waiting execution",
            log_key=key,
            environment=DecideEnvironment(
                table_name=table.table_name,
                token_key_arn=self.token_key.key_arn,
                approvers=sorted(approvers),
                team_approvers={team: sorted(arns) for team, arns in sorted(team_approvers.items()) if arns},
                forbid_self_approval=forbid_self_approval,
            ).variables(),
            **placement,
        )
        self.url = self._decision_url(approvers=approvers, team_approvers=team_approvers)
        self.verify = PlatformFunction(
            self,
            "Verify",
            handler="lambdas.approvals.handler.verify",
            description="Fails a run whose gate resumed with a decision the decision function did not record",
            log_key=key,
            environment=ApprovalsEnvironment(table_name=table.table_name).variables(),
            **placement,
        )
        self.request = PlatformFunction(
            self,
            "Request",
            handler="lambdas.approvals.handler.request",
            description="Stores an approval request with its task token and notifies approvers",
            log_key=key,
            environment=RequestEnvironment(
                table_name=table.table_name,
                token_key_arn=self.token_key.key_arn,
                topic_arn=topic.topic_arn,
                decision_url=self.url.url,
                approval_timeout_hours=int(timeout.to_hours()),
            ).variables(),
            **placement,
        )
        self.pending = self._pending_gauge(table_name=table.table_name, key=key, placement=placement)
        self._grant_functions(table=table, topic=topic, key=key)
        self._seal_tokens(request=self.request.role, decide=self.decide.role)

    def _token_key(self) -> kms.Key:
        """The key that seals task tokens; its key policy lets the account administer it, not use it."""
        return kms.Key(
            self,
            "TokenKey",
            description="Seals approval gates' task tokens: the request function encrypts, only the decision "
            "function decrypts",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
            policy=iam.PolicyDocument(
                statements=[
                    iam.PolicyStatement(
                        sid="AdministerWithoutUse",
                        principals=[iam.AccountRootPrincipal()],
                        actions=ADMINISTRATION,
                        resources=["*"],
                    ),
                    grants_for_aws_services_only(),
                ]
            ),
        )

    def _decision_url(self, *, approvers: list[str], team_approvers: dict[str, list[str]]) -> lambda_.FunctionUrl:
        """The decision function's URL, with AWS_IAM auth: only the platform's and the teams' approvers invoke it."""
        url = self.decide.function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        for principal in sorted({*approvers, *(arn for arns in team_approvers.values() for arn in arns)}):
            self.decide.function.grant_invoke_url(iam.ArnPrincipal(principal))
        return url

    def _grant_functions(self, *, table: dynamodb.ITable, topic: sns.ITopic, key: kms.IKey) -> None:
        """Exactly the calls of lambdas/approvals: the request stores (conditional put), supersedes the gate's
        earlier requests of its execution (lists, updates) and publishes; the decision lists (the requests' teams
        read from the table: the index does not hold them), reads and updates; the gauge lists. The platform key
        encrypts the table and the topic."""
        pending_index = f"{table.table_arn}/index/{PENDING_INDEX}"
        grants = {
            self.request: {
                "StoreRequests": (["dynamodb:PutItem", "dynamodb:UpdateItem"], table.table_arn),
                "ListPendingRequests": (["dynamodb:Query"], pending_index),
            },
            self.decide: {
                "ListPendingRequests": (["dynamodb:Query"], pending_index),
                "DecideRequests": (
                    ["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:UpdateItem"],
                    table.table_arn,
                ),
            },
            self.pending: {"ListPendingRequests": (["dynamodb:Query"], pending_index)},
            self.verify: {"ReadDecisions": (["dynamodb:GetItem"], table.table_arn)},
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
        for function in (self.pending, self.verify):
            key.grant(function.function, "kms:Decrypt")

    def _seal_tokens(self, *, request: iam.IRole, decide: iam.IRole) -> None:
        """The token key's use, in its key policy alone: no IAM policy in the account can grant it to anyone else.

        Only the request function encrypts and only the decision function decrypts, and only under
        an encryption context naming an execution of this account's state machines.
        """
        execution = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:execution:*"
        executions = {"StringLike": {"kms:EncryptionContext:execution": execution}}
        for sid, role, action in (("SealTokens", request, "kms:Encrypt"), ("OpenTokens", decide, "kms:Decrypt")):
            self.token_key.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=sid,
                    principals=[iam.ArnPrincipal(role.role_arn)],
                    actions=[action],
                    resources=["*"],
                    conditions=executions,
                )
            )

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
    ) -> tuple[sfn.Chain, sfn.Condition]:
        """The waiting task, then the check that its decision was recorded; and the condition "approved".

        A timeout goes to `on_timeout`. A decision the decision function did not record (someone
        resumed the gate with its token directly) fails the run.
        """
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
                    "team": sfn.JsonPath.string_at(str(REQUEST.team)),
                    "summary": summary,
                }
            ),
            task_timeout=sfn.Timeout.duration(self.timeout),
            result_path=str(result),
            comment=f"Waits for an approver's {name} decision; no decision in time counts as a rejection",
            retry_on_service_exceptions=False,
        )
        # A request that failed for a moment is made again; it supersedes the gate's earlier request (store.py).
        retry(task, GATE_TRANSIENT, SHORT)
        task.add_catch(
            on_timeout,
            errors=["States.Timeout", "States.HeartbeatTimeout"],
            result_path=f"{result}_error",
        )
        verify = invoke(
            scope,
            f"{id_}: decision recorded?",
            self.verify,
            {"gate": name, "execution": sfn.JsonPath.execution_id, "decision": sfn.JsonPath.object_at(str(result))},
            sfn.JsonPath.DISCARD,
        )
        verify.add_catch(
            sfn.Fail(
                scope,
                f"{id_}: decision not recorded",
                error="DecisionNotRecorded",
                cause=(
                    f"The {name} gate resumed with a decision the decision function did not record (its task "
                    "token was used outside the decision URL); the run stops and the UnrecordedDecisions alarm "
                    "is raised."
                ),
            ),
            errors=["DecisionNotRecordedError"],
        )
        approved = sfn.Condition.string_equals(str(result.decision), "approved")
        return sfn.Chain.start(task).next(verify), approved

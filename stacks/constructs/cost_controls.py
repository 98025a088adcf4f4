"""A monthly AWS Budget on the platform's cost tag, the stop it applies when spent, and the pipeline's alarms."""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.service_requests import TEAM_TAG
from lambdas.backends import BACKENDS
from lambdas.validate.budget import probe_job
from stacks.constructs.nag import acknowledge_inline_policy

# The cost-allocation tag every platform resource and training job carries (activate it once in Billing).
COST_TAG = "platform$distributed-training"
# A training job no run can be named. The budget's deny policy denies describing it: Validate asks SageMaker
# about it, through the VPC endpoint the pipeline already uses, and an explicit deny in the answer means the
# budget stop is in force (lambdas/validate/budget.py); each team's stop has a probe of its own.
BUDGET_PROBE_JOB = probe_job()


class PlatformBudget(Construct):
    """Alerts at 80% of actual and 100% of forecast monthly spend on `cost_tag` (key$value), by e-mail and on the
    alarm topic."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        limit_usd: float,
        topic: sns.ITopic,
        emails: list[str],
        cost_tag: str = COST_TAG,
    ) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="BudgetsPublish",
                principals=[iam.ServicePrincipal("budgets.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {"aws:SourceArn": f"arn:{stack.partition}:budgets::{stack.account}:*"},
                },
            )
        )
        subscribers = [
            budgets.CfnBudget.SubscriberProperty(subscription_type="SNS", address=topic.topic_arn),
            *(budgets.CfnBudget.SubscriberProperty(subscription_type="EMAIL", address=e) for e in emails),
        ]

        def alert(kind: str, percent: float) -> budgets.CfnBudget.NotificationWithSubscribersProperty:
            return budgets.CfnBudget.NotificationWithSubscribersProperty(
                notification=budgets.CfnBudget.NotificationProperty(
                    notification_type=kind,
                    comparison_operator="GREATER_THAN",
                    threshold=percent,
                    threshold_type="PERCENTAGE",
                ),
                subscribers=subscribers,
            )

        self.budget = budgets.CfnBudget(
            self,
            "Monthly",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=limit_usd, unit="USD"),
                cost_filters={"TagKeyValue": [f"user:{cost_tag}"]},
            ),
            notifications_with_subscribers=[alert("ACTUAL", 80), alert("FORECASTED", 100)],
        )


class BudgetDeny(Construct):
    """At 100% of a budget's actual monthly spend, AWS Budgets attaches a deny policy of `statements` to `roles`.

    Nothing in the platform detaches the policy: whoever owns the budget reverses the action
    (`aws budgets execute-budget-action --execution-type REVERSE_BUDGET_ACTION`) or raises the budget.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        budget: budgets.CfnBudget,
        statements: list[iam.PolicyStatement],
        description: str,
        roles: list[iam.IRole],
        topic: sns.ITopic,
        emails: list[str],
    ) -> None:
        super().__init__(scope, id_)
        self.policy = iam.ManagedPolicy(self, "Deny", description=description, statements=statements)
        action_role = self._action_role(roles)
        self.action = budgets.CfnBudgetsAction(
            self,
            "Action",
            budget_name=budget.ref,
            action_type="APPLY_IAM_POLICY",
            approval_model="AUTOMATIC",
            notification_type="ACTUAL",
            action_threshold=budgets.CfnBudgetsAction.ActionThresholdProperty(type="PERCENTAGE", value=100),
            definition=budgets.CfnBudgetsAction.DefinitionProperty(
                iam_action_definition=budgets.CfnBudgetsAction.IamActionDefinitionProperty(
                    policy_arn=self.policy.managed_policy_arn, roles=[role.role_name for role in roles]
                )
            ),
            execution_role_arn=action_role.role_arn,
            subscribers=[
                budgets.CfnBudgetsAction.SubscriberProperty(type="SNS", address=topic.topic_arn),
                *(budgets.CfnBudgetsAction.SubscriberProperty(type="EMAIL", address=e) for e in emails),
            ],
        )

    def _action_role(self, roles: list[iam.IRole]) -> iam.Role:
        """The role AWS Budgets uses to attach the deny policy to these roles, and only that policy."""
        role = iam.Role(
            self,
            "ActionRole",
            assumed_by=iam.ServicePrincipal(
                "budgets.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}}
            ),
            description="AWS Budgets attaches and detaches the platform's budget stop policy with this role.",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["iam:AttachRolePolicy", "iam:DetachRolePolicy"],
                resources=[target.role_arn for target in roles],
                conditions={"ArnEquals": {"iam:PolicyARN": self.policy.managed_policy_arn}},
            )
        )
        acknowledge_inline_policy(role)
        return role


class BudgetStop(BudgetDeny):
    """At 100% of actual monthly spend, AWS Budgets attaches a deny policy to the roles that create training jobs.

    New jobs (first attempts and capacity retries alike) are then refused by IAM; jobs already
    training keep running. The deny is also what Validate reads, so a new run is refused at once
    with the reason and who to ask.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        budget: budgets.CfnBudget,
        creators: list[iam.IRole],
        validator: iam.IRole,
        topic: sns.ITopic,
        emails: list[str],
        backends: list[str],
    ) -> None:
        probe_arn = Stack.of(scope).format_arn(
            service="sagemaker", resource="training-job", resource_name=BUDGET_PROBE_JOB
        )
        super().__init__(
            scope,
            id_,
            budget=budget,
            statements=self._deny_statements(probe_arn, backends),
            description="Applied by AWS Budgets when the platform's monthly budget is spent: no new training jobs.",
            roles=[*creators, validator],
            topic=topic,
            emails=emails,
        )
        self.probe_arn = probe_arn
        # Validate may ask about the probe job; only the budget stop makes that an explicit deny.
        validator.add_to_principal_policy(
            iam.PolicyStatement(
                sid="BudgetProbe", actions=["sagemaker:DescribeTrainingJob"], resources=[self.probe_arn]
            )
        )

    @staticmethod
    def _deny_statements(probe_arn: str, backends: list[str]) -> list[iam.PolicyStatement]:
        """No new training or tuning jobs of the deployed `backends`, and the probe Validate reads."""
        return [
            iam.PolicyStatement(
                sid="NoNewTrainingJobs",
                effect=iam.Effect.DENY,
                # What starts each backend's jobs (lambdas/backends/).
                actions=[action for name in backends for action in BACKENDS[name].denies],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="NoNewTuningJobs",
                effect=iam.Effect.DENY,
                actions=["sagemaker:CreateHyperParameterTuningJob"],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="BudgetStopInForce",
                effect=iam.Effect.DENY,
                actions=["sagemaker:DescribeTrainingJob"],
                resources=[probe_arn],
            ),
        ]


class TeamBudget(Construct):
    """A team's monthly budget on its cost tag; spent, it denies the team's new jobs on every backend, and only the
    team's, and Validate refuses the team's runs in words.

    What starts each backend's jobs (SageMaker's CreateTrainingJob and CreateHyperParameterTuningJob, Batch's
    SubmitJob and SubmitServiceJob: lambdas/backends/) is denied when the request tags it with the team
    (`aws:RequestTag/platform-team`, which every job of a team's run carries as its cost tag); SubmitServiceJob
    also on the team's quota share, which the Service Authorization Reference lets it name. The stop also denies
    describing the team's probe job, which Validate reads (lambdas/validate/budget.py).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        team: str,
        limit_usd: float,
        share_arn: str,
        submitters: list[iam.IRole],
        validator: iam.IRole,
        topic: sns.ITopic,
        emails: list[str],
        backends: list[str],
    ) -> None:
        super().__init__(scope, id_)
        self.budget = PlatformBudget(
            self, "Budget", limit_usd=limit_usd, topic=topic, emails=emails, cost_tag=f"{TEAM_TAG}${team}"
        ).budget
        probe_arn = Stack.of(self).format_arn(
            service="sagemaker", resource="training-job", resource_name=probe_job(team)
        )
        starts = [action for name in backends for action in BACKENDS[name].denies]
        self.stop = BudgetDeny(
            self,
            "Stop",
            budget=self.budget,
            statements=[
                iam.PolicyStatement(
                    sid="NoNewJobsOfTheTeam",
                    effect=iam.Effect.DENY,
                    actions=[*starts, "sagemaker:CreateHyperParameterTuningJob"],
                    resources=["*"],
                    conditions={"StringEquals": {f"aws:RequestTag/{TEAM_TAG}": team}},
                ),
                iam.PolicyStatement(
                    sid="NoNewServiceJobsOfTheTeam",
                    effect=iam.Effect.DENY,
                    actions=["batch:SubmitServiceJob"],
                    resources=[share_arn],
                ),
                iam.PolicyStatement(
                    sid="TeamBudgetStopInForce",
                    effect=iam.Effect.DENY,
                    actions=["sagemaker:DescribeTrainingJob"],
                    resources=[probe_arn],
                ),
            ],
            description=f"Applied by AWS Budgets when team {team}'s monthly budget is spent: no new jobs of the team.",
            roles=[*submitters, validator],
            topic=topic,
            emails=emails,
        )
        # Validate may ask about the team's probe job; only the team's stop makes that an explicit deny.
        validator.add_to_principal_policy(
            iam.PolicyStatement(
                sid=f"TeamBudgetProbe{''.join(part.capitalize() for part in team.split('-'))}",
                actions=["sagemaker:DescribeTrainingJob"],
                resources=[probe_arn],
            )
        )


class PipelineAlarms(Construct):
    """Alarms on handler errors, on executions that fail, are aborted, time out or are throttled, and on `metrics`.

    A failed execution is often a run's own outcome (rejected input, failed job, quality gate) and
    its requester hears of it; the alarm tells the platform team that a run ended that way.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        state_machine: sfn.IStateMachine,
        functions: dict[str, lambda_.IFunction],
        dead_letters: dict[str, sqs.IQueue],
        topic: sns.ITopic,
        metrics: dict[str, tuple[cloudwatch.IMetric, str]] | None = None,
    ) -> None:
        super().__init__(scope, id_)
        action = actions.SnsAction(topic)
        period = Duration.minutes(5)
        # id -> (metric, description): any datapoint at or above 1 in five minutes raises the alarm.
        watched: dict[str, tuple[cloudwatch.IMetric, str]] = {
            name: (metric, f"Training pipeline: {name}")
            for name, metric in {
                "ExecutionsFailed": state_machine.metric_failed(period=period),
                "ExecutionsAborted": state_machine.metric_aborted(period=period),
                "ExecutionsTimedOut": state_machine.metric_timed_out(period=period),
                "ExecutionsThrottled": state_machine.metric_throttled(period=period),
            }.items()
        }
        for name, function in functions.items():
            watched[f"{name}Errors"] = (
                function.metric_errors(period=period),
                f"The {name} handler failed (rejected requests are answers, not errors)",
            )
        for name, queue in dead_letters.items():
            watched[f"{name}DeadLetters"] = (
                queue.metric_approximate_number_of_messages_visible(period=period),
                f"{name}: events that failed every retry are waiting in its dead-letter queue",
            )
        watched.update(metrics or {})
        self.alarms = [
            cloudwatch.Alarm(
                self,
                alarm_id,
                metric=metric,
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=description,
            )
            for alarm_id, (metric, description) in watched.items()
        ]
        for alarm in self.alarms:
            alarm.add_alarm_action(action)

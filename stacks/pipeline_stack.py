"""Pipeline stack: the state machine, its handlers, approval gates, notifications, budget and its stop, alarms,
a dashboard.

An ML engineer starts an execution with a small JSON input (docs/ml-engineer/start.md);
the state machine validates it, estimates its cost, asks for approval when it is expensive,
runs the training step to its end, evaluates the model, registers it with its lineage and asks
for promotion. Each part is a construct in `stacks/pipeline/`; this stack composes them. New data
under a prefix registered in settings `retrain` starts runs as well (stacks/pipeline/retrain.py).
"""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import CLEANUP, FAILURE
from lambdas.backends import deployed_backends
from lambdas.backends.sagemaker import SAGEMAKER
from lambdas.shared.metrics import Metric
from stacks import outputs
from stacks.constructs.cost_controls import BudgetStop, PipelineAlarms, PlatformBudget, TeamBudget
from stacks.constructs.dashboard import PlatformDashboard, platform_metric
from stacks.constructs.execution_key import ExecutionDataKey
from stacks.constructs.logs import encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.network_stack import NetworkStack
from stacks.outputs import SAGEMAKER_TRAINING_LOG_GROUP
from stacks.pipeline.approvals import Approvals
from stacks.pipeline.context import PipelineContext, obj, string
from stacks.pipeline.intake import Intake
from stacks.pipeline.outcome import Evaluation, Promotion, Registration
from stacks.pipeline.resume import ResumeStep
from stacks.pipeline.retrain import RetrainTriggers
from stacks.pipeline.sagemaker_step import SageMakerTraining
from stacks.pipeline.training_step import TrainingStep, backend_steps, by_backend
from stacks.pipeline.tuning_step import SageMakerTuning, with_tuning
from stacks.settings import PlatformSettings


class PipelineStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: PlatformSettings,
        network: NetworkStack,
        data: DataStack,
        image: ImageStack,
        revision: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        self.revision = revision
        context = PipelineContext.create(
            self, settings=settings, network=network, data=data, image=image.training_image, revision=revision
        )
        self.context = context

        intake = Intake(self, "Intake", context=context)
        approvals = Approvals(self, "Approvals", context=context)
        steps = backend_steps(self, context=context)
        # Tuning jobs are SageMaker's: the tuning step reuses the SageMaker step's job and cleanup.
        sagemaker = cast(SageMakerTraining, steps[SAGEMAKER.name])
        training = with_tuning(
            self,
            by_backend(self, *steps.values()),
            SageMakerTuning(self, "TuningStep", context=context, training=sagemaker),
        )
        evaluation = Evaluation(self, "Evaluation", context=context)
        registration = Registration(self, "Registration", context=context)
        promotion = Promotion(self, "Promotion", context=context, approvals=approvals, packages=registration.packages)

        resume = ResumeStep(self, "Resume", context=context)
        intake.estimated.next(approvals.before_launch(then=resume.start))
        resume.then(training.start)
        training.failed.next(self._training_failed(context))
        training.succeeded.next(evaluation.start)
        evaluation.then(registration.start)
        registration.start.next(promotion.start)

        self.approval = approvals.gate
        self.execution_key = ExecutionDataKey(self, "ExecutionData", readers=settings.execution_data_readers)
        self.state_machine = self._state_machine(context, intake.start)
        self._grant_state_machine(context, training, registration.packages)
        intake.read_ended_runs(self.state_machine, self.execution_key)
        dead_letters = dict(training.dead_letters)
        if data.retrain_windows is not None:
            retrain = RetrainTriggers(
                self,
                "Retrain",
                context=context,
                table=data.retrain_windows,
                state_machine=self.state_machine,
                execution_key=self.execution_key.key,
                backends=training.backends,
            )
            dead_letters.update(retrain.dead_letters)
        self._cost_controls(settings, context, validator=intake.validate.role)
        dashboard = self._monitoring(settings, context, dead_letters)
        self._outputs(dashboard)

    def _outputs(self, dashboard: PlatformDashboard) -> None:
        """What a person or a tool finds a deployed stage by; the keys are stacks/outputs.py's."""
        region = self.region
        values = {
            outputs.STATE_MACHINE_ARN: self.state_machine.state_machine_arn,
            outputs.DECISION_URL: self.approval.url.url,
            outputs.DATASETS_BUCKET: self.context.datasets.bucket_name,
            outputs.ARTIFACTS_BUCKET: self.context.artifacts.bucket_name,
            outputs.DASHBOARD_URL: f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
            f"#dashboards:name={dashboard.dashboard.dashboard_name}",
            outputs.TRAINING_LOG_GROUP: SAGEMAKER_TRAINING_LOG_GROUP,
        }
        for key, description in outputs.OUTPUTS.items():
            # The template's output key is the pinned name; the construct ID only has to be unique.
            CfnOutput(self, f"Output{key}", value=values[key], description=description).override_logical_id(key)

    def _grant_state_machine(self, context: PipelineContext, training: TrainingStep, packages: str) -> None:
        self.execution_key.allow(self.state_machine.role, self.approval.decide.role)
        self.execution_key.bind_log_delivery()
        training.bind(self.state_machine)
        # Publishing to the runs topic, which the platform key encrypts.
        context.key.grant(self.state_machine, "kms:GenerateDataKey", "kms:Decrypt")
        self.approval.grant_decisions(self.state_machine)
        self._acknowledge_state_machine_grants(context, packages)

    def _cost_controls(self, settings: PlatformSettings, context: PipelineContext, *, validator: iam.IRole) -> None:
        """The monthly budget, and its stop on the roles that start training jobs; each team's budget and its stop."""
        budget = PlatformBudget(
            self,
            "Budget",
            limit_usd=settings.pipeline.monthly_budget_usd,
            topic=context.topics.alarms,
            emails=settings.notifications.budget_emails,
        )
        BudgetStop(
            self,
            "BudgetStop",
            budget=budget.budget,
            creators=[self.state_machine.role],
            validator=validator,
            topic=context.topics.alarms,
            emails=settings.notifications.budget_emails,
            backends=deployed_backends(teams=context.teams is not None),
        )
        if context.teams is None:
            return
        for team in settings.teams:
            TeamBudget(
                self,
                f"TeamBudget-{team.name}",
                team=team.name,
                limit_usd=team.monthly_budget_usd,
                share_arn=context.teams.share_arn(team.name),
                submitters=[self.state_machine.role],
                topic=context.topics.alarms,
                emails=team.notification_emails,
            )

    def _monitoring(
        self, settings: PlatformSettings, context: PipelineContext, dead_letters: dict[str, sqs.IQueue]
    ) -> PlatformDashboard:
        """Alarms and a dashboard over the state machine and every handler."""
        functions: dict[str, lambda_.IFunction] = {
            **{name: fn.function for name, fn in context.functions.items()},
            "ApprovalRequest": self.approval.request.function,
            "ApprovalDecide": self.approval.decide.function,
            "ApprovalPending": self.approval.pending.function,
            "ApprovalVerify": self.approval.verify.function,
        }
        PipelineAlarms(
            self,
            "Alarms",
            state_machine=self.state_machine,
            functions=functions,
            dead_letters=dead_letters,
            topic=context.topics.alarms,
            metrics={
                "UnrecordedDecisions": (
                    platform_metric(Metric.UNRECORDED_DECISIONS),
                    "An approval gate resumed with a decision the decision function did not record: someone "
                    "used a gate's task token outside the decision URL (the run was stopped)",
                ),
                "CheckpointsNotAsRecorded": (
                    platform_metric(Metric.CHECKPOINTS_NOT_AS_RECORDED),
                    "A checkpoint the platform recorded was changed in S3 afterwards: code other than the run's "
                    "wrote into its prefix (its jobs will not load it; see the Monitor's log for which one)",
                ),
            },
        )
        return PlatformDashboard(
            self,
            "Dashboard",
            name=settings.name_prefix,
            state_machine=self.state_machine,
            functions=functions,
            goodput_logs=[writer.log_group for writer in context.goodput_writers],
            team_budgets={team.name: team.monthly_budget_usd for team in settings.teams},
        )

    def _training_failed(self, context: PipelineContext) -> sfn.IChainable:
        """The run's recipients hear why training failed; the execution fails with that error."""
        notify = context.notify(
            self,
            "Notify training failed",
            subject="Training run failed",
            fields={"error": string(FAILURE.error), "reason": string(FAILURE.cause), "cleanup": obj(CLEANUP)},
        )
        failed = sfn.Fail(self, "Training failed", error_path=str(FAILURE.error), cause_path=str(FAILURE.cause))
        notify.add_catch(failed, errors=["States.ALL"], result_path="$.notify_error")
        return notify.next(failed)

    def _state_machine(self, context: PipelineContext, definition: sfn.IChainable) -> sfn.StateMachine:
        pipeline = context.pipeline
        log_group = encrypted_log_group(self, "StateMachineLogs", key=context.key, retention_days=365)
        # Two approval waits, then every training attempt at twice the runtime limit (spot's max wait).
        hours = (
            2 * pipeline.approval_timeout_hours + (pipeline.capacity_retries + 1) * 2 * pipeline.max_runtime_hours + 1
        )
        return sfn.StateMachine(
            self,
            "TrainingPipeline",
            # Named: the console user who starts a run finds it by this name.
            state_machine_name=context.settings.name_prefix,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            comment="Validate -> estimate -> approve -> train (create + poll) -> evaluate -> register -> promote",
            timeout=Duration.hours(min(hours, 365 * 24)),
            tracing_enabled=True,
            encryption_configuration=sfn.CustomerManagedEncryptionConfiguration(
                self.execution_key.key, Duration.minutes(5)
            ),
            # Execution data stays out of the logs: inputs and task tokens are not log material.
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        )

    def _acknowledge_state_machine_grants(self, context: PipelineContext, packages: str) -> None:
        role = self.state_machine.role
        acknowledge_inline_policy(role)
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "Step Functions log delivery and X-Ray (logs:CreateLogDelivery..., xray:PutTraceSegments...) "
            "take no resource scope; nor do batch:ListJobs and batch:DescribeJobs (finding a submitted AWS Batch "
            "job by name, and reading its execution tag before adopting it)" + ".",
        )
        invoked = [*context.functions.values(), self.approval.request, self.approval.verify]
        for resource, reason in {
            context.arn("sagemaker", "training-job/*"): (
                "Job names are per run and attempt; CreateTrainingJob is further limited by condition to the "
                "platform's subnet, security group and output key."
            ),
            packages: "Approving or rejecting versions in the platform's one model package group.",
            **{
                f"{fn.function.function_arn}:*": "Step Functions invokes any version of the platform's own handler."
                for fn in invoked
            },
        }.items():
            acknowledge_wildcard(role, resource, reason)

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
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
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
from stacks.constructs.function import PlatformFunction
from stacks.constructs.logs import encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.constructs.notifications import PlatformTopics
from stacks.constructs.queue import TeamQueue
from stacks.data_stack import DataStack
from stacks.image_stack import ImageStack
from stacks.network_stack import NetworkStack
from stacks.outputs import SAGEMAKER_TRAINING_LOG_GROUP
from stacks.pipeline.adoption import AdoptionCheck
from stacks.pipeline.approvals import Approvals
from stacks.pipeline.create_training_job import DistributedTrainingJob
from stacks.pipeline.ended import EndedRuns
from stacks.pipeline.handover import HandOver
from stacks.pipeline.intake import Intake
from stacks.pipeline.outcome import Evaluation, Promotion, Registration
from stacks.pipeline.parts import Buckets, Handlers, Notifier, StepParts, obj, stack_arn, string
from stacks.pipeline.resume import ResumeStep
from stacks.pipeline.retrain import RetrainTriggers
from stacks.pipeline.sagemaker_step import SageMakerTraining
from stacks.pipeline.training_step import TrainingResources, TrainingStep, backend_steps, by_backend
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
        key = data.key
        self.buckets = buckets = Buckets.imported(self, stage=settings.stage, key=key)
        self.topics = PlatformTopics(
            self,
            "Topics",
            key=key,
            settings=settings.notifications,
            team_emails={team.name: team.notification_emails for team in settings.teams},
        )
        self.teams = self._team_queue(settings)
        backends = deployed_backends(teams=self.teams is not None)
        handlers = Handlers(self, key, network.network)
        self.notifier = notifier = Notifier(self.topics.runs)
        intake = Intake(
            self,
            "Intake",
            handlers=handlers,
            settings=settings,
            buckets=buckets,
            lustre=data.lustre,
            start_proofs=data.start_proofs,
            backends=backends,
        )
        approvals = Approvals(
            self,
            "Approvals",
            settings=settings,
            table=data.approvals,
            notifier=notifier,
            key=key,
            network=network.network,
        )
        handover = HandOver(self, "HandOver", handlers=handlers, state_machine_name=settings.name_prefix)
        parts = StepParts(handlers, notifier, buckets, settings.pipeline, handover)
        training = self._training_step(settings, parts, backends, network=network, data=data, image=image)
        evaluation = Evaluation(self, "Evaluation", handlers=handlers, notifier=notifier)
        registration = Registration(
            self,
            "Registration",
            handlers=handlers,
            buckets=buckets,
            registry=data.model_registry,
            image_uri=image.training_image.image_uri,
            revision=revision,
        )
        promotion = Promotion(self, "Promotion", notifier=notifier, approvals=approvals, registration=registration)
        resume = ResumeStep(self, "Resume", handlers=handlers, buckets=buckets)
        intake.estimated.next(approvals.before_launch(then=resume.start))
        resume.then(training.start)
        training.failed.next(self._training_failed())
        training.succeeded.next(evaluation.start)
        evaluation.then(registration.start)
        registration.start.next(promotion.start)

        self.approval = approvals.gate
        self.execution_key = ExecutionDataKey(self, "ExecutionData", readers=settings.execution_data_readers)
        self.state_machine = self._state_machine(settings, key, handover.start(intake.start))
        # What the state machine invokes, besides the approval gate's handlers.
        invoked = [*intake.functions, *training.functions, *evaluation.functions, *registration.functions]
        invoked += [*resume.functions, *handover.functions]
        self._grant_state_machine(key, training, registration.packages, invoked)
        ended = self._execution_readers(intake, handover, handlers, key)
        retrain = self._retrain(settings, handlers, data, backends=training.backends)
        self._cost_controls(settings, backends, validator=intake.validate.role)
        self._outputs(self._monitoring(settings, invoked, training, ended, retrain))

    def _execution_readers(self, intake: Intake, handover: HandOver, handlers: Handlers, key: kms.IKey) -> EndedRuns:
        """What reads the state machine's executions: Validate (a run to resume), TakeOver (a hand-over's proof)
        and the ended-run rule (how a run ended)."""
        intake.read_ended_runs(self.state_machine, self.execution_key)
        handover.bind(self.state_machine, self.execution_key)
        ended = EndedRuns(self, "EndedRuns", handlers=handlers, topic=self.topics.runs, key=key)
        ended.bind(self.state_machine, self.execution_key)
        return ended

    def _team_queue(self, settings: PlatformSettings) -> TeamQueue | None:
        """The teams' Batch queue and quota shares; None when settings name no teams."""
        if not settings.teams:
            return None
        return TeamQueue(
            self,
            "Teams",
            capacity=settings.service_environment.capacity,
            teams=settings.teams,
            max_wait_minutes=settings.service_environment.max_queue_wait_minutes,
        )

    def _training_step(
        self,
        settings: PlatformSettings,
        parts: StepParts,
        backends: list[str],
        *,
        network: NetworkStack,
        data: DataStack,
        image: ImageStack,
    ) -> TrainingStep:
        """One step per deployed backend, behind a Choice on the request's backend, and the tuning step beside them."""
        # SageMaker's role and CreateTrainingJob: its step, the queue's and the tuning step's.
        job = DistributedTrainingJob(
            self,
            "Training",
            pipeline=settings.pipeline,
            network=network.network,
            image=image.training_image,
            buckets=parts.buckets,
        )
        resources = TrainingResources(
            settings=settings,
            job=job,
            network=network,
            image=image.training_image,
            file_system=data.lustre.file_system,
            teams=self.teams,
            adoption=AdoptionCheck(self, parts.handlers, job),
        )
        steps = backend_steps(self, backends, parts, resources)
        # Tuning jobs are SageMaker's: the tuning step reuses the SageMaker step's job and cleanup.
        sagemaker = cast(SageMakerTraining, steps[SAGEMAKER.name])
        return with_tuning(
            self,
            by_backend(self, *steps.values()),
            SageMakerTuning(self, "TuningStep", parts=parts, training=sagemaker),
        )

    def _retrain(
        self, settings: PlatformSettings, handlers: Handlers, data: DataStack, *, backends: list[str]
    ) -> RetrainTriggers | None:
        """Settings `retrain`'s triggers, when the data stack has their windows table."""
        if data.retrain_windows is None:
            return None
        return RetrainTriggers(
            self,
            "Retrain",
            handlers=handlers,
            settings=settings,
            datasets=self.buckets.datasets,
            table=data.retrain_windows,
            state_machine=self.state_machine,
            execution_key=self.execution_key.key,
            backends=backends,
        )

    def _outputs(self, dashboard: PlatformDashboard) -> None:
        """What a person or a tool finds a deployed stage by; the keys are stacks/outputs.py's."""
        region = self.region
        values = {
            outputs.STATE_MACHINE_ARN: self.state_machine.state_machine_arn,
            outputs.DECISION_URL: self.approval.url.url,
            outputs.DATASETS_BUCKET: self.buckets.datasets.bucket_name,
            outputs.ARTIFACTS_BUCKET: self.buckets.artifacts.bucket_name,
            outputs.DASHBOARD_URL: f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
            f"#dashboards:name={dashboard.dashboard.dashboard_name}",
            outputs.TRAINING_LOG_GROUP: SAGEMAKER_TRAINING_LOG_GROUP,
        }
        for key, description in outputs.OUTPUTS.items():
            # The template's output key is the pinned name; the construct ID only has to be unique.
            CfnOutput(self, f"Output{key}", value=values[key], description=description).override_logical_id(key)

    def _grant_state_machine(
        self, key: kms.IKey, training: TrainingStep, packages: str, invoked: list[PlatformFunction]
    ) -> None:
        self.execution_key.allow(self.state_machine.role, self.approval.decide.role)
        self.execution_key.bind_log_delivery()
        training.bind(self.state_machine)
        # Publishing to the runs topic, which the platform key encrypts.
        key.grant(self.state_machine, "kms:GenerateDataKey", "kms:Decrypt")
        self.approval.grant_decisions(self.state_machine)
        self._acknowledge_state_machine_grants(packages, invoked)

    def _cost_controls(self, settings: PlatformSettings, backends: list[str], *, validator: iam.IRole) -> None:
        """The monthly budget, and its stop on the roles that start training jobs; each team's budget and its stop."""
        alarms = self.topics.alarms
        budget = PlatformBudget(
            self,
            "Budget",
            limit_usd=settings.pipeline.monthly_budget_usd,
            topic=alarms,
            emails=settings.notifications.budget_emails,
        )
        BudgetStop(
            self,
            outputs.BUDGET_STOP,
            budget=budget.budget,
            creators=[self.state_machine.role],
            validator=validator,
            topic=alarms,
            emails=settings.notifications.budget_emails,
            backends=backends,
        )
        if self.teams is None:
            return
        for team in settings.teams:
            TeamBudget(
                self,
                f"{outputs.TEAM_BUDGET}-{team.name}",
                team=team.name,
                limit_usd=team.monthly_budget_usd,
                share_arn=self.teams.share_arn(team.name),
                submitters=[self.state_machine.role],
                validator=validator,
                topic=alarms,
                emails=team.notification_emails,
                backends=backends,
            )

    def _monitoring(
        self,
        settings: PlatformSettings,
        invoked: list[PlatformFunction],
        training: TrainingStep,
        ended: EndedRuns,
        retrain: RetrainTriggers | None,
    ) -> PlatformDashboard:
        """Alarms and a dashboard over the state machine and every handler."""
        functions = [*invoked, ended.function, *(retrain.functions if retrain else [])]
        dead_letters = {
            **training.dead_letters,
            "TellEndedRun": ended.dead_letters,
            **(retrain.dead_letters if retrain else {}),
        }
        watched: dict[str, lambda_.IFunction] = {
            **{fn.node.id: fn.function for fn in functions},
            "ApprovalRequest": self.approval.request.function,
            "ApprovalDecide": self.approval.decide.function,
            "ApprovalPending": self.approval.pending.function,
            "ApprovalVerify": self.approval.verify.function,
        }
        PipelineAlarms(
            self,
            "Alarms",
            state_machine=self.state_machine,
            functions=watched,
            dead_letters=dead_letters,
            topic=self.topics.alarms,
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
            functions=watched,
            goodput_logs=[writer.log_group for writer in training.goodput_writers],
            team_budgets={team.name: team.monthly_budget_usd for team in settings.teams},
        )

    def _training_failed(self) -> sfn.IChainable:
        """The run's recipients hear why training failed; the execution fails with that error."""
        notify = self.notifier.notify(
            self,
            "Notify training failed",
            subject="Training run failed",
            fields={"error": string(FAILURE.error), "reason": string(FAILURE.cause), "cleanup": obj(CLEANUP)},
        )
        failed = sfn.Fail(self, "Training failed", error_path=str(FAILURE.error), cause_path=str(FAILURE.cause))
        notify.add_catch(failed, errors=["States.ALL"], result_path="$.notify_error")
        return notify.next(failed)

    def _state_machine(self, settings: PlatformSettings, key: kms.IKey, definition: sfn.IChainable) -> sfn.StateMachine:
        pipeline = settings.pipeline
        log_group = encrypted_log_group(self, "StateMachineLogs", key=key, retention_days=365)
        # Two approval waits, then every training attempt at twice the runtime limit (spot's max wait).
        hours = (
            2 * pipeline.approval_timeout_hours + (pipeline.capacity_retries + 1) * 2 * pipeline.max_runtime_hours + 1
        )
        return sfn.StateMachine(
            self,
            "TrainingPipeline",
            # Named: the console user who starts a run finds it by this name.
            state_machine_name=settings.name_prefix,
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

    def _acknowledge_state_machine_grants(self, packages: str, invoked: list[PlatformFunction]) -> None:
        role = self.state_machine.role
        acknowledge_inline_policy(role)
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "Step Functions log delivery and X-Ray (logs:CreateLogDelivery..., xray:PutTraceSegments...) "
            "take no resource scope; nor do batch:ListJobs and batch:ListServiceJobs (finding a job a submit may "
            "have queued, by name, for the adoption check to judge).",
        )
        for resource, reason in {
            stack_arn(self, "sagemaker", "training-job/*"): (
                "Job names are per run and attempt; CreateTrainingJob is further limited by condition to the "
                "platform's subnet, security group and output key."
            ),
            packages: "Approving or rejecting versions in the platform's one model package group.",
            **{
                f"{fn.function.function_arn}:*": "Step Functions invokes any version of the platform's own handler."
                for fn in [*invoked, self.approval.request, self.approval.verify]
            },
        }.items():
            acknowledge_wildcard(role, resource, reason)

"""Hyperparameter tuning as Step Functions states: create a SageMaker tuning job, then poll it until it ends.

A request with `tuning` takes this step instead of the single job. The tuning job's training-job
definition is the single job's CreateTrainingJob parameters, renamed to HyperParameterTrainingJobDefinition's
keys (contract/service_requests.py), so every trial carries the same role, image, VPC, KMS keys,
encryption and isolation flags, spot and checkpoint settings and channels; IAM
conditions on CreateHyperParameterTuningJob repeat the ones on CreateTrainingJob. The step leaves
`$.job` as the best trial's JobProgress, so evaluation and registration read it unchanged.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ERROR, REQUEST, TRAIN
from contract.service_requests import Variant, create_tuning_job
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import SAGEMAKER_TRANSIENT
from stacks.pipeline.create_training_job import DistributedTrainingJob, volumes
from stacks.pipeline.parts import StepParts, stack_arn, string
from stacks.pipeline.polled_job import (
    PolledJobStep,
    StepNames,
    monitor_function,
    sdk_task,
)
from stacks.pipeline.sagemaker_step import SageMakerTraining
from stacks.pipeline.training_step import StepChoice, TrainingStep

NAMES = StepNames(
    label="tuning", not_created_error="TuningJobNotCreated", succeeded_comment="$.job holds the best trial"
)


class SageMakerTuning(Construct):
    """Create + poll a SageMaker hyperparameter tuning job; stop it and prune checkpoints on every way out."""

    def __init__(self, scope: Construct, id_: str, *, parts: StepParts, training: SageMakerTraining) -> None:
        super().__init__(scope, id_)
        self._parts = parts
        self.job: DistributedTrainingJob = training.job
        self.adoption = training.adoption
        self.request = create_tuning_job(self.job.constants)
        self.monitor = self._monitor_function()
        self._grant_stop(training.cleanup.role)
        # A tuning job is not replaced: SageMaker retries its trials, and it stops them on its own limits.
        step = PolledJobStep(
            self,
            parts=parts,
            names=NAMES,
            create=self._create,
            progress=self.monitor,
            job={},
            # The single job's Cleanup stops an execution's tuning jobs and their trials too.
            cleanup=training.cleanup,
        )
        self.start, self.succeeded, self.failed = step.start, step.succeeded, step.failed
        self.functions: list[PlatformFunction] = [self.monitor]
        self.goodput_writers: list[PlatformFunction] = [self.monitor]

    @property
    def backends(self) -> list[str]:
        return ["sagemaker"]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        """The machine creates tuning jobs (as the platform configures training jobs only) and tags them."""
        self.grant_run(state_machine.role)
        acknowledge_wildcard(
            state_machine.role,
            stack_arn(self, "sagemaker", "hyper-parameter-tuning-job/*"),
            "Tuning job names are per run; CreateHyperParameterTuningJob is limited by condition to the platform's "
            "subnet, security group, keys, instance types, runtime and flags, as CreateTrainingJob is.",
        )

    def create_state(self, id_: str, variant: Variant) -> sfn.CustomState:
        """CreateHyperParameterTuningJob; its result is the tuning job's name and ARN under `$.train.job`."""
        return sdk_task(
            self,
            id_,
            self.request.service,
            self.request.action,
            {
                "Comment": "Starts the tuning job; its trials are the single job's definition with tuned values"
                + volumes(variant),
                "Parameters": self.request.states_parameters(variant),
                "ResultSelector": {
                    "arn.$": "$.HyperParameterTuningJobArn",
                    "job_name.$": "States.ArrayGetItem(States.StringSplit($.HyperParameterTuningJobArn, '/'), 1)",
                },
                "ResultPath": str(TRAIN.job),
            },
            passes=SAGEMAKER_TRANSIENT,
        )

    def grant_run(self, state_machine_role: iam.IRole) -> None:
        """CreateHyperParameterTuningJob under CreateTrainingJob's conditions (the keys SageMaker supports for it)."""
        job = self.job
        tuning_jobs = stack_arn(self, "sagemaker", "hyper-parameter-tuning-job/*")
        statements = job.create_statements(
            "sagemaker:CreateHyperParameterTuningJob", tuning_jobs, sid_prefix="CreateTuning"
        )
        for statement in statements:
            state_machine_role.add_to_principal_policy(statement)
        state_machine_role.add_to_principal_policy(
            iam.PolicyStatement(sid="TagTuningJobs", actions=["sagemaker:AddTags"], resources=[tuning_jobs])
        )

    def _grant_stop(self, role: iam.IRole) -> None:
        """Find an execution's tuning jobs by their tags, and stop them (the cleanup's grant)."""
        tuning_jobs = stack_arn(self, "sagemaker", "hyper-parameter-tuning-job/*")
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ListTuningJobs", actions=["sagemaker:ListHyperParameterTuningJobs"], resources=["*"]
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="StopTuningJobs",
                actions=["sagemaker:ListTags", "sagemaker:StopHyperParameterTuningJob"],
                resources=[tuning_jobs],
            )
        )
        acknowledge_wildcard(
            role, tuning_jobs, "Lists the tags of in-progress tuning jobs and stops those of the execution that ended."
        )

    def _monitor_function(self) -> PlatformFunction:
        monitor = monitor_function(
            self._parts,
            "TuningProgress",
            handler="lambdas.tuning.handler.handler",
            description="Summarises a tuning job: its trials while it runs, then its best training job and what every "
            "trial cost",
            # An ended tuning job's trials are described one by one (up to 100) to sum what they cost.
            timeout=Duration.minutes(2),
        )
        tuning_jobs = stack_arn(self, "sagemaker", "hyper-parameter-tuning-job/*")
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="FollowTuningJobs", actions=["sagemaker:DescribeHyperParameterTuningJob"], resources=[tuning_jobs]
            )
        )
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="ListTrials",
                actions=["sagemaker:ListTrainingJobsForHyperParameterTuningJob"],
                resources=[tuning_jobs],
            )
        )
        self.job.grant_follow(monitor.role)
        for resource, reason in {
            tuning_jobs: "Describes the run's tuning job and lists its trials; tuning job names are per run.",
            stack_arn(self, "sagemaker", "training-job/*"): "Describes the tuning job's trials, named by SageMaker.",
        }.items():
            acknowledge_wildcard(monitor.role, resource, reason)
        return monitor

    def _create(self, wait: sfn.Wait, not_created: sfn.IChainable) -> sfn.Choice:
        """CreateHyperParameterTuningJob with or without a volume key; a retried create adopts its own tuning job."""
        create_kms = self.create_state("Create tuning job", Variant())
        create_local = self.create_state("Create tuning job (instance storage)", Variant(local_storage=True))
        adopt = sfn.Pass(
            self,
            "Adopt the created tuning job",
            comment="A retried create found this run's tuning job already running, as it asked for it: follow it",
            parameters={"job_name": string(REQUEST.tuning.job_name)},
            result_path=str(TRAIN.job),
        ).next(wait)
        existing = self.adoption.states(
            self,
            "tuning job",
            kind="tuning-job",
            job=str(REQUEST.tuning.job_name),
            adopt=adopt,
            not_created=not_created,
        )
        for state in (create_kms, create_local):
            state.add_catch(existing, errors=["SageMaker.ResourceInUseException"], result_path=str(ERROR))
            state.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
            state.next(wait)
        return (
            sfn.Choice(self, "Tuning volume encryption?", comment="Instance-store types take no volume KMS key")
            .when(sfn.Condition.boolean_equals(str(REQUEST.local_storage), True), create_local)
            .otherwise(create_kms)
        )


def with_tuning(scope: Construct, single: TrainingStep, tuning: SageMakerTuning) -> TrainingStep:
    """A Choice on the request's `tuning`: a tuning job when it is set, the single-job step otherwise."""
    return TuningChoice(scope, "Tuning", single, tuning)


class TuningChoice(StepChoice):
    """The request's `tuning` picks the tuning step or the single-job step."""

    def __init__(self, scope: Construct, id_: str, single: TrainingStep, tuning: SageMakerTuning) -> None:
        tuned = sfn.Condition.and_(
            sfn.Condition.is_present(str(REQUEST.tuning)), sfn.Condition.is_not_null(str(REQUEST.tuning))
        )
        choice = sfn.Choice(scope, "Tuning job?").when(tuned, tuning.start).otherwise(single.start)
        super().__init__(scope, id_, steps=(single, tuning), start=choice, outcome="Tuning or job")

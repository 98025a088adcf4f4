"""Hyperparameter tuning as Step Functions states: create a SageMaker tuning job, then poll it until it ends.

A request with `tuning` takes this step instead of the single job. The tuning job's training-job
definition is the single job's CreateTrainingJob parameters (`DistributedTrainingJob._create_parameters`),
renamed to HyperParameterTrainingJobDefinition's keys, so every trial carries the same role, image,
VPC, KMS keys, encryption and isolation flags, spot and checkpoint settings and channels; IAM
conditions on CreateHyperParameterTuningJob repeat the ones on CreateTrainingJob. The step leaves
`$.job` as the best trial's JobProgress, so evaluation and registration read it unchanged.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.contract import CLEANUP, ERROR, ESTIMATE, FAILURE, JOB, REQUEST, TRAIN
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge, acknowledge_wildcard
from stacks.constructs.tasks import invoke
from stacks.pipeline.context import PipelineContext, obj, string
from stacks.pipeline.sagemaker_job import SDK_TIMEOUT_SECONDS, TRANSIENT_ERRORS, DistributedTrainingJob, _sdk_arn
from stacks.pipeline.sagemaker_training import SageMakerTraining
from stacks.pipeline.training_step import TrainingStep

# CreateTrainingJob fields a tuning job's definition does not take: the tuning job names and tags its
# trials, and SageMaker's profiler, TensorBoard and warm-pool settings are not part of the definition.
_NOT_IN_DEFINITION = ("TrainingJobName", "Tags", "ProfilerConfig", "TensorBoardOutputConfig")
_RENAMED = {"HyperParameters": "StaticHyperParameters"}
_ALGORITHM_KEYS = ("TrainingImage", "TrainingInputMode", "MetricDefinitions")
_RESOURCE_KEYS_DROPPED = ("KeepAlivePeriodInSeconds",)


def _key(name: str) -> str:
    return name.removesuffix(".$")


def training_job_definition(create_parameters: dict[str, Any]) -> dict[str, Any]:
    """HyperParameterTrainingJobDefinition from the single job's CreateTrainingJob parameters."""
    definition: dict[str, Any] = {}
    for name, value in create_parameters.items():
        key = _key(name)
        if key in _NOT_IN_DEFINITION:
            continue
        suffix = name[len(key) :]
        kept = value
        if key == "AlgorithmSpecification":
            kept = {k: v for k, v in value.items() if _key(k) in _ALGORITHM_KEYS}
        elif key == "ResourceConfig":
            kept = {k: v for k, v in value.items() if _key(k) not in _RESOURCE_KEYS_DROPPED}
        definition[_RENAMED.get(key, key) + suffix] = kept
    return definition


class SageMakerTuning(Construct):
    """Create + poll a SageMaker hyperparameter tuning job; stop it and prune checkpoints on every way out."""

    def __init__(self, scope: Construct, id_: str, *, context: PipelineContext, training: SageMakerTraining) -> None:
        super().__init__(scope, id_)
        self._context = context
        self._training = training
        self.job: DistributedTrainingJob = training.job
        self.monitor = self._monitor_function()
        self._grant_stop(training.cleanup.role)
        self.start = sfn.Pass(
            self, "Tuning attempt", result=sfn.Result.from_object({"attempt": 1}), result_path=str(TRAIN)
        )
        self.failed = sfn.Pass(self, "Tuning step failed", comment="$.failure says why")
        self.succeeded = sfn.Pass(self, "Tuning step succeeded", comment="$.job holds the best trial")
        self._poll()

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
            self._context.arn("sagemaker", "hyper-parameter-tuning-job/*"),
            "Tuning job names are per run; CreateHyperParameterTuningJob is limited by condition to the platform's "
            "subnet, security group, keys, instance types, runtime and flags, as CreateTrainingJob is.",
        )

    def create_state(self, id_: str, *, kms_volume: bool) -> sfn.CustomState:
        """CreateHyperParameterTuningJob; its result is the tuning job's name and ARN under `$.train.job`."""
        tuning = REQUEST.tuning
        return sfn.CustomState(
            self,
            id_,
            state_json={
                "Type": "Task",
                "Comment": "Starts the tuning job; its trials are the single job's definition with tuned values"
                + (" (EBS volumes encrypted with the platform key)" if kms_volume else " (instance-store NVMe)"),
                "Resource": _sdk_arn("createHyperParameterTuningJob"),
                "Parameters": {
                    "HyperParameterTuningJobName.$": str(tuning.job_name),
                    "HyperParameterTuningJobConfig.$": str(tuning.config),
                    # The single job's enforced fields, from the one place they are written.
                    "TrainingJobDefinition": training_job_definition(
                        self.job._create_parameters(kms_volume=kms_volume)
                    ),
                    # SageMaker adds a tuning job's tags to every training job it launches (the cleanup finds them).
                    "Tags.$": str(REQUEST.tags),
                },
                "ResultSelector": {
                    "arn.$": "$.HyperParameterTuningJobArn",
                    "job_name.$": "States.ArrayGetItem(States.StringSplit($.HyperParameterTuningJobArn, '/'), 1)",
                },
                "ResultPath": str(TRAIN.job),
                "TimeoutSeconds": SDK_TIMEOUT_SECONDS,
                "Retry": [
                    {
                        "ErrorEquals": TRANSIENT_ERRORS,
                        "IntervalSeconds": 5,
                        "BackoffRate": 2,
                        "MaxAttempts": 5,
                        "MaxDelaySeconds": 120,
                        "JitterStrategy": "FULL",
                    }
                ],
            },
        )

    def grant_run(self, state_machine_role: iam.IRole) -> None:
        """CreateHyperParameterTuningJob under CreateTrainingJob's conditions (the keys SageMaker supports for it)."""
        job = self.job
        tuning_jobs = self._context.arn("sagemaker", "hyper-parameter-tuning-job/*")
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
        tuning_jobs = self._context.arn("sagemaker", "hyper-parameter-tuning-job/*")
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
        context = self._context
        monitor = context.function(
            "TuningProgress",
            "lambdas.tuning.handler.handler",
            "Summarises a tuning job: its trials while it runs, then its best training job and what every trial cost",
            {},
            # An ended tuning job's trials are described one by one (up to 100) to sum what they cost.
            timeout=Duration.minutes(2),
        )
        tuning_jobs = context.arn("sagemaker", "hyper-parameter-tuning-job/*")
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="FollowTuningJobs", actions=["sagemaker:DescribeHyperParameterTuningJob"], resources=[tuning_jobs]
            )
        )
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(
                sid="ListTrials", actions=["sagemaker:ListTrainingJobsForHyperParameterTuningJob"], resources=["*"]
            )
        )
        self.job.grant_follow(monitor.role)
        for resource, reason in {
            tuning_jobs: "Describes the run's tuning job; tuning job names are per run.",
            context.arn("sagemaker", "training-job/*"): "Describes the tuning job's trials, named by SageMaker.",
        }.items():
            acknowledge_wildcard(monitor.role, resource, reason)
        acknowledge(
            monitor.role,
            "AwsSolutions-IAM5[Resource::*]",
            "sagemaker:ListTrainingJobsForHyperParameterTuningJob is granted on all resources: a read-only "
            "listing of a tuning job's trials, whose costs the run's lineage sums.",
        )
        return monitor

    def _poll(self) -> None:
        """Create, then wait and check until the tuning job ends; the best trial goes on, anything else fails."""
        reset = sfn.Pass(
            self, "Reset tuning progress", result=sfn.Result.from_object({"stale_warned": False}), result_path=str(JOB)
        )
        stop = self._stop_and_fail()
        wait = sfn.Wait(
            self, "Wait for tuning", time=sfn.WaitTime.seconds_path(str(REQUEST.poll_seconds)), comment="Between polls"
        )
        create_kms = self.create_state("Create tuning job", kms_volume=True)
        create_local = self.create_state("Create tuning job (instance storage)", kms_volume=False)
        adopt = sfn.Pass(
            self,
            "Adopt the created tuning job",
            comment="A retried create found this run's tuning job already running: follow it",
            parameters={"job_name": string(REQUEST.tuning.job_name)},
            result_path=str(TRAIN.job),
        ).next(wait)
        not_created = sfn.Pass(
            self,
            "Record tuning job not created",
            parameters={"error": "TuningJobNotCreated", "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        not_created.next(self._clean_up("Stop the run's jobs (tuning not created)", self.failed))
        for state in (create_kms, create_local):
            state.add_catch(adopt, errors=["SageMaker.ResourceInUseException"], result_path=str(ERROR))
            state.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
            state.next(wait)
        create = (
            sfn.Choice(self, "Tuning volume encryption?", comment="Instance-store types take no volume KMS key")
            .when(sfn.Condition.boolean_equals(str(REQUEST.local_storage), True), create_local)
            .otherwise(create_kms)
        )
        check = invoke(
            self,
            "Check tuning progress",
            self.monitor,
            {
                "request": obj(REQUEST),
                "previous": obj(JOB),
                "hourly_usd": sfn.JsonPath.number_at(str(ESTIMATE.hourly_usd)),
            },
            str(JOB),
        )
        check.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        job_failed = sfn.Pass(
            self,
            "Record tuning failure",
            parameters={"error": string(JOB.error), "cause": string(JOB.failure_reason)},
            result_path=str(FAILURE),
        )
        self.start.next(reset).next(create)
        wait.next(check).next(
            sfn.Choice(self, "Tuning finished?")
            .when(sfn.Condition.boolean_equals(str(JOB.finished), False), wait)
            .when(
                sfn.Condition.string_equals(str(JOB.status), "Completed"),
                self._clean_up("Prune checkpoints (tuning)", self.succeeded),
            )
            .otherwise(job_failed.next(self._clean_up("Prune checkpoints (failed tuning)", self.failed)))
        )

    def _stop_and_fail(self) -> sfn.IChainable:
        record = sfn.Pass(
            self,
            "Record tuning orchestration failure",
            parameters={"error": string(ERROR.Error), "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        return record.next(self._clean_up("Stop the run's tuning job", self.failed))

    def _clean_up(self, id_: str, then: sfn.IChainable) -> sfn.IChainable:
        """Stop this execution's tuning job and trials and prune the run's checkpoints, then go on to `then`."""
        task = invoke(
            self,
            id_,
            self._training.cleanup,
            {"execution": sfn.JsonPath.execution_id, "job_name_base": string(REQUEST.job_name_base)},
            str(CLEANUP),
        )
        task.add_catch(then, errors=["States.ALL"], result_path=str(CLEANUP))
        return task.next(then)


def with_tuning(scope: Construct, single: TrainingStep, tuning: SageMakerTuning) -> TrainingStep:
    """A Choice on the request's `tuning`: a tuning job when it is set, the single-job step otherwise."""
    return TuningChoice(scope, "Tuning", single, tuning)


class TuningChoice(Construct):
    """The request's `tuning` picks the tuning step or the single-job step; both end where the pipeline goes on."""

    def __init__(self, scope: Construct, id_: str, single: TrainingStep, tuning: SageMakerTuning) -> None:
        super().__init__(scope, id_)
        self._steps: tuple[TrainingStep, ...] = (single, tuning)
        self._single = single
        tuned = sfn.Condition.and_(
            sfn.Condition.is_present(str(REQUEST.tuning)), sfn.Condition.is_not_null(str(REQUEST.tuning))
        )
        self._start = sfn.Choice(self, "Tuning job?").when(tuned, tuning.start).otherwise(single.start)
        self._succeeded = sfn.Pass(self, "Tuning or job succeeded")
        self._failed = sfn.Pass(self, "Tuning or job failed")
        for step in self._steps:
            step.succeeded.next(self._succeeded)
            step.failed.next(self._failed)

    @property
    def backends(self) -> list[str]:
        return self._single.backends

    @property
    def start(self) -> sfn.IChainable:
        return self._start

    @property
    def succeeded(self) -> sfn.INextable:
        return self._succeeded

    @property
    def failed(self) -> sfn.INextable:
        return self._failed

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {name: queue for step in self._steps for name, queue in step.dead_letters.items()}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        for step in self._steps:
            step.bind(state_machine)

"""The SageMaker training step: one request's training job, from creation to its end, and never beyond it.

The loop is `PolledJobStep`'s (stacks/pipeline/polled_job.py): one Monitor call per round at the
request's `poll_seconds` (lambdas/shared/history.py keeps the longest run inside one execution's
history). A job that failed for want of capacity or in the launcher's pre-flight check starts a
new attempt, on fresh instances, that resumes from the run's checkpoints; the run is told why. On
every way out Cleanup stops the execution's jobs and prunes the run's checkpoints.
"""

from __future__ import annotations

from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ERROR, REQUEST, TRAIN
from contract.service_requests import Variant
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.pipeline.adoption import AdoptionCheck
from stacks.pipeline.create_training_job import DistributedTrainingJob
from stacks.pipeline.parts import StepParts, stack_arn, string
from stacks.pipeline.polled_job import (
    JOB_NAME,
    PolledJobStep,
    StepNames,
    cleanup_function,
    monitor_function,
    watch_ended_executions,
)
from stacks.pipeline.training_step import TrainingResources

NAMES = StepNames()


class SageMakerTraining(Construct):
    """Create + poll a SageMaker training job; stop it and prune its checkpoints on every way out."""

    def __init__(
        self, scope: Construct, id_: str, *, parts: StepParts, job: DistributedTrainingJob, adoption: AdoptionCheck
    ) -> None:
        super().__init__(scope, id_)
        self._parts = parts
        self.job = job
        self.adoption = adoption
        self.monitor = self._monitor_function()
        self.cleanup = self._cleanup_function()
        self.next_cluster = parts.handlers.function(
            "NextCluster",
            "lambdas.sagemaker.capacity.handler",
            "Moves a run's next attempt onto its next fallback cluster after insufficient capacity",
            {},
        )
        step = PolledJobStep(
            self,
            parts=parts,
            names=NAMES,
            create=self._create,
            progress=self.monitor,
            job={"job_name": string(TRAIN.job.job_name)},
            cleanup=self.cleanup,
            replaces_jobs=True,
            capacity_retries=parts.pipeline.capacity_retries,
            fallback=self.next_cluster,
        )
        self.start, self.succeeded, self.failed = step.start, step.succeeded, step.failed
        # The adoption check is every backend's; SageMaker's step, always deployed, is where it is alarmed on.
        self.functions: list[PlatformFunction] = [self.monitor, self.cleanup, self.next_cluster, adoption.handler]
        self.goodput_writers: list[PlatformFunction] = [self.monitor]

    @classmethod
    def build(cls, scope: Construct, id_: str, parts: StepParts, resources: TrainingResources) -> SageMakerTraining:
        return cls(scope, id_, parts=parts, job=resources.job, adoption=resources.adoption)

    @property
    def backends(self) -> list[str]:
        return ["sagemaker"]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {"Cleanup": self.cleanup_dead_letters}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        """The machine creates (as the platform configures them only) and tags jobs; ended executions are cleaned up."""
        self.job.grant_run(state_machine.role)
        watch_ended_executions(
            self,
            "ExecutionEnded",
            description="Stops the training jobs of a pipeline execution that was aborted, timed out or failed",
            state_machine=state_machine,
            cleanup=self.cleanup,
            dead_letters=self.cleanup_dead_letters,
        )

    def _monitor_function(self) -> PlatformFunction:
        monitor = monitor_function(
            self._parts,
            "Monitor",
            handler="lambdas.sagemaker.monitor.handler",
            description="Summarises a running job: status, spot interruptions, checkpoint freshness",
        )
        self.job.grant_follow(monitor.role)
        acknowledge_wildcard(
            monitor.role,
            stack_arn(self, "sagemaker", "training-job/*"),
            "Describes the run's job; job names are per run and attempt.",
        )
        return monitor

    def _cleanup_function(self) -> PlatformFunction:
        """The handler that stops a run's jobs and prunes its checkpoints (state machine and EventBridge)."""
        cleanup, self.cleanup_dead_letters, superseded = cleanup_function(
            self._parts,
            "Cleanup",
            handler="lambdas.sagemaker.cleanup.handler",
            description="Stops a run's training jobs and prunes its checkpoints when the run ends",
        )
        self.job.grant_stop(cleanup.role)
        for resource, reason in {
            superseded: "Superseded checkpoints of the run that ended (the bucket keeps their versions a while).",
            stack_arn(self, "sagemaker", "training-job/*"): (
                "Lists the tags of in-progress jobs and stops those of the execution that ended."
            ),
        }.items():
            acknowledge_wildcard(cleanup.role, resource, reason)
        return cleanup

    def _create(self, wait: sfn.Wait, not_created: sfn.IChainable) -> sfn.Choice:
        job = self.job
        create_kms = job.create_state(self, "Create training job", Variant())
        create_local = job.create_state(self, "Create training job (instance storage)", Variant(local_storage=True))
        groups_kms = job.create_state(self, "Create training job (instance groups)", Variant(heterogeneous=True))
        groups_local = job.create_state(
            self,
            "Create training job (instance groups, instance storage)",
            Variant(local_storage=True, heterogeneous=True),
        )
        adopt = sfn.Pass(
            self,
            "Adopt the created job",
            comment="A retried create found this attempt's job already running, as it asked for it: follow it",
            parameters={"job_name": sfn.JsonPath.string_at(JOB_NAME)},
            result_path=str(TRAIN.job),
        ).next(wait)
        existing = self.adoption.states(
            self, "training job", kind="training-job", job=JOB_NAME, adopt=adopt, not_created=not_created
        )
        plans = []
        if self.job.training_plan_arn is not None:
            plan_kms = job.create_state(self, "Create training job (training plan)", Variant(training_plan=True))
            plan_local = job.create_state(
                self,
                "Create training job (training plan, instance storage)",
                Variant(local_storage=True, training_plan=True),
            )
            plans = [plan_kms, plan_local]
        for state in (create_kms, create_local, groups_kms, groups_local, *plans):
            state.add_catch(existing, errors=["SageMaker.ResourceInUseException"], result_path=str(ERROR))
            state.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
            state.next(wait)
        local = sfn.Condition.boolean_equals(str(REQUEST.local_storage), True)
        heterogeneous = sfn.Condition.boolean_equals(str(REQUEST.heterogeneous), True)
        choice = sfn.Choice(
            self,
            "Volume encryption?",
            comment="Instance-store types take no volume KMS key; a heterogeneous cluster is given as instance groups"
            + ("; a job on the training plan's type runs in it" if plans else ""),
        )
        if plans:
            in_plan = sfn.Condition.boolean_equals(str(REQUEST.training_plan), True)
            choice.when(sfn.Condition.and_(in_plan, local), plans[1]).when(in_plan, plans[0])
        return (
            choice.when(sfn.Condition.and_(heterogeneous, local), groups_local)
            .when(heterogeneous, groups_kms)
            .when(local, create_local)
            .otherwise(create_kms)
        )

"""The AWS Batch training step: one request's multi-node parallel job, from submission to its end.

`start` submits the job (SubmitJob, an SDK integration without `.sync`: one name per attempt,
`<job_name_base>-<attempt>`), then polls it with one PollBatchJob call per round. Batch job names
are not unique, so a submit whose answer was lost lists the queue's jobs by this attempt's name and
adopts the one it finds, when the adoption check finds it the job this attempt asked for, instead of submitting a
second cluster; any other job of that name fails the run, naming what differs. A job that waited for instances
longer than the capacity limit, or failed the launcher's pre-flight check, is replaced by a new
attempt that resumes from the run's checkpoints; a node lost with its host is retried by Batch
itself (the job definition's retry strategy) and resumes the same way. On every way out
StopBatchJobs terminates the execution's jobs and prunes the run's checkpoints; an execution that
ends any other way is cleaned up by an EventBridge rule, as on SageMaker.
"""

from __future__ import annotations

from functools import partial

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.catalog import instance_type
from contract.execution_state import ERROR, TRAIN
from contract.layout import ANY_OUTPUT
from contract.service_requests import BatchJobConstants, submit_job
from lambdas.batch.environment import BatchCleanupEnvironment, BatchMonitorEnvironment
from lambdas.shared.errors import SERVICE_ERRORS
from stacks.constructs.batch_cluster import BatchTrainingCluster
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge, acknowledge_wildcard
from stacks.constructs.tasks import BATCH_TRANSIENT
from stacks.pipeline.adoption import FOUND, AdoptionCheck
from stacks.pipeline.parts import StepParts, stack_arn
from stacks.pipeline.polled_job import (
    JOB_NAME,
    StepNames,
    batch_job_loop,
    cleanup_function,
    monitor_function,
    sdk_task,
    watch_ended_executions,
)
from stacks.pipeline.training_step import TrainingResources

# A multi-node job waits in RUNNABLE until Batch has every node; this long without them counts as
# insufficient capacity, and a new attempt is submitted (Batch itself would wait for ever).
CAPACITY_WAIT_MINUTES = 30

NAMES = StepNames(label="Batch")


class BatchTraining(Construct):
    """Submit + poll an AWS Batch multi-node parallel job; terminate it and prune checkpoints on every way out."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        parts: StepParts,
        cluster: BatchTrainingCluster,
        adoption: AdoptionCheck,
    ) -> None:
        super().__init__(scope, id_)
        self._parts = parts
        self.cluster = cluster
        buckets = parts.buckets
        constants = BatchJobConstants(
            job_queue=cluster.queue.job_queue_arn,
            job_definition=cluster.job_definition.job_definition_arn,
            checkpoints_bucket=buckets.checkpoints.bucket_name,
            artifacts_bucket=buckets.artifacts.bucket_name,
        )
        self.request = submit_job(constants)
        self.adoption = adoption
        adoption.add_batch(constants)
        self.monitor = self._monitor_function()
        self.cleanup = self._cleanup_function()
        step = batch_job_loop(self, parts, names=NAMES, submit=self._submit, monitor=self.monitor, cleanup=self.cleanup)
        self.start, self.succeeded, self.failed = step.start, step.succeeded, step.failed
        self.functions: list[PlatformFunction] = [self.monitor, self.cleanup]
        self.goodput_writers: list[PlatformFunction] = [self.monitor]

    @classmethod
    def build(cls, scope: Construct, id_: str, parts: StepParts, resources: TrainingResources) -> BatchTraining:
        """The step and its cluster (at the stack's scope), sized for the settings' largest cluster."""
        largest, buckets = resources.settings.network.largest_cluster, parts.buckets
        cluster = BatchTrainingCluster(
            Stack.of(scope),
            "BatchCluster",
            instance=instance_type(largest.instance_type),
            max_nodes=largest.count,
            network=resources.network.network,
            placement=resources.network.placement,
            image=resources.image,
            key=buckets.key,
            file_system=resources.file_system,
            datasets=buckets.datasets,
            checkpoints=buckets.checkpoints,
            artifacts=buckets.artifacts,
        )
        return cls(scope, id_, parts=parts, cluster=cluster, adoption=resources.adoption)

    @property
    def backends(self) -> list[str]:
        return ["batch"]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {"StopBatchJobs": self.cleanup_dead_letters}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        """The machine submits this definition to this queue and finds its jobs; ended executions are cleaned up."""
        self.cluster.grant_submit(state_machine.role)
        # ListJobs finds a job a submit may have created (the adoption check judges it).
        self.cluster.grant_find(state_machine.role)
        acknowledge_wildcard(
            state_machine.role,
            stack_arn(self, "batch", "job/*"),
            "Job IDs are Batch's; SubmitJob is limited to the platform's queue and job definition.",
        )
        watch_ended_executions(
            self,
            "BatchExecutionEnded",
            description="Terminates the AWS Batch jobs of a pipeline execution that was aborted, timed out or failed",
            state_machine=state_machine,
            cleanup=self.cleanup,
            dead_letters=self.cleanup_dead_letters,
        )

    def _monitor_function(self) -> PlatformFunction:
        buckets = self._parts.buckets
        monitor = monitor_function(
            self._parts,
            "PollBatchJob",
            handler="lambdas.batch.monitor.handler",
            description="Summarises a running AWS Batch job: status, lost nodes, capacity wait, checkpoint freshness",
            environment=partial(BatchMonitorEnvironment, capacity_wait_minutes=CAPACITY_WAIT_MINUTES),
        )
        outputs = f"{buckets.artifacts.bucket_arn}/{ANY_OUTPUT}"
        # What the launcher wrote for the job: its result (metrics, model URI) and failure, per node and attempt.
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(sid="ReadJobResults", actions=["s3:GetObject"], resources=[outputs])
        )
        self.cluster.grant_follow(monitor.role)
        # A job that waited too long for instances is terminated before its replacement is submitted.
        self.cluster.grant_terminate(monitor.role)
        acknowledge_wildcard(monitor.role, outputs, "Reads the result files the launcher wrote for the polled job.")
        acknowledge_wildcard(
            monitor.role,
            stack_arn(self, "batch", "job/*"),
            "Terminates the polled job when it waited too long for capacity.",
        )
        acknowledge(
            monitor.role,
            "AwsSolutions-IAM5[Resource::*]",
            "batch:DescribeJobs and batch:ListJobs take no resource scope.",
        )
        return monitor

    def _cleanup_function(self) -> PlatformFunction:
        cleanup, self.cleanup_dead_letters, superseded = cleanup_function(
            self._parts,
            "StopBatchJobs",
            handler="lambdas.batch.cleanup.handler",
            description="Terminates a run's AWS Batch jobs and prunes its checkpoints when the run ends",
            environment=partial(BatchCleanupEnvironment, job_queue=self.cluster.queue.job_queue_arn),
        )
        self.cluster.grant_follow(cleanup.role)
        self.cluster.grant_terminate(cleanup.role)
        acknowledge(
            cleanup.role,
            "AwsSolutions-IAM5[Resource::*]",
            "batch:DescribeJobs and batch:ListJobs take no resource scope.",
        )
        for resource, reason in {
            superseded: "Superseded checkpoints of the run that ended (the bucket keeps their versions a while).",
            stack_arn(self, "batch", "job/*"): "Terminates the jobs tagged with the execution that ended.",
        }.items():
            acknowledge_wildcard(cleanup.role, resource, reason)
        return cleanup

    def _submit_state(self, id_: str) -> sfn.CustomState:
        return sdk_task(
            self,
            id_,
            self.request.service,
            self.request.action,
            {
                "Comment": "Submits the multi-node parallel job (no .sync: the pipeline polls it)",
                "Parameters": self.request.states_parameters(),
                "ResultSelector": {"arn.$": "$.JobArn", "job_name.$": "$.JobName"},
                "ResultPath": str(TRAIN.job),
            },
            passes=None,
        )

    def _find_state(self, id_: str) -> sfn.CustomState:
        """This attempt's jobs on the queue, by name (names are per execution and attempt)."""
        return sdk_task(
            self,
            id_,
            "batch",
            "listJobs",
            {
                "Comment": "A submit whose answer was lost may have created the job: look for it by name",
                "Parameters": {
                    "JobQueue": self.cluster.queue.job_queue_arn,
                    "Filters": [{"Name": "JOB_NAME", "Values.$": f"States.Array({JOB_NAME})"}],
                },
                "ResultSelector": FOUND,
                "ResultPath": str(TRAIN.found),
            },
            passes=BATCH_TRANSIENT,
        )

    def _submit(self, wait: sfn.Wait, stop_not_created: sfn.IChainable) -> sfn.IChainable:
        """Submit; on an error, adopt this attempt's job if the submit happened after all, else submit once more."""
        first, second = self._submit_state("Submit Batch job"), self._submit_state("Submit Batch job again")
        find_first, find_second = (
            self._find_state("Find submitted Batch job"),
            self._find_state("Find resubmitted Batch job"),
        )
        existing = self.adoption.found_states(
            self, "Batch job", kind="batch-job", fields=("arn", "job_name"), wait=wait, not_created=stop_not_created
        )
        found = f"{TRAIN.found.arns}[0]"
        pause = sfn.Wait(self, "Before submitting again", time=sfn.WaitTime.duration(Duration.seconds(10)))
        # A refused request (a bad one, a missing queue or definition) made no job: nothing to look for or send again.
        for submit, find in ((first, find_first), (second, find_second)):
            submit.add_catch(stop_not_created, errors=SERVICE_ERRORS["batch"].not_retried(), result_path=str(ERROR))
            submit.add_catch(find, errors=["States.ALL"], result_path=str(ERROR))
        find_first.add_catch(stop_not_created, errors=["States.ALL"], result_path=str(ERROR))
        find_second.add_catch(stop_not_created, errors=["States.ALL"], result_path=str(ERROR))
        find_first.next(
            sfn.Choice(self, "Submitted after all?")
            .when(sfn.Condition.is_present(found), existing)
            .otherwise(pause.next(second))
        )
        find_second.next(
            sfn.Choice(self, "Resubmitted after all?")
            .when(sfn.Condition.is_present(found), existing)
            .otherwise(stop_not_created)
        )
        first.next(wait)
        second.next(wait)
        return first

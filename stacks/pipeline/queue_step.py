"""The team queue step: one request's SageMaker training job, queued as an AWS Batch service job under its team's
quota share (stacks/constructs/queue.py), from submission to its end, and never beyond it.

`start` builds exactly the CreateTrainingJob request the SageMaker step sends (contract/service_requests.py:
the platform's role, image, VPC, keys, output and checkpoint locations) and submits it as
the service job's `serviceRequestPayload`, to the team's quota share at the request's priority, tagged with
the team (its cost-allocation tag and what the per-team budget stop matches), the execution and the run. The
submit's client token is the attempt's name: AWS Batch refuses a retried submit that repeats it with the same
request, so a submit whose answer was lost lists the queue's jobs by the attempt's name and follows the one it
finds when the adoption check finds it the job this attempt asked for, instead of queueing a second.
PollServiceJob follows it: while it waits the run sees "queued for capacity" and the scheduler's reason; when
the scheduler preempts it, Batch requeues it and its next training job resumes from the run's checkpoints, up to
`service_environment.preemption_retries` times. A job that failed in the pre-flight check, on a straggler or in
a hang is replaced by a new attempt, as on SageMaker. On every
way out StopServiceJobs terminates the execution's service jobs and prunes the run's checkpoints; an
execution that ends any other way is cleaned up by an EventBridge rule.
"""

from __future__ import annotations

from functools import partial

from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import ERROR, REQUEST, TRAIN
from contract.service_requests import ServiceJobConstants, Variant, submit_service_job
from lambdas.backends.queue import QUEUE
from lambdas.queue.environment import QueueCleanupEnvironment
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge, acknowledge_wildcard
from stacks.constructs.queue import TeamQueue
from stacks.constructs.tasks import BATCH_TRANSIENT
from stacks.pipeline.adoption import FOUND, AdoptionCheck
from stacks.pipeline.create_training_job import DistributedTrainingJob, volumes
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

NAMES = StepNames(label="queue", not_created_error="ServiceJobNotSubmitted")


class QueueTraining(Construct):
    """Submit + poll a team's service job; terminate it and prune checkpoints on every way out."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        parts: StepParts,
        job: DistributedTrainingJob,
        teams: TeamQueue,
        preemption_retries: int,
        adoption: AdoptionCheck,
    ) -> None:
        super().__init__(scope, id_)
        self._parts, self.job, self.teams, self.adoption = parts, job, teams, adoption
        constants = ServiceJobConstants(team_queue=teams.queue_arn, preemption_retries=preemption_retries)
        self.request = submit_service_job(constants, job.constants)
        adoption.add_queue(constants, follow_service_jobs)
        self.monitor = self._monitor_function()
        self.cleanup = self._cleanup_function()
        step = batch_job_loop(self, parts, names=NAMES, submit=self._submit, monitor=self.monitor, cleanup=self.cleanup)
        self.start, self.succeeded, self.failed = step.start, step.succeeded, step.failed
        self.functions: list[PlatformFunction] = [self.monitor, self.cleanup]
        self.goodput_writers: list[PlatformFunction] = [self.monitor]

    @classmethod
    def build(cls, scope: Construct, id_: str, parts: StepParts, resources: TrainingResources) -> QueueTraining:
        if resources.teams is None:
            raise ValueError("the queue step runs teams' jobs: settings name no teams")
        retries = resources.settings.service_environment.preemption_retries
        return cls(
            scope,
            id_,
            parts=parts,
            job=resources.job,
            teams=resources.teams,
            preemption_retries=retries,
            adoption=resources.adoption,
        )

    @property
    def backends(self) -> list[str]:
        return [QUEUE]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {"StopServiceJobs": self.cleanup_dead_letters}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        """The machine submits the teams' service jobs (passing the SageMaker role); ended executions are cleaned
        up."""
        self.teams.grant_service_jobs(state_machine.role, execution_role=self.job.role)
        watch_ended_executions(
            self,
            "QueueExecutionEnded",
            description="Terminates the teams' service jobs of a pipeline execution that was aborted, timed out or "
            "failed",
            state_machine=state_machine,
            cleanup=self.cleanup,
            dead_letters=self.cleanup_dead_letters,
        )

    def _monitor_function(self) -> PlatformFunction:
        monitor = monitor_function(
            self._parts,
            "PollServiceJob",
            handler="lambdas.queue.monitor.handler",
            description="Summarises a team's queued training job: its place in the queue, preemptions, then its "
            "training job",
        )
        self.job.grant_follow(monitor.role)
        follow_service_jobs(monitor.role)
        # Batch names a service job's training jobs: they are found by name among the listed ones.
        monitor.function.add_to_role_policy(
            iam.PolicyStatement(sid="FindTrainingJobs", actions=["sagemaker:ListTrainingJobs"], resources=["*"])
        )
        acknowledge_wildcard(
            monitor.role,
            stack_arn(self, "sagemaker", "training-job/*"),
            "Describes the training jobs of the run's service job; Batch names them.",
        )
        acknowledge(monitor.role, "AwsSolutions-IAM5[Resource::*]", "batch:DescribeServiceJob takes no resource scope.")
        return monitor

    def _cleanup_function(self) -> PlatformFunction:
        cleanup, self.cleanup_dead_letters, superseded = cleanup_function(
            self._parts,
            "StopServiceJobs",
            handler="lambdas.queue.cleanup.handler",
            description="Terminates a run's queued service jobs and prunes its checkpoints when the run ends",
            environment=partial(QueueCleanupEnvironment, job_queue=self.teams.queue_arn),
        )
        follow_service_jobs(cleanup.role, listing=True)
        self.teams.grant_terminate(cleanup.role)
        acknowledge(
            cleanup.role,
            "AwsSolutions-IAM5[Resource::*]",
            "batch:ListServiceJobs and batch:DescribeServiceJob take no resource scope.",
        )
        acknowledge_wildcard(
            cleanup.role,
            superseded,
            "Superseded checkpoints of the run that ended (the bucket keeps their versions a while).",
        )
        return cleanup

    def _payload_state(self, id_: str, variant: Variant) -> sfn.CustomState:
        """The CreateTrainingJob request the service job queues, and the service job's tags."""
        return sfn.CustomState(
            self,
            id_,
            state_json={
                "Type": "Pass",
                "Comment": "Exactly the SageMaker step's CreateTrainingJob request"
                + (" on a heterogeneous cluster" if variant.heterogeneous else "")
                + volumes(variant),
                "Parameters": self.request.staged_parameters(TRAIN.submission, variant),
                "ResultPath": str(TRAIN.submission),
            },
        )

    def _submit_state(self) -> sfn.CustomState:
        return sdk_task(
            self,
            "Submit service job",
            self.request.service,
            self.request.action,
            {
                "Comment": "Queues the training job under the team's quota share (no .sync: the pipeline polls it)",
                "Parameters": self.request.states_parameters(),
                "ResultSelector": {"arn.$": "$.JobArn", "job_name.$": "$.JobName", "job_id.$": "$.JobId"},
                "ResultPath": str(TRAIN.job),
            },
            passes=BATCH_TRANSIENT,
        )

    def _find_state(self) -> sfn.CustomState:
        """This attempt's service jobs on the teams' queue, by name (names are per execution and attempt)."""
        return sdk_task(
            self,
            "Find submitted service job",
            "batch",
            "listServiceJobs",
            {
                "Comment": "A submit that failed may have queued the job (its answer lost, then its retry refused "
                "for the client token it repeats): look for it by name",
                "Parameters": {
                    "JobQueue": self.teams.queue_arn,
                    "Filters": [{"Name": "JOB_NAME", "Values.$": f"States.Array({JOB_NAME})"}],
                },
                "ResultSelector": FOUND,
                "ResultPath": str(TRAIN.found),
            },
            passes=BATCH_TRANSIENT,
        )

    def _submit(self, wait: sfn.Wait, not_created: sfn.IChainable) -> sfn.IChainable:
        """Submit; when it fails, adopt this attempt's service job if one was queued after all and it is the one
        asked for (AWS Batch refuses a submit that repeats an earlier one's client token and request)."""
        submit, find = self._submit_state(), self._find_state()
        submit.add_catch(find, errors=["States.ALL"], result_path=str(ERROR))
        find.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
        submit.next(wait)
        existing = self.adoption.found_states(
            self,
            "service job",
            kind="service-job",
            fields=("arn", "job_name", "job_id"),
            wait=wait,
            not_created=not_created,
        )
        find.next(
            sfn.Choice(self, "Queued after all?")
            .when(sfn.Condition.is_present(f"{TRAIN.found.arns}[0]"), existing)
            .otherwise(not_created)
        )
        both = Variant(local_storage=True, heterogeneous=True)
        labels = {
            Variant(): "Build the queued request",
            Variant(local_storage=True): "Build the queued request (instance storage)",
            Variant(heterogeneous=True): "Build the queued request (instance groups)",
            both: "Build the queued request (instance groups, instance storage)",
        }
        payloads = {variant: self._payload_state(label, variant) for variant, label in labels.items()}
        for state in payloads.values():
            state.next(submit)
        local = sfn.Condition.boolean_equals(str(REQUEST.local_storage), True)
        heterogeneous = sfn.Condition.boolean_equals(str(REQUEST.heterogeneous), True)
        return (
            sfn.Choice(self, "Volume encryption? (queue)", comment="Instance-store types take no volume KMS key")
            .when(sfn.Condition.and_(heterogeneous, local), payloads[both])
            .when(heterogeneous, payloads[Variant(heterogeneous=True)])
            .when(local, payloads[Variant(local_storage=True)])
            .otherwise(payloads[Variant()])
        )


def follow_service_jobs(role: iam.IRole, *, listing: bool = False) -> None:
    """DescribeServiceJob (and ListServiceJobs): the Service Authorization Reference lets them name no resource."""
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="FollowServiceJobs",
            actions=["batch:DescribeServiceJob", *(["batch:ListServiceJobs"] if listing else [])],
            resources=["*"],
        )
    )

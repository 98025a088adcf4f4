"""The SageMaker training step: one request's training job, from creation to its end, and never beyond it.

`start` creates the job (one name per attempt, so a create that succeeded but was retried adopts
its own job), then polls it with one Monitor call per round at the request's `poll_seconds`
(lambdas/shared/history.py keeps the longest run inside one execution's history). A job that
failed for want of capacity or in the launcher's pre-flight check starts a new attempt, on fresh
instances, that resumes from the run's checkpoints; the run is told why. On every way out Cleanup
prunes the run's checkpoints to the newest complete one, and a failure of the orchestration
itself (a handler that keeps failing, a notification that cannot be sent) first stops the run's
jobs. An execution that ends any other way (aborted, timed out) is cleaned up by an EventBridge
rule on the state machine's status changes.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.contract import CLEANUP, ERROR, ESTIMATE, FAILURE, JOB, REQUEST, TRAIN
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import invoke
from stacks.pipeline.context import PipelineContext, obj, string
from stacks.pipeline.sagemaker_job import JOB_NAME, DistributedTrainingJob


class SageMakerTraining(Construct):
    """Create + poll a SageMaker training job; stop it and prune its checkpoints on every way out."""

    def __init__(self, scope: Construct, id_: str, *, context: PipelineContext) -> None:
        super().__init__(scope, id_)
        self._context = context
        self.job = DistributedTrainingJob(context.stack, "Training", context=context)
        self.monitor = self._monitor_function()
        self.cleanup = self._cleanup_function()
        self.start = sfn.Pass(
            self, "First attempt", result=sfn.Result.from_object({"attempt": 1}), result_path=str(TRAIN)
        )
        self.failed = sfn.Pass(self, "Training step failed", comment="$.failure says why")
        self.succeeded = sfn.Pass(self, "Training step succeeded", comment="$.job holds the finished job")
        self._poll()

    @property
    def backends(self) -> list[str]:
        return ["sagemaker"]

    @property
    def dead_letters(self) -> dict[str, sqs.IQueue]:
        return {"Cleanup": self.cleanup_dead_letters}

    def bind(self, state_machine: sfn.StateMachine) -> None:
        """The machine creates (as the platform configures them only) and tags jobs; ended executions are cleaned up."""
        self.job.grant_run(state_machine.role)
        events.Rule(
            self._context.stack,
            "ExecutionEnded",
            description="Stops the training jobs of a pipeline execution that was aborted, timed out or failed",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [state_machine.state_machine_arn],
                    "status": ["ABORTED", "TIMED_OUT", "FAILED"],
                },
            ),
            targets=[
                targets.LambdaFunction(
                    self.cleanup.function,
                    dead_letter_queue=self.cleanup_dead_letters,
                    retry_attempts=8,
                    max_event_age=Duration.hours(6),
                )
            ],
        )

    def _monitor_function(self) -> PlatformFunction:
        context = self._context
        monitor = context.function(
            "Monitor",
            "lambdas.monitor.handler.handler",
            "Summarises a running job: status, spot interruptions, checkpoint freshness",
            {
                "CHECKPOINTS_BUCKET": context.checkpoints.bucket_name,
                "CHECKPOINT_STALE_MINUTES": str(context.pipeline.checkpoint_stale_minutes),
            },
        )
        # It lists checkpoint manifests (key names and dates); it never reads an object.
        monitor.function.add_to_role_policy(self._list_run_checkpoints())
        self.job.grant_follow(monitor.role)
        acknowledge_wildcard(
            monitor.role,
            context.arn("sagemaker", "training-job/*"),
            "Describes the run's job; job names are per run and attempt.",
        )
        return monitor

    def _cleanup_function(self) -> PlatformFunction:
        """The handler that stops a run's jobs and prunes its checkpoints (state machine and EventBridge)."""
        context = self._context
        # EventBridge invokes Cleanup asynchronously: what fails there for good is kept here.
        self.cleanup_dead_letters = sqs.Queue(
            context.stack,
            "CleanupDeadLetters",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=context.key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        cleanup = context.function(
            "Cleanup",
            "lambdas.cleanup.handler.handler",
            "Stops a run's training jobs and prunes its checkpoints when the run ends",
            {"CHECKPOINTS_BUCKET": context.checkpoints.bucket_name},
            timeout=Duration.minutes(5),
            dead_letter_queue=self.cleanup_dead_letters,
        )
        # Lambda sends failed events to the dead-letter queue with the function's role.
        context.key.grant(cleanup.function, "kms:GenerateDataKey", "kms:Decrypt")
        cleanup.function.add_to_role_policy(self._list_run_checkpoints())
        superseded = f"{context.checkpoints.bucket_arn}/runs/*/checkpoints/*"
        cleanup.function.add_to_role_policy(
            iam.PolicyStatement(sid="PruneRunCheckpoints", actions=["s3:DeleteObject"], resources=[superseded])
        )
        self.job.grant_stop(cleanup.role)
        for resource, reason in {
            superseded: "Superseded checkpoints of the run that ended (the bucket keeps their versions a while).",
            context.arn("sagemaker", "training-job/*"): (
                "Lists the tags of in-progress jobs and stops those of the execution that ended."
            ),
        }.items():
            acknowledge_wildcard(cleanup.role, resource, reason)
        return cleanup

    def _list_run_checkpoints(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid="ListRunCheckpoints",
            actions=["s3:ListBucket"],
            resources=[self._context.checkpoints.bucket_arn],
            conditions={"StringLike": {"s3:prefix": ["runs/*"]}},
        )

    def _poll(self) -> None:
        """Wait, check, decide: running, stale, completed, a failure to retry on fresh instances, or failed."""
        reset = sfn.Pass(
            self, "Reset progress", result=sfn.Result.from_object({"stale_warned": False}), result_path=str(JOB)
        )
        stop = self._stop_and_fail()
        wait = sfn.Wait(
            self,
            "Wait for training",
            time=sfn.WaitTime.seconds_path(str(REQUEST.poll_seconds)),
            comment="Between polls",
        )
        create = self._create(wait, stop)
        check = invoke(
            self,
            "Check progress",
            self.monitor,
            {
                "request": obj(REQUEST),
                "job_name": string(TRAIN.job.job_name),
                "previous": obj(JOB),
                "hourly_usd": sfn.JsonPath.number_at(str(ESTIMATE.hourly_usd)),
            },
            str(JOB),
        )
        check.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        stale = self._context.notify(
            self,
            "Warn stale checkpoints",
            subject="Training run has not checkpointed recently",
            fields={
                "job": string(JOB.job_name),
                "checkpoint_age_minutes": string(JOB.checkpoint_age_minutes),
                "latest_checkpoint": obj(JOB.checkpoint),
            },
        )
        # A notification that fails for a moment (throttling, KMS) is retried; beyond that the run stops.
        stale.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(5), backoff_rate=2, max_attempts=4)
        stale.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        next_attempt = sfn.Pass(
            self,
            "Next attempt",
            comment="Insufficient capacity or a failed pre-flight check: a new job, with a new name, on fresh "
            "instances, resuming from the run's checkpoints",
            parameters={
                "attempt": sfn.JsonPath.math_add(sfn.JsonPath.number_at(str(TRAIN.attempt)), 1),
                "retried_after": {"error": string(JOB.error), "cause": string(JOB.failure_reason)},
            },
            result_path=str(TRAIN),
        )
        retrying = self._context.notify(
            self,
            "Tell the run why it retries",
            subject="Training job replaced: retrying on fresh instances",
            fields={
                "failed_job": string(JOB.job_name),
                "error": string(TRAIN.retried_after.error),
                "reason": string(TRAIN.retried_after.cause),
                "attempt": sfn.JsonPath.number_at(str(TRAIN.attempt)),
            },
        )
        retrying.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(5), backoff_rate=2, max_attempts=4)
        retrying.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        job_failed = sfn.Pass(
            self,
            "Record job failure",
            parameters={"error": string(JOB.error), "cause": string(JOB.failure_reason)},
            result_path=str(FAILURE),
        )
        self.start.next(reset).next(create)
        next_attempt.next(retrying).next(reset)
        retries = self._context.pipeline.capacity_retries
        wait.next(check).next(
            sfn.Choice(self, "Job finished?")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals(str(JOB.finished), False),
                    sfn.Condition.boolean_equals(str(JOB.warn_stale), True),
                ),
                stale.next(wait),
            )
            .when(sfn.Condition.boolean_equals(str(JOB.finished), False), wait)
            .when(
                sfn.Condition.string_equals(str(JOB.status), "Completed"),
                self._clean_up("Prune checkpoints", self.succeeded),
            )
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals(str(JOB.retry_on_new_nodes), True),
                    sfn.Condition.number_less_than(str(TRAIN.attempt), retries + 1),
                ),
                next_attempt,
            )
            .otherwise(job_failed.next(self._clean_up("Prune checkpoints (failed job)", self.failed)))
        )

    def _create(self, wait: sfn.Wait, stop: sfn.IChainable) -> sfn.Choice:
        create_kms = self.job.create_state(self, "Create training job", kms_volume=True)
        create_local = self.job.create_state(self, "Create training job (instance storage)", kms_volume=False)
        groups_kms = self.job.create_state(self, "Create training job (instance groups)", kms_volume=True, groups=True)
        groups_local = self.job.create_state(
            self, "Create training job (instance groups, instance storage)", kms_volume=False, groups=True
        )
        adopt = sfn.Pass(
            self,
            "Adopt the created job",
            comment="A retried create found this attempt's job already running: follow it",
            parameters={"job_name": sfn.JsonPath.string_at(JOB_NAME)},
            result_path=str(TRAIN.job),
        ).next(wait)
        not_created = sfn.Pass(
            self,
            "Record job not created",
            parameters={"error": "TrainingJobNotCreated", "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        # The create may have happened even so (a timeout): stop whatever this execution started.
        not_created.next(self._clean_up("Stop the run's jobs (not created)", self.failed))
        for state in (create_kms, create_local, groups_kms, groups_local):
            state.add_catch(adopt, errors=["SageMaker.ResourceInUseException"], result_path=str(ERROR))
            state.add_catch(not_created, errors=["States.ALL"], result_path=str(ERROR))
            state.next(wait)
        local = sfn.Condition.boolean_equals(str(REQUEST.local_storage), True)
        heterogeneous = sfn.Condition.boolean_equals(str(REQUEST.heterogeneous), True)
        return (
            sfn.Choice(
                self,
                "Volume encryption?",
                comment="Instance-store types take no volume KMS key; a heterogeneous cluster is given as instance "
                "groups",
            )
            .when(sfn.Condition.and_(heterogeneous, local), groups_local)
            .when(heterogeneous, groups_kms)
            .when(local, create_local)
            .otherwise(create_kms)
        )

    def _stop_and_fail(self) -> sfn.IChainable:
        """After an orchestration failure ($.error): stop the run's jobs, then fail the step with that error."""
        record = sfn.Pass(
            self,
            "Record orchestration failure",
            parameters={"error": string(ERROR.Error), "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        return record.next(self._clean_up("Stop the run's jobs", self.failed))

    def _clean_up(self, id_: str, then: sfn.IChainable) -> sfn.IChainable:
        """Stop this execution's running jobs and prune the run's checkpoints, then go on to `then`.

        A cleanup that fails is recorded in `$.cleanup`; the execution-ended rule cleans up again.
        """
        task = invoke(
            self,
            id_,
            self.cleanup,
            {"execution": sfn.JsonPath.execution_id, "job_name_base": string(REQUEST.job_name_base)},
            str(CLEANUP),
        )
        task.add_catch(then, errors=["States.ALL"], result_path=str(CLEANUP))
        return task.next(then)

"""The training step: one request's SageMaker training job, from creation to its end, and never beyond it.

`start` creates the job (one name per attempt, so a create that succeeded but was retried adopts
its own job), then polls it with one handler call per round at the request's `poll_seconds`
(lambdas/shared/history.py keeps the longest run inside one execution's history). A capacity
failure starts a new attempt that resumes from the run's checkpoints. On every way out the run's
checkpoints are pruned to the newest complete one, and a failure of the orchestration itself
(a handler that keeps failing, a notification that cannot be sent) first stops the run's jobs.

Contract with the pipeline: on success `$.job` is the last poll's summary (final metrics, model
artifacts, checkpoint, billable seconds); on failure `$.failure` is {"error", "cause"}.
"""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from stacks.constructs.function import PlatformFunction
from stacks.constructs.tasks import invoke
from stacks.constructs.training_job import JOB_NAME, DistributedTrainingJob


class SageMakerTrainingStep(Construct):
    """Create + poll a SageMaker training job; stop it and prune its checkpoints on every way out."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        job: DistributedTrainingJob,
        monitor: PlatformFunction,
        cleanup: PlatformFunction,
        capacity_retries: int,
        warn_stale: Callable[[Construct, str], sfn.TaskStateBase],
    ) -> None:
        super().__init__(scope, id_)
        self._cleanup = cleanup
        self.start = sfn.Pass(
            self, "First attempt", result=sfn.Result.from_object({"attempt": 1}), result_path="$.train"
        )
        reset = sfn.Pass(
            self, "Reset progress", result=sfn.Result.from_object({"stale_warned": False}), result_path="$.job"
        )
        self.failed = sfn.Pass(self, "Training step failed", comment="$.failure says why")
        self.succeeded = sfn.Pass(self, "Training step succeeded", comment="$.job holds the finished job")
        stop = self._stop_and_fail()
        wait = sfn.Wait(
            self, "Wait for training", time=sfn.WaitTime.seconds_path("$.request.poll_seconds"), comment="Between polls"
        )
        create = self._create(job, wait, stop)
        check = invoke(
            self,
            "Check progress",
            monitor,
            {
                "request": sfn.JsonPath.object_at("$.request"),
                "job_name": sfn.JsonPath.string_at("$.train.job.job_name"),
                "previous": sfn.JsonPath.object_at("$.job"),
            },
            "$.job",
        )
        check.add_catch(stop, errors=["States.ALL"], result_path="$.error")
        stale = warn_stale(self, "Warn stale checkpoints")
        # A notification that fails for a moment (throttling, KMS) is retried; beyond that the run stops.
        stale.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(5), backoff_rate=2, max_attempts=4)
        stale.add_catch(stop, errors=["States.ALL"], result_path="$.error")
        next_attempt = sfn.Pass(
            self,
            "Next attempt",
            comment="Insufficient capacity: a new job, with a new name, resuming from the run's checkpoints",
            parameters={"attempt": sfn.JsonPath.math_add(sfn.JsonPath.number_at("$.train.attempt"), 1)},
            result_path="$.train",
        )
        completed = self._clean_up("Prune checkpoints", self.succeeded)
        job_failed = sfn.Pass(
            self,
            "Record job failure",
            parameters={
                "error": sfn.JsonPath.string_at("$.job.error"),
                "cause": sfn.JsonPath.string_at("$.job.failure_reason"),
            },
            result_path="$.failure",
        )
        self.start.next(reset).next(create)
        next_attempt.next(reset)
        wait.next(check).next(
            sfn.Choice(self, "Job finished?")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals("$.job.finished", False),
                    sfn.Condition.boolean_equals("$.job.warn_stale", True),
                ),
                stale.next(wait),
            )
            .when(sfn.Condition.boolean_equals("$.job.finished", False), wait)
            .when(sfn.Condition.string_equals("$.job.status", "Completed"), completed)
            .when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals("$.job.capacity_error", True),
                    sfn.Condition.number_less_than("$.train.attempt", capacity_retries + 1),
                ),
                next_attempt,
            )
            .otherwise(job_failed.next(self._clean_up("Prune checkpoints (failed job)", self.failed)))
        )

    def _create(self, job: DistributedTrainingJob, wait: sfn.Wait, stop: sfn.IChainable) -> sfn.Choice:
        create_kms = job.create_state(self, "Create training job", kms_volume=True)
        create_local = job.create_state(self, "Create training job (instance storage)", kms_volume=False)
        adopt = sfn.Pass(
            self,
            "Adopt the created job",
            comment="A retried create found this attempt's job already running: follow it",
            parameters={"job_name": sfn.JsonPath.string_at(JOB_NAME)},
            result_path="$.train.job",
        ).next(wait)
        not_created = sfn.Pass(
            self,
            "Record job not created",
            parameters={"error": "TrainingJobNotCreated", "cause": sfn.JsonPath.string_at("$.error.Cause")},
            result_path="$.failure",
        )
        # The create may have happened even so (a timeout): stop whatever this execution started.
        not_created.next(self._clean_up("Stop the run's jobs (not created)", self.failed))
        for state in (create_kms, create_local):
            state.add_catch(adopt, errors=["SageMaker.ResourceInUseException"], result_path="$.error")
            state.add_catch(not_created, errors=["States.ALL"], result_path="$.error")
            state.next(wait)
        return (
            sfn.Choice(self, "Volume encryption?", comment="Instance-store types take no volume KMS key")
            .when(sfn.Condition.boolean_equals("$.request.local_storage", True), create_local)
            .otherwise(create_kms)
        )

    def _stop_and_fail(self) -> sfn.IChainable:
        """After an orchestration failure ($.error): stop the run's jobs, then fail the step with that error."""
        record = sfn.Pass(
            self,
            "Record orchestration failure",
            parameters={
                "error": sfn.JsonPath.string_at("$.error.Error"),
                "cause": sfn.JsonPath.string_at("$.error.Cause"),
            },
            result_path="$.failure",
        )
        return record.next(self._clean_up("Stop the run's jobs", self.failed))

    def _clean_up(self, id_: str, then: sfn.IChainable) -> sfn.IChainable:
        """Stop this execution's running jobs and prune the run's checkpoints, then go on to `then`.

        A cleanup that fails is recorded in `$.cleanup`; the execution-ended rule cleans up again.
        """
        task = invoke(
            self,
            id_,
            self._cleanup,
            {
                "execution": sfn.JsonPath.execution_id,
                "job_name_base": sfn.JsonPath.string_at("$.request.job_name_base"),
            },
            "$.cleanup",
        )
        task.add_catch(then, errors=["States.ALL"], result_path="$.cleanup")
        return task.next(then)

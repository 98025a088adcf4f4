"""The loop every training backend shares: create a job, then poll it until it ends, and never beyond it.

Step Functions' `.sync` integrations cannot record spot interruptions, warn of stale checkpoints
or replace a job that waits for capacity, so each backend's job is created by an SDK task and
followed by one progress-handler call per round at the request's `poll_seconds`, or later the longer a job has
waited for capacity (lambdas/jobs/pacing.py):

    first attempt -> reset -> create -> wait -> check -> finished?
      running (checkpoints stale)         -> warn, wait
      running                             -> wait
      Completed                           -> clean up -> succeeded
      retry on new nodes (attempts left)  -> next attempt, [next fallback cluster], tell the run why -> reset
      otherwise                           -> record the job's failure -> clean up -> failed

A create that fails for good, and any orchestration failure (a handler error that does not pass, or one
that outlasts its retry budget, stacks/constructs/tasks.py; a notification that keeps failing), records
`$.failure` and cleans up before the step fails. Cleanup stops the execution's jobs and prunes the
run's checkpoints; a cleanup that fails is recorded in `$.cleanup`, and the ExecutionEnded rule
(`watch_ended_executions`) cleans up again, as it does for an execution that was aborted or timed out.
A backend supplies its create states, its progress and cleanup handlers and its label; `replaces_jobs`
adds the stale-checkpoint warning and the replacement of a job that failed for want of capacity, in the
pre-flight check, on a straggling host or in a hang (JobProgress.retry_on_new_nodes); `fallback` (its
handler) moves the attempt after one that found too few instances onto the request's next fallback cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_cdk import Aws, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.execution_state import (
    CLEANUP,
    ERROR,
    ESTIMATE,
    FAILURE,
    JOB,
    NEXT_CLUSTER,
    REQUEST,
    RUN,
    TRAIN,
    JobCost,
)
from contract.layout import (
    ANY_CHECKPOINT,
    ANY_GOODPUT_RECORD,
    ANY_LEDGER_RECORD,
    ANY_MANIFEST,
    ANY_PROGRESS_RECORD,
    ANY_RUN,
    INSUFFICIENT_CAPACITY,
)
from contract.service_requests import ATTEMPT_JOB_NAME
from lambdas.jobs.environment import CleanupEnvironment, MonitorEnvironment
from lambdas.shared.env import HandlerEnvironment
from stacks.constructs.function import PlatformFunction
from stacks.constructs.nag import acknowledge_wildcard
from stacks.constructs.tasks import POLLING, SDK, invoke, retry
from stacks.naming import CHECKPOINT_WRITERS_PATH
from stacks.pipeline.parts import Buckets, StepParts, obj, string

# One name per attempt: a create retried after it had in fact succeeded finds a job of that name, and adopts it
# only when the adoption check finds it the one the platform asked for (stacks/pipeline/adoption.py).
JOB_NAME = ATTEMPT_JOB_NAME.states()
SDK_TIMEOUT_SECONDS = 60
# The state that calls a backend's progress handler, once per poll (another backend's: "Check progress (<label>)").
CHECK_PROGRESS = "Check progress"
# The state that tells the run why its training step starts a new attempt: it is entered once the attempt's cluster is
# settled (another backend's: "Tell the run why it retries (<label>)").
RETRY_TOLD = "Tell the run why it retries"
# A run's cost before its first job: what each finished job's poll adds its cost to (JobProgress.run_cost).
NOTHING_BILLED = JobCost(actual_usd=0.0, on_demand_usd=0.0, spot_savings_usd=0.0)


def sdk_arn(service: str, action: str) -> str:
    """An AWS SDK integration without `.sync`: the step polls what it starts."""
    return f"arn:{Aws.PARTITION}:states:::aws-sdk:{service}:{action}"


def sdk_task(
    scope: Construct, id_: str, service: str, action: str, state: dict[str, Any], *, passes: list[str] | None
) -> sfn.CustomState:
    """A Task state calling `service`'s `action` (`state`: its other fields), cut off after SDK_TIMEOUT_SECONDS.

    `passes`: the errors it retries within the SDK budget (stacks/constructs/tasks.py); None for a call that
    is not simply made again (a submit without a client token: what follows it looks for its job).
    """
    task = sfn.CustomState(
        scope,
        id_,
        state_json={
            "Type": "Task",
            "Resource": sdk_arn(service, action),
            **state,
            "TimeoutSeconds": SDK_TIMEOUT_SECONDS,
        },
    )
    return retry(task, passes, SDK) if passes is not None else task


@dataclass(frozen=True)
class StepNames:
    """How a backend's states are named: the first backend's names, each of another's marked with its `label`."""

    label: str | None = None
    not_created_error: str = "TrainingJobNotCreated"
    succeeded_comment: str = "$.job holds the finished job"

    def __call__(self, name: str) -> str:
        if self.label is None:
            return name
        return f"{name[:-1]}, {self.label})" if name.endswith(")") else f"{name} ({self.label})"


Create = Callable[[sfn.Wait, sfn.IChainable], sfn.IChainable]
"""Builds a backend's create state(s): each goes on to the wait, or to `not_created` (with `$.error`) for good."""


class PolledJobStep:
    """The states of one backend's loop, built into `scope`; `start`, `succeeded` and `failed` are the step's."""

    def __init__(
        self,
        scope: Construct,
        *,
        parts: StepParts,
        names: StepNames,
        create: Create,
        progress: PlatformFunction,
        job: dict[str, Any],
        cleanup: PlatformFunction,
        replaces_jobs: bool = False,
        capacity_retries: int = 0,
        fallback: PlatformFunction | None = None,
    ) -> None:
        """`capacity_retries`: with `replaces_jobs`, how many new attempts may replace a job."""
        self._scope, self._notifier, self._names = scope, parts.notifier, names
        self._cleanup, self._fallback = cleanup, fallback
        self.start = sfn.Pass(
            scope,
            names("First attempt"),
            result=sfn.Result.from_object({"attempt": 1, "billed": NOTHING_BILLED.model_dump(), "polls": 0}),
            result_path=str(TRAIN),
            comment="No job billed yet: the poll of each finished job adds its cost to $.train.billed",
        )
        self.failed = sfn.Pass(scope, names("Training step failed"), comment="$.failure says why")
        self.succeeded = sfn.Pass(scope, names("Training step succeeded"), comment=names.succeeded_comment)
        # A new attempt's progress: nothing warned of yet, the first poll after the request's interval, this
        # execution's polls counted on.
        reset = sfn.Pass(
            scope,
            names("Reset progress"),
            parameters={
                "stale_warned": False,
                "poll_seconds": sfn.JsonPath.number_at(str(REQUEST.poll_seconds)),
                "polls": sfn.JsonPath.number_at(str(TRAIN.polls)),
            },
            result_path=str(JOB),
        )
        stop = self._stop_and_fail()
        wait = sfn.Wait(
            scope,
            names("Wait for training"),
            time=sfn.WaitTime.seconds_path(str(JOB.poll_seconds)),
            comment="Between polls: the progress handler says how long (lambdas/jobs/pacing.py)",
        )
        self.start.next(reset).next(create(wait, self._not_created()))
        # The progress handler's event: the request, the job it follows (`job`), its previous progress, the price,
        # and what the earlier attempts' jobs cost (it answers the run's cost so far, `run_cost`); the run's first
        # execution, and the polls an execution may make (it answers `hand_over` at the last).
        payload = {
            "request": obj(REQUEST),
            "execution": string(RUN.execution),
            "polls_per_execution": parts.pipeline.polls_per_execution,
            **job,
            "previous": obj(JOB),
            "hourly_usd": sfn.JsonPath.number_at(str(ESTIMATE.hourly_usd)),
            "billed": obj(TRAIN.billed),
        }
        check = invoke(scope, names(CHECK_PROGRESS), progress, payload, str(JOB), budget=POLLING)
        check.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        finished = self._finished(
            parts, wait, stop, reset, replaces_jobs=replaces_jobs, capacity_retries=capacity_retries
        )
        wait.next(check).next(finished)

    def _finished(
        self,
        parts: StepParts,
        wait: sfn.Wait,
        stop: sfn.IChainable,
        reset: sfn.IChainable,
        *,
        replaces_jobs: bool,
        capacity_retries: int,
    ) -> sfn.Choice:
        """What a poll's answer leads to: a new execution, a warning, the next poll, the end, or a new attempt."""
        finished = sfn.Choice(self._scope, self._names("Job finished?"))
        running = sfn.Condition.boolean_equals(str(JOB.finished), False)
        if parts.handover is not None:
            finished.when(
                sfn.Condition.boolean_equals(str(JOB.hand_over), True),
                parts.handover.way_out(self._scope, self._names, wait, stop),
            )
        if replaces_jobs:
            stale = self._stale_warning(stop)
            finished.when(
                sfn.Condition.and_(running, sfn.Condition.boolean_equals(str(JOB.warn_stale), True)), stale.next(wait)
            )
        finished.when(running, wait).when(
            sfn.Condition.string_equals(str(JOB.status), "Completed"),
            self._clean_up(self._names("Prune checkpoints"), self.succeeded),
        )
        if replaces_jobs:
            finished.when(
                sfn.Condition.and_(
                    sfn.Condition.boolean_equals(str(JOB.retry_on_new_nodes), True),
                    sfn.Condition.number_less_than(str(TRAIN.attempt), capacity_retries + 1),
                ),
                self._next_attempt(stop, reset),
            )
        job_failed = sfn.Pass(
            self._scope,
            self._names("Record job failure"),
            parameters={"error": string(JOB.error), "cause": string(JOB.failure_reason)},
            result_path=str(FAILURE),
        )
        finished.otherwise(job_failed.next(self._clean_up(self._names("Prune checkpoints (failed job)"), self.failed)))
        return finished

    def _not_created(self) -> sfn.IChainable:
        """A create that failed for good; it may have happened even so (a timeout): stop what the execution started."""
        record = sfn.Pass(
            self._scope,
            self._names("Record job not created"),
            parameters={"error": self._names.not_created_error, "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        record.next(self._clean_up(self._names("Stop the run's jobs (not created)"), self.failed))
        return record

    def _stop_and_fail(self) -> sfn.IChainable:
        """After an orchestration failure ($.error): stop the run's jobs, then fail the step with that error."""
        record = sfn.Pass(
            self._scope,
            self._names("Record orchestration failure"),
            parameters={"error": string(ERROR.Error), "cause": string(ERROR.Cause)},
            result_path=str(FAILURE),
        )
        return record.next(self._clean_up(self._names("Stop the run's jobs"), self.failed))

    def _stale_warning(self, stop: sfn.IChainable) -> sfn.TaskStateBase:
        stale = self._notifier.notify(
            self._scope,
            self._names("Warn stale checkpoints"),
            subject="Training run has not checkpointed recently",
            fields={
                "job": string(JOB.job_name),
                "checkpoint_age_minutes": string(JOB.checkpoint_age_minutes),
                "latest_checkpoint": obj(JOB.checkpoint),
            },
        )
        stale.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        return stale

    def _next_attempt(self, stop: sfn.IChainable, reset: sfn.IChainable) -> sfn.IChainable:
        """A new job, with a new name, on fresh instances, resuming from the run's checkpoints; the run is told why."""
        next_attempt = sfn.Pass(
            self._scope,
            self._names("Next attempt"),
            comment="Insufficient capacity, a failed pre-flight check, a straggling host or a hang: a new job, with "
            "a new name, on fresh instances, resuming from the run's checkpoints",
            parameters={
                "attempt": sfn.JsonPath.math_add(sfn.JsonPath.number_at(str(TRAIN.attempt)), 1),
                "retried_after": {"error": string(JOB.error), "cause": string(JOB.failure_reason)},
                # The replaced job is billed too: the run's cost so far goes on with the new attempt.
                "billed": obj(JOB.run_cost),
                "polls": sfn.JsonPath.number_at(str(JOB.polls)),
            },
            result_path=str(TRAIN),
        )
        retrying = self._notifier.notify(
            self._scope,
            self._names(RETRY_TOLD),
            subject="Training job replaced: retrying on fresh instances",
            fields={
                "failed_job": string(JOB.job_name),
                "error": string(TRAIN.retried_after.error),
                "reason": string(TRAIN.retried_after.cause),
                "attempt": sfn.JsonPath.number_at(str(TRAIN.attempt)),
                "next_cluster": string(REQUEST.cluster),
            },
        )
        retrying.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        if self._fallback is None:
            next_attempt.next(retrying)
        else:
            next_attempt.next(self._next_cluster(stop, retrying))
        retrying.next(reset)
        return next_attempt

    def _next_cluster(self, stop: sfn.IChainable, then: sfn.IChainable) -> sfn.IChainable:
        """After insufficient capacity, while the request has a fallback cluster left: the new attempt runs on
        it (the request and the poll's price are the handler's); any other cause keeps the cluster."""
        assert self._fallback is not None
        choose = invoke(
            self._scope,
            self._names("Choose the next cluster"),
            self._fallback,
            {"request": obj(REQUEST), "estimate": obj(ESTIMATE)},
            str(NEXT_CLUSTER),
        )
        choose.add_catch(stop, errors=["States.ALL"], result_path=str(ERROR))
        use = sfn.Pass(
            self._scope,
            self._names("Use the next cluster"),
            input_path=str(NEXT_CLUSTER.request),
            result_path=str(REQUEST),
        )
        price = sfn.Pass(
            self._scope,
            self._names("Price the next cluster"),
            input_path=str(NEXT_CLUSTER.hourly_usd),
            result_path=str(ESTIMATE.hourly_usd),
        )
        # The answer's request is a second copy of the run's: not kept in the state for the rest of the run.
        forget = sfn.Pass(
            self._scope,
            self._names("Forget the answer"),
            result=sfn.Result.from_object({}),
            result_path=str(NEXT_CLUSTER),
        )
        choose.next(use).next(price).next(forget).next(then)
        moves = sfn.Condition.and_(
            sfn.Condition.string_equals(str(TRAIN.retried_after.error), INSUFFICIENT_CAPACITY),
            sfn.Condition.boolean_equals(str(REQUEST.fallback_left), True),
        )
        return sfn.Choice(self._scope, self._names("Fall back to another cluster?")).when(moves, choose).otherwise(then)

    def _clean_up(self, id_: str, then: sfn.IChainable) -> sfn.IChainable:
        """Stop this execution's running jobs and prune the run's checkpoints, then go on to `then`."""
        task = invoke(
            self._scope,
            id_,
            self._cleanup,
            # The run's first execution: its jobs are tagged with it, whichever execution follows them now.
            {"execution": string(RUN.execution), "job_name_base": string(REQUEST.job_name_base)},
            str(CLEANUP),
        )
        task.add_catch(then, errors=["States.ALL"], result_path=str(CLEANUP))
        return task.next(then)


def list_runs(bucket_arn: str, sid: str) -> iam.PolicyStatement:
    """List the keys under every run's prefix of a bucket (names and dates; reading an object is another grant)."""
    return iam.PolicyStatement(
        sid=sid, actions=["s3:ListBucket"], resources=[bucket_arn], conditions={"StringLike": {"s3:prefix": [ANY_RUN]}}
    )


def grant_checkpoint_ledger(function: PlatformFunction, buckets: Buckets) -> None:
    """What a progress handler needs to record a run's checkpoints in its ledger (contract/ledger.py): list the
    checkpoints and read their manifests, list the ledger, read and write (once) its records."""
    manifests = f"{buckets.checkpoints.bucket_arn}/{ANY_MANIFEST}"
    records = f"{buckets.artifacts.bucket_arn}/{ANY_LEDGER_RECORD}"
    function.function.add_to_role_policy(list_runs(buckets.checkpoints.bucket_arn, "ListRunCheckpoints"))
    function.function.add_to_role_policy(list_runs(buckets.artifacts.bucket_arn, "ListRunArtifacts"))
    function.function.add_to_role_policy(
        iam.PolicyStatement(sid="ReadCheckpointManifests", actions=["s3:GetObject"], resources=[manifests])
    )
    function.function.add_to_role_policy(
        iam.PolicyStatement(sid="RecordCheckpoints", actions=["s3:GetObject", "s3:PutObject"], resources=[records])
    )
    buckets.key.grant(function.function, "kms:GenerateDataKey", "kms:Decrypt")
    for resource, reason in {
        manifests: "Reads the manifests of the polled run's checkpoints; run ids are per execution.",
        records: "Records the polled run's complete checkpoints in its ledger, once each (If-None-Match).",
    }.items():
        acknowledge_wildcard(function.role, resource, reason)


def grant_goodput_ledger(function: PlatformFunction, buckets: Buckets) -> None:
    """What a progress handler needs to write a finished job's goodput ledger (contract/goodput.py): read the
    trainer's progress records in the run's checkpoints, and write (once) the ledger into the run's lineage.
    Listing the records is grant_checkpoint_ledger's ListRunCheckpoints."""
    progress = f"{buckets.checkpoints.bucket_arn}/{ANY_PROGRESS_RECORD}"
    ledgers = f"{buckets.artifacts.bucket_arn}/{ANY_GOODPUT_RECORD}"
    function.function.add_to_role_policy(
        iam.PolicyStatement(sid="ReadProgressRecords", actions=["s3:GetObject"], resources=[progress])
    )
    function.function.add_to_role_policy(
        iam.PolicyStatement(sid="RecordGoodput", actions=["s3:GetObject", "s3:PutObject"], resources=[ledgers])
    )
    for resource, reason in {
        progress: "Reads the polled run's progress records, which its trainer writes; run ids are per execution.",
        ledgers: "Writes a finished job's goodput ledger into its run's lineage, once (If-None-Match).",
    }.items():
        acknowledge_wildcard(function.role, resource, reason)


def monitor_function(
    parts: StepParts,
    name: str,
    *,
    handler: str,
    description: str,
    environment: Callable[..., HandlerEnvironment] = MonitorEnvironment,
    timeout: Duration | None = None,
) -> PlatformFunction:
    """A backend's progress handler (the loop's `progress`), let record the run's checkpoints and write its jobs'
    goodput ledgers. `environment` makes the handler's environment from `MonitorEnvironment`'s fields (where the
    run's checkpoints and ledgers are, and when a checkpoint is stale). The backend grants it what following its
    jobs takes."""
    buckets = parts.buckets
    variables = environment(
        checkpoints_bucket=buckets.checkpoints.bucket_name,
        artifacts_bucket=buckets.artifacts.bucket_name,
        checkpoint_stale_minutes=parts.pipeline.checkpoint_stale_minutes,
    ).variables()
    monitor = parts.handlers.function(name, handler, description, variables, timeout=timeout)
    grant_checkpoint_ledger(monitor, buckets)
    grant_goodput_ledger(monitor, buckets)
    return monitor


def batch_job_loop(
    scope: Construct,
    parts: StepParts,
    *,
    names: StepNames,
    submit: Create,
    monitor: PlatformFunction,
    cleanup: PlatformFunction,
) -> PolledJobStep:
    """The loop of a job AWS Batch runs (a multi-node parallel job, a team's service job): submitted by `submit`,
    followed by its ARN and name (`$.train.job`), replaced by a new attempt when it waited too long for capacity
    (up to the settings' `capacity_retries` times)."""
    return PolledJobStep(
        scope,
        parts=parts,
        names=names,
        create=submit,
        progress=monitor,
        job={"job": obj(TRAIN.job)},
        cleanup=cleanup,
        replaces_jobs=True,
        capacity_retries=parts.pipeline.capacity_retries,
    )


def cleanup_function(
    parts: StepParts,
    name: str,
    *,
    handler: str,
    description: str,
    environment: Callable[..., CleanupEnvironment] = CleanupEnvironment,
) -> tuple[PlatformFunction, sqs.Queue, str]:
    """A backend's cleanup handler, its dead-letter queue (`<name>DeadLetters`) and the pattern of the checkpoints it
    may prune.

    `environment` makes the handler's environment from `CleanupEnvironment`'s fields (the checkpoints bucket it
    prunes and the artifacts bucket of the runs' ledgers). The backend grants it what stopping its jobs takes, and
    acknowledges the wildcards.
    """
    handlers, buckets = parts.handlers, parts.buckets
    # EventBridge invokes the cleanup asynchronously: what fails there for good is kept here.
    queue = sqs.Queue(
        handlers.stack,
        f"{name}DeadLetters",
        encryption=sqs.QueueEncryption.KMS,
        encryption_master_key=buckets.key,
        enforce_ssl=True,
        retention_period=Duration.days(14),
    )
    cleanup = handlers.function(
        name,
        handler,
        description,
        environment(
            checkpoints_bucket=buckets.checkpoints.bucket_name, artifacts_bucket=buckets.artifacts.bucket_name
        ).variables(),
        timeout=Duration.minutes(5),
        dead_letter_queue=queue,
        role_path=CHECKPOINT_WRITERS_PATH,  # it prunes the run's superseded checkpoints
    )
    # Lambda sends failed events to the dead-letter queue with the function's role.
    buckets.key.grant(cleanup.function, "kms:GenerateDataKey", "kms:Decrypt")
    checkpoints = buckets.checkpoints.bucket_arn
    cleanup.function.add_to_role_policy(list_runs(checkpoints, "ListRunCheckpoints"))
    superseded = f"{checkpoints}/{ANY_CHECKPOINT}"
    cleanup.function.add_to_role_policy(
        iam.PolicyStatement(sid="PruneRunCheckpoints", actions=["s3:DeleteObject"], resources=[superseded])
    )
    # Which checkpoint the run may resume from is read from its manifest and its ledger record (contract/ledger.py).
    manifests = f"{checkpoints}/{ANY_MANIFEST}"
    records = f"{buckets.artifacts.bucket_arn}/{ANY_LEDGER_RECORD}"
    cleanup.function.add_to_role_policy(list_runs(buckets.artifacts.bucket_arn, "ListRunLedgers"))
    cleanup.function.add_to_role_policy(
        iam.PolicyStatement(sid="ReadCheckpointManifests", actions=["s3:GetObject"], resources=[manifests])
    )
    cleanup.function.add_to_role_policy(
        iam.PolicyStatement(sid="ReadLedgerRecords", actions=["s3:GetObject"], resources=[records])
    )
    if parts.handover is not None:
        parts.handover.cleans_up(cleanup)
    acknowledge_wildcard(cleanup.role, manifests, "Reads the manifests of the ended run's checkpoints to judge them.")
    acknowledge_wildcard(cleanup.role, records, "Reads the ended run's ledger records to judge its checkpoints.")
    return cleanup, queue, superseded


def watch_ended_executions(
    scope: Construct,
    id_: str,
    *,
    description: str,
    state_machine: sfn.StateMachine,
    cleanup: PlatformFunction,
    dead_letters: sqs.IQueue,
) -> events.Rule:
    """Invokes `cleanup` for an execution that was aborted, timed out or failed, which no state of the loop can
    act on (a rule at the scope's stack): the backends' cleanups, and the handler that tells a run's recipients."""
    return events.Rule(
        Stack.of(scope),
        id_,
        description=description,
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
                cleanup.function, dead_letter_queue=dead_letters, retry_attempts=8, max_event_age=Duration.hours(6)
            )
        ],
    )

"""Task states the pipeline's constructs share: a handler invocation that rides through transient faults.

One retry policy for every handler: what passes (the handler's `TransientError`, Lambda's throttling
and service errors, a function that timed out or ran out of memory) is retried with capped, jittered
backoff for a bounded time, the handler's `RetryBudget`; anything else (access denied, a bad request,
a bug) is not retried, and the state's Catch ends the run at once with its cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from lambdas.shared.errors import SERVICE_ERRORS, TransientError
from stacks.constructs.function import PlatformFunction

LAMBDA_TASK_TIMEOUT = Duration.seconds(60)
# The errors that pass. A handler raises TransientError for its own AWS calls (lambdas/shared/errors.py);
# Lambda.Unknown is a function that timed out or ran out of memory (Sandbox.Timedout in newer runtimes);
# States.Timeout is the task's own timeout; Lambda.TooManyRequestsException is reserved concurrency (small:
# a burst of executions waits its turn); the rest are Lambda's service errors.
TRANSIENT = [
    TransientError.__name__,
    "Lambda.Unknown",
    "Sandbox.Timedout",
    "States.Timeout",
    *SERVICE_ERRORS["lambda"].retried(),
]


# A task state, built by a task construct or written as state JSON (a CustomState).
Retrying = TypeVar("Retrying", sfn.TaskStateBase, sfn.CustomState)


@dataclass(frozen=True)
class RetryBudget:
    """How long a handler's transient errors are retried: `attempts` retries, the n-th after a random wait
    (FULL jitter) of up to min(interval * backoff**(n-1), max_delay) seconds."""

    interval_seconds: int
    backoff_rate: float
    max_delay_seconds: int
    attempts: int

    def caps(self) -> list[float]:
        """The longest wait before each retry."""
        rate, interval = self.backoff_rate, self.interval_seconds
        return [min(interval * rate**n, self.max_delay_seconds) for n in range(self.attempts)]

    def longest_seconds(self) -> float:
        """The most a run waits on one call's transient errors before it gives up (every wait at its cap)."""
        return sum(self.caps())

    def expected_seconds(self) -> float:
        """What it waits on average (a FULL-jittered wait averages half its cap)."""
        return self.longest_seconds() / 2


# A `.waitForTaskToken` handler (an approval gate's request) passes the same errors, except the task's own
# timeout: there it is the approvers' time to decide running out, which the gate's Catch treats as a rejection.
GATE_TRANSIENT = [error for error in TRANSIENT if error != "States.Timeout"]
# What passes in an AWS SDK integration: the service's throttling and internal errors (lambdas/shared/errors.py
# SERVICE_ERRORS, as Step Functions names them), and the task's own timeout (the call may have been made: a create
# retried finds its job by name and adopts it, see stacks/pipeline/polled_job.py). A bad request or a missing
# resource (Batch's ClientException) is not retried: the run fails at once, naming it.
SAGEMAKER_TRANSIENT = [*SERVICE_ERRORS["sagemaker"].retried(), "States.Timeout"]
BATCH_TRANSIENT = [*SERVICE_ERRORS["batch"].retried(), "States.Timeout"]
# A hand-over's StartExecution, made again after a timeout, is answered with the execution it started.
HANDOVER_TRANSIENT = [*SERVICE_ERRORS["states"].retried(), "States.Timeout"]
# A notification: States.TaskFailed matches every error of the publish (throttling, the topic key's KMS
# throttling, and a lasting error too, which reaches the state's Catch after the retries), and a publish that
# timed out is sent again (an e-mail may come twice).
NOTIFY_TRANSIENT = ["States.TaskFailed", "States.Timeout"]


# The polling handlers (Check progress, every backend): ~30 min on average (at most ~55 min), while the job
# runs on; what outlasts it stops the run's jobs.
POLLING = RetryBudget(interval_seconds=5, backoff_rate=2, max_delay_seconds=300, attempts=16)
# Every other handler (validate, estimate, evaluate, register, cleanup, approvals): ~2 min (at most ~4 min).
SHORT = RetryBudget(interval_seconds=2, backoff_rate=2, max_delay_seconds=60, attempts=8)
# AWS SDK calls and notifications: ~1.3 min on average (at most ~2.6 min).
SDK = RetryBudget(interval_seconds=5, backoff_rate=2, max_delay_seconds=120, attempts=5)


def retry(state: Retrying, errors: list[str], budget: RetryBudget) -> Retrying:
    """`state` retries `errors` within `budget`, each wait FULL-jittered; returns `state`."""
    state.add_retry(
        errors=errors,
        interval=Duration.seconds(budget.interval_seconds),
        backoff_rate=budget.backoff_rate,
        max_delay=Duration.seconds(budget.max_delay_seconds),
        max_attempts=budget.attempts,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return state


def invoke(
    scope: Construct,
    id_: str,
    function: PlatformFunction,
    payload: dict[str, Any],
    result_path: str,
    *,
    budget: RetryBudget = SHORT,
) -> tasks.LambdaInvoke:
    """A platform handler as a task: its transient errors are retried within `budget`, the others are not."""
    timeout = function.function.timeout or LAMBDA_TASK_TIMEOUT
    task = tasks.LambdaInvoke(
        scope,
        id_,
        lambda_function=function.function,
        payload=sfn.TaskInput.from_object(payload),
        payload_response_only=True,
        result_path=result_path,
        task_timeout=sfn.Timeout.duration(Duration.seconds(timeout.to_seconds() + 30)),
        retry_on_service_exceptions=False,
    )
    retry(task, TRANSIENT, budget)
    return task

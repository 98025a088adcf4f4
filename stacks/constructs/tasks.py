"""Task states the pipeline's constructs share: a handler invocation that survives Lambda's transient errors."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from stacks.constructs.function import PlatformFunction

LAMBDA_TASK_TIMEOUT = Duration.seconds(60)
# Reserved concurrency is small (5): a burst of executions is throttled, and waits its turn.
THROTTLED = ["Lambda.TooManyRequestsException"]


def invoke(
    scope: Construct, id_: str, function: PlatformFunction, payload: dict[str, Any], result_path: str
) -> tasks.LambdaInvoke:
    """A platform handler as a task: Lambda's service errors and throttling are retried with backoff."""
    timeout = function.function.timeout or LAMBDA_TASK_TIMEOUT
    task = tasks.LambdaInvoke(
        scope,
        id_,
        lambda_function=function.function,
        payload=sfn.TaskInput.from_object(payload),
        payload_response_only=True,
        result_path=result_path,
        task_timeout=sfn.Timeout.duration(Duration.seconds(timeout.to_seconds() + 30)),
        retry_on_service_exceptions=True,
    )
    task.add_retry(
        errors=THROTTLED,
        interval=Duration.seconds(2),
        backoff_rate=2,
        max_attempts=6,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task

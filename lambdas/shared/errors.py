"""Errors the state machine catches by name (Lambda reports the exception class as `errorType`), and how each
service's errors are named and classified where the state machine calls it directly (`SERVICE_ERRORS`).

Every handler entry point is wrapped in `classified`: an error that passes (throttling, a 5xx answer,
a timeout, a lost connection) leaves the handler as `TransientError`, which the state machine retries
with backoff (stacks/constructs/tasks.py); any other error leaves as it was raised and ends the run at
once with its cause. What counts as passing is botocore's own standard retry rule, the one its clients
apply to each call before giving up: an error that reaches the handler outlived those retries.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from botocore.exceptions import ClientError
from botocore.retries.standard import (
    OrRetryChecker,
    RetryContext,
    ThrottledRetryableChecker,
    TransientRetryableChecker,
)

P = ParamSpec("P")
R = TypeVar("R")

# Throttling codes (Throttling*, TooManyRequests, RequestLimitExceeded, SlowDown...), request timeouts,
# 5xx answers and connection errors (endpoint unreachable, connect or read timeout, connection closed).
_PASSING = OrRetryChecker([ThrottledRetryableChecker(), TransientRetryableChecker()])
# 429 without a throttling code, and 5xx (botocore's transient checker reads them from the raw response).
_PASSING_STATUS = frozenset({429, 500, 502, 503, 504})


REJECTED = "The training request cannot run:"


@dataclass(frozen=True)
class Problem:
    """One reason an input cannot run: the field (dotted path; "" for the input as a whole), its value, the fix."""

    field: str
    value: Any
    message: str

    def __str__(self) -> str:
        # A check's message often begins with its field already ("run_name 'X': use ..."): not said twice.
        if not self.field or self.message.startswith(self.field):
            return self.message
        return f"{self.field}: {self.message}"


class InvalidRequest(ValueError):  # noqa: N818 - the name is the error the state machine and users see
    """The execution input cannot be run; the message lists every problem and how to fix it.

    `problems` holds the same list structured (field, value, message), for callers that print a table.
    """

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [Problem("", None, message)]

    @classmethod
    def listing(cls, problems: Sequence[Problem]) -> InvalidRequest:
        """The error of these problems, its message one line each (the state machine's Fail cause shows it)."""
        return cls(REJECTED + "\n" + "\n".join(f"  - {p}" for p in problems), problems)


class TransientError(Exception):
    """An AWS call failed in a way that passes (throttling, 5xx, timeout, connection): try again later."""


def is_transient(error: BaseException) -> bool:
    """Whether `error` (raised by a boto3 call, or Python's own socket timeout) passes if tried again later."""
    if isinstance(error, TimeoutError | ConnectionError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        context = RetryContext(attempt_number=1, parsed_response=error.response)
        return status in _PASSING_STATUS or bool(_PASSING.is_retryable(context))
    return bool(_PASSING.is_retryable(RetryContext(attempt_number=1, caught_exception=error)))


def transient(error: BaseException) -> TransientError:
    """`error` as the state machine retries it; the message keeps what failed and how."""
    return TransientError(f"{type(error).__name__}: {error}")


def classified(handler: Callable[P, R]) -> Callable[P, R]:
    """A handler entry point whose passing errors leave it as `TransientError` (the cause chained)."""

    @functools.wraps(handler)
    def classify(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return handler(*args, **kwargs)
        except TransientError:
            raise
        except Exception as error:
            if is_transient(error):
                raise transient(error) from error
            raise

    classify.__dict__["classified"] = True
    return classify


@dataclass(frozen=True)
class ServiceErrors:
    """One service's errors as Step Functions names them in a task that calls it (`<prefix>.<error>`): which pass
    (throttling, faults in the service) and are retried, and which last (a bad request, a missing resource, a
    limit) and end the call at once.

    Step Functions names an error the service's API model declares by its code, with "Exception" appended where the
    code lacks it (`SageMaker.ResourceLimitExceededException`); an error the model does not declare, which is how
    most services report throttling and internal faults, by the service's generic exception (`generic`,
    `Batch.AWSBatchException` for Batch's 429 TooManyRequestsException).
    """

    prefix: str
    """The service's name in Step Functions' error names."""
    generic: str
    """The name of an error the model does not declare."""
    passing: tuple[str, ...]
    """The names retried, without the prefix."""
    lasting: tuple[str, ...]
    """The declared errors that never pass, without the prefix: not retried."""
    source: str
    """Where the service documents its errors."""

    def name(self, error: str) -> str:
        return f"{self.prefix}.{error}"

    def retried(self) -> list[str]:
        return [self.name(error) for error in self.passing]

    def not_retried(self) -> list[str]:
        return [self.name(error) for error in self.lasting]

    def named(self, code: str, *, declared: bool) -> str:
        """What Step Functions calls an error of this `code` (`declared`: in the service's model)."""
        if not declared:
            return self.name(self.generic)
        return self.name(code if code.endswith("Exception") else f"{code}Exception")


SERVICE_ERRORS: dict[str, ServiceErrors] = {
    # SageMaker declares few errors; throttling (ThrottlingException), faults and ValidationException are
    # undeclared, hence all AmazonSageMakerException: a validation error is retried within the SDK budget too
    # (Validate checks every request against SageMaker's model before anything is created).
    "sagemaker": ServiceErrors(
        prefix="SageMaker",
        generic="AmazonSageMakerException",
        passing=("AmazonSageMakerException", "ThrottlingException"),
        lasting=("ResourceLimitExceededException", "ResourceNotFoundException", "ResourceInUseException"),
        source="https://docs.aws.amazon.com/sagemaker/latest/APIReference/CommonErrors.html",
    ),
    # Batch declares ClientException (HTTP 400: a bad request, a missing queue, share or job, access denied) and
    # ServerException (HTTP 500); throttling (HTTP 429, TooManyRequestsException) is undeclared.
    "batch": ServiceErrors(
        prefix="Batch",
        generic="AWSBatchException",
        passing=("AWSBatchException", "TooManyRequestsException", "ServerException"),
        lasting=("ClientException",),
        source="https://docs.aws.amazon.com/batch/latest/APIReference/CommonErrors.html",
    ),
    # A run handed over to a new execution (states:startExecution, stacks/pipeline/polled_job.py). Starting an
    # execution again under its name with the same input is answered with that execution while it runs; otherwise
    # (another input, or it has ended) ExecutionAlreadyExists, which never passes. ExecutionLimitExceeded (too many
    # open executions) passes as others end; throttling and internal faults are undeclared.
    "states": ServiceErrors(
        prefix="StepFunctions",
        generic="AWSStepFunctionsException",
        passing=("AWSStepFunctionsException", "ExecutionLimitExceededException"),
        lasting=(
            "ExecutionAlreadyExistsException",
            "InvalidArnException",
            "InvalidExecutionInputException",
            "InvalidNameException",
            "StateMachineDoesNotExistException",
            "StateMachineDeletingException",
            "ValidationException",
        ),
        source="https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html",
    ),
    "lambda": ServiceErrors(
        prefix="Lambda",
        generic="AWSLambdaException",
        passing=(
            "TooManyRequestsException",
            "ServiceException",
            "AWSLambdaException",
            "SdkClientException",
            "ClientExecutionTimeoutException",
        ),
        lasting=("ResourceNotFoundException", "InvalidParameterValueException", "InvalidRequestContentException"),
        source="https://docs.aws.amazon.com/lambda/latest/api/API_Invoke.html#API_Invoke_Errors",
    ),
}
"""The services the state machine calls by task: its SDK tasks' (SageMaker; Batch, the teams' queue's too), its
hand-over's (Step Functions) and its handlers' (Lambda). A notification retries every error of its publish
(stacks/constructs/tasks.py); what the handlers call is classified by botocore's rule (`is_transient`)."""


def service_errors_table() -> str:
    """SERVICE_ERRORS as a Markdown table: what the state machine retries of each service, and what it does not."""
    rows = [
        "| Service | Retried: throttling, faults in the service | Not retried: the request or the resource | Errors |",
        "| --- | --- | --- | --- |",
    ]
    for errors in SERVICE_ERRORS.values():
        retried = ", ".join(f"`{name}`" for name in errors.retried())
        lasting = ", ".join(f"`{name}`" for name in errors.not_retried())
        rows.append(f"| {errors.prefix} | {retried} | {lasting} | [{errors.prefix}]({errors.source}) |")
    return "\n".join(rows)

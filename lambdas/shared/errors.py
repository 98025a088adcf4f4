"""Errors the state machine catches by name (Lambda reports the exception class as `errorType`).

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

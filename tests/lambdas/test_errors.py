"""Handler errors, classified in one place: what passes leaves a handler as TransientError, the rest as raised."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from pydantic import BaseModel

from lambdas.shared.errors import TransientError, classified, is_transient


def _client_error(code: str, status: int = 400) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": "what the service said"}, "ResponseMetadata": {}}
    response["ResponseMetadata"]["HTTPStatusCode"] = status
    return ClientError(response, "DescribeTrainingJob")


class _Event(BaseModel):
    job_name: str


PASSING = [
    _client_error("ThrottlingException"),
    _client_error("Throttling"),
    _client_error("TooManyRequestsException", 429),
    _client_error("RequestLimitExceeded"),
    _client_error("ProvisionedThroughputExceededException"),
    _client_error("SlowDown", 503),
    _client_error("InternalError", 500),
    _client_error("InternalFailure", 500),
    _client_error("ServiceUnavailable", 503),
    _client_error("ServiceUnavailableException", 503),
    _client_error("SomethingNew", 502),  # any 5xx answer, whatever its code
    _client_error("SomethingNew", 429),  # a throttled answer without a throttling code
    _client_error("RequestTimeout", 400),
    EndpointConnectionError(endpoint_url="https://api.sagemaker.eu-west-1.amazonaws.com"),
    ConnectTimeoutError(endpoint_url="https://s3.amazonaws.com"),
    ReadTimeoutError(endpoint_url="https://s3.amazonaws.com"),
    ConnectionClosedError(endpoint_url="https://s3.amazonaws.com"),
    TimeoutError("timed out"),
    ConnectionResetError("reset by peer"),
]
LASTING = [
    _client_error("AccessDeniedException"),
    _client_error("AccessDenied", 403),
    _client_error("ValidationException"),
    _client_error("ResourceNotFound"),
    _client_error("ResourceLimitExceeded"),
    _client_error("ResourceInUse"),
    NoCredentialsError(),
    ParamValidationError(report="Missing required parameter"),
    KeyError("job_name"),
    ValueError("bad value"),
]


@pytest.mark.parametrize("error", PASSING, ids=repr)
def test_what_passes_is_transient(error: Exception) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", LASTING, ids=repr)
def test_what_lasts_is_not(error: Exception) -> None:
    assert not is_transient(error)


def _handler_raising(error: Exception) -> Any:
    @classified
    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        """A handler's docstring."""
        _Event.model_validate(event)
        raise error

    return handler


def test_a_passing_error_leaves_the_handler_as_transient_error_naming_the_call_and_code() -> None:
    throttled = _client_error("ThrottlingException")
    with pytest.raises(TransientError) as raised:
        _handler_raising(throttled)({"job_name": "j"}, None)
    assert raised.value.__cause__ is throttled
    assert str(raised.value) == (
        "ClientError: An error occurred (ThrottlingException) when calling the DescribeTrainingJob operation: "
        "what the service said"
    )


@pytest.mark.parametrize("error", [*LASTING, TransientError("already classified")], ids=repr)
def test_any_other_error_leaves_the_handler_as_it_was_raised(error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        _handler_raising(error)({"job_name": "j"}, None)
    assert raised.value is error


def test_a_bad_event_is_not_transient() -> None:
    with pytest.raises(ValueError, match="job_name"):
        _handler_raising(TimeoutError())({}, None)


def test_the_wrapper_keeps_the_handler_and_its_answer() -> None:
    @classified
    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        """A handler's docstring."""
        return {"seen": event}

    assert handler({"a": 1}, None) == {"seen": {"a": 1}}
    assert handler.__doc__ == "A handler's docstring." and handler.__name__ == "handler"

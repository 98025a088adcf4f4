"""TellEndedRun: how an execution ended, in words, to the run's recipients, when none of the run's states told them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lambdas.ended.handler import UNTOLD, EndedStatus, tell, untold
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

MACHINE = "arn:aws:states:us-east-1:123456789012:execution:training-platform-dev"
REQUEST = resolve(
    {
        "run_name": "ended",
        "model": "tiny",
        "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
        "instance_type": "ml.g5.2xlarge",
        "max_runtime_hours": 1,
        "notify": [LIMITS.run_emails[0]],
    },
    execution_name="e",
    limits=LIMITS,
)


def _ended(status: str, error: str | None = None, cause: str | None = None) -> EndedStatus:
    return EndedStatus(executionArn=f"{MACHINE}:run-1", name="run-1", status=status, error=error, cause=cause)


@pytest.mark.parametrize(
    ("ended", "words"),
    [
        (_ended("ABORTED", "StoppedByUser", "wrong dataset"), "stopped: wrong dataset (StoppedByUser)"),
        (_ended("ABORTED"), "stopped: no reason given"),
        (_ended("TIMED_OUT"), "the execution reached the state machine's time limit before the run ended"),
        (
            _ended("FAILED", "States.Runtime", "The execution reached the maximum number of history events (25000)."),
            "the execution reached Step Functions' limit of 25,000 history events (States.Runtime: The execution "
            "reached the maximum number of history events (25000).)",
        ),
        (
            _ended("FAILED", "States.DataLimitExceeded", "The state output exceeded 262144 bytes."),
            "Step Functions ended the execution (States.DataLimitExceeded): The state output exceeded 262144 bytes.",
        ),
        (
            _ended("FAILED", "NothingToContinueError", "run-0 has no checkpoint"),
            f"{UNTOLD['NothingToContinueError']}: run-0 has no checkpoint",
        ),
    ],
)
def test_every_end_no_state_told_is_said_in_words(ended: EndedStatus, words: str) -> None:
    assert untold(ended) == words


@pytest.mark.parametrize("error", ["TrainingJobNotCreated", "QualityBelowThreshold", "InvalidRequest"])
def test_an_end_the_runs_states_told_is_not_told_again(error: str) -> None:
    assert untold(_ended("FAILED", error, "told by the state machine")) is None


class _Sfn:
    def __init__(self, histories: dict[str, list[dict[str, Any]]], inputs: dict[str, dict[str, Any]]) -> None:
        self.histories, self.inputs = histories, inputs

    def get_paginator(self, _operation: str) -> Any:
        return self

    def paginate(self, *, executionArn: str) -> list[dict[str, Any]]:  # noqa: N803 (boto3's name)
        return [{"events": self.histories.get(executionArn, [])}]

    def describe_execution(self, *, executionArn: str) -> dict[str, Any]:  # noqa: N803
        return {"input": json.dumps(self.inputs.get(executionArn, {}))}


class _Sns:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, **message: Any) -> None:
        self.published.append(message)


def _validated(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "TaskStateExited", "stateExitedEventDetails": {"output": json.dumps({"request": request})}}]


def test_a_run_out_of_history_is_told_to_the_recipients_its_validated_request_names() -> None:
    arn = f"{MACHINE}:run-1"
    sfn = _Sfn({arn: _validated(REQUEST)}, {})
    sns = _Sns()
    ended = EndedStatus(
        executionArn=arn,
        name="run-1",
        status="FAILED",
        error="States.Runtime",
        cause="The execution reached the maximum number of history events (25000).",
    )
    told = tell(ended, sfn=sfn, sns=sns, topic="arn:aws:sns:us-east-1:123456789012:runs")
    assert told is not None and told["run_name"] == "ended"
    assert told["reason"].startswith("the execution reached Step Functions' limit of 25,000 history events")
    (published,) = sns.published
    assert published["Subject"] == "Training run ended: failed"
    assert json.loads(published["MessageAttributes"]["recipients"]["StringValue"]) == [LIMITS.run_emails[0]]
    assert tell(_ended("FAILED", "QualityBelowThreshold"), sfn=sfn, sns=sns, topic="t") is None
    assert len(sns.published) == 1


def test_a_run_that_ended_before_validate_resolved_it_has_no_recipients_to_tell() -> None:
    sns = _Sns()
    assert tell(_ended("ABORTED", "StoppedByUser", "oops"), sfn=_Sfn({}, {}), sns=sns, topic="t") is None
    assert sns.published == []

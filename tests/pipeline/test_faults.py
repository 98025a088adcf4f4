"""Transient faults never end a run: every backend's progress handler rides through a burst of them, within
its retry budget; a fault that lasts ends the run at once, naming its cause, after stopping the job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localrun.backends.scripted import Poll
from stacks.constructs.tasks import POLLING, SHORT
from tests.conftest import APPROVER
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_batch import BatchPipeline, batch_factory  # noqa: F401 - the fixture
from tests.pipeline.test_tuning import LOSSES, _trial, tuning_input

# Longer than the other handlers' whole budget: only the polling budget rides it through.
BURST = ["ThrottlingException", "InternalFailure", "ServiceUnavailable"] * 3 + ["ThrottlingException"]
assert SHORT.attempts < len(BURST) < POLLING.attempts


def _calls(pipeline: Pipeline, function: str) -> list[str | None]:
    """The errors of the function's invocations, in order (None: it answered)."""
    name = pipeline.local.functions.named(function).name
    return [call.error for call in pipeline.local.lambda_calls if call.function == name]


def _retried_within(pipeline: Pipeline, retries: int) -> None:
    """`retries` retries, each waiting no longer than the polling budget allows its place in the burst."""
    waits = pipeline.local.clock.retries
    assert len(waits) == retries, waits
    assert all(0 <= wait <= cap for wait, cap in zip(waits, POLLING.caps(), strict=False)), waits


def _promote(pipeline: Pipeline, arn: str) -> dict[str, Any]:
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    return pipeline.finish(arn)


def test_a_burst_of_failing_calls_in_the_monitor_is_ridden_through(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll(), Poll(), COMPLETED]])
    pipeline.local.faults.api_errors["Monitor"] = list(BURST)
    arn = pipeline.start(pipeline.input())
    described = _promote(pipeline, arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert pipeline.training.stopped_names == []
    assert _calls(pipeline, "Monitor")[: len(BURST) + 1] == ["TransientError"] * len(BURST) + [None]
    _retried_within(pipeline, len(BURST))
    assert "Record orchestration failure" not in pipeline.local.states_entered(arn)


def test_a_monitor_that_times_out_is_invoked_again(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll(), COMPLETED]])
    pipeline.local.faults.timeouts["Monitor"] = 3  # Lambda.Unknown: out of time (or memory), three times
    arn = pipeline.start(pipeline.input())
    described = _promote(pipeline, arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert pipeline.training.stopped_names == []
    failed = [
        e["lambdaFunctionFailedEventDetails"]
        for e in pipeline.local.history(arn)
        if e["type"] == "LambdaFunctionFailed"
    ]
    assert [f["error"] for f in failed] == ["Lambda.Unknown"] * 3
    assert all("Task timed out after" in f["cause"] for f in failed), failed
    _retried_within(pipeline, 3)


def test_a_fault_that_outlasts_the_polling_budget_stops_the_job_and_names_it(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll()]])  # a job that trains until something stops it
    pipeline.local.faults.api_errors["Monitor"] = ["ThrottlingException"] * (POLLING.attempts + 1)
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert described["status"] == "FAILED" and error == "TransientError", (error, cause)
    assert "ThrottlingException" in cause and "DescribeTrainingJob" in cause, cause
    assert pipeline.training.stopped_names == pipeline.jobs()
    _retried_within(pipeline, POLLING.attempts)


def test_a_lasting_error_ends_the_run_at_once_naming_its_cause(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll()]])
    pipeline.local.faults.api_errors["Monitor"] = ["AccessDeniedException"]
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert described["status"] == "FAILED", (error, cause)
    assert "AccessDeniedException" in cause and "DescribeTrainingJob" in cause, cause
    assert pipeline.local.clock.retries == []  # not retried
    assert _calls(pipeline, "Monitor") == ["ClientError"]
    assert pipeline.training.stopped_names == pipeline.jobs()
    (message,) = [
        json.loads(m["Message"]) for m in pipeline.local.messages("TopicsRuns") if m["Subject"] == "Training run failed"
    ]
    assert message["error"] == "ClientError" and "AccessDeniedException" in json.dumps(message), message


def test_a_burst_of_failing_calls_in_tuning_progress_is_ridden_through(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[_trial(loss) for loss in LOSSES])
    pipeline.local.faults.api_errors["TuningProgress"] = list(BURST)
    arn = pipeline.start(tuning_input(pipeline))
    described = _promote(pipeline, arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert pipeline.training.stopped_names == [] and len(pipeline.jobs()) == len(LOSSES)
    assert _calls(pipeline, "TuningProgress")[: len(BURST) + 1] == ["TransientError"] * len(BURST) + [None]
    _retried_within(pipeline, len(BURST))


def test_a_burst_of_failing_calls_in_the_batch_monitor_is_ridden_through(batch_factory: Any) -> None:  # noqa: F811
    pipeline: BatchPipeline = batch_factory()
    pipeline.local.faults.api_errors["PollBatchJob"] = list(BURST)
    arn = pipeline.start(pipeline.batch_input())
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert _calls(pipeline, "PollBatchJob")[: len(BURST) + 1] == ["TransientError"] * len(BURST) + [None]
    _retried_within(pipeline, len(BURST))
    (job,) = pipeline.batch.jobs.values()
    assert len(job.attempts) == 1  # the job was not stopped or replaced


def test_a_short_burst_in_another_handler_is_ridden_through(pipeline: Pipeline) -> None:
    pipeline.local.faults.api_errors["Register"] = ["ThrottlingException", "ServiceUnavailable"]
    arn = pipeline.start(pipeline.input())
    described = _promote(pipeline, arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert _calls(pipeline, "Register") == ["TransientError", "TransientError", None]
    assert len(pipeline.model_packages()) == 1


def test_a_gate_whose_request_fails_for_a_moment_asks_again_and_waits(pipeline: Pipeline) -> None:
    pipeline.local.faults.throttle["ApprovalRequest"] = 1  # Lambda.TooManyRequestsException
    pipeline.local.faults.api_errors["ApprovalRequest"] = ["ThrottlingException"]  # the handler's TransientError
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request = pipeline.pending("promotion")
    assert _calls(pipeline, "ApprovalRequest") == ["TransientError", None]
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert len(pipeline.local.clock.retries) == 2
    assert pipeline.model_packages()[0]["ModelApprovalStatus"] == "Approved"
    assert request["gate"] == "promotion"


@pytest.mark.filterwarnings("ignore:Exception\\(SagemakerClientError\\) with code ThrottlingException:UserWarning")
def test_a_throttled_promotion_and_its_notification_are_retried_not_the_end_of_a_trained_run(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.sagemaker.exceptions import SagemakerClientError
    from moto.sagemaker.models import SageMakerModelBackend

    original = SageMakerModelBackend.update_model_package
    calls = {"n": 0}

    def throttled_once(backend: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise SagemakerClientError("ThrottlingException", "Rate exceeded")
        return original(backend, *args, **kwargs)

    monkeypatch.setattr(SageMakerModelBackend, "update_model_package", throttled_once)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.pending("promotion")  # the gate's own notification is out
    pipeline.local.faults.sns_failures = 1  # the next publish: the run's success
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert calls["n"] == 2 and pipeline.local.faults.sns_failures == 0
    assert pipeline.model_packages()[0]["ModelApprovalStatus"] == "Approved"
    subjects = [m["Subject"] for m in pipeline.local.messages("TopicsRuns")]
    assert "Training run finished: model registered and approved" in subjects, subjects


def test_a_gate_request_made_again_with_another_token_replaces_the_one_before(pipeline: Pipeline) -> None:
    """A retried request with a new task token: the earlier request (its token resumes nothing) cannot be decided."""
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    first = pipeline.pending("promotion")
    again = {
        "gate": "promotion",
        "execution": first["execution"],
        "run_name": first["run_name"],
        "summary": json.loads(first["summary"]),
    }
    # The same token again: the same request, still the only one.
    assert pipeline.local.invoke("ApprovalRequest", again | {"token": _token_of(pipeline, first)}) == {
        "request_id": first["request_id"]
    }
    assert pipeline.pending("promotion")["request_id"] == first["request_id"]
    # Another token: the earlier request leaves the list, and deciding it names the request to decide.
    second = pipeline.local.invoke("ApprovalRequest", again | {"token": "a-token-of-a-later-attempt"})["request_id"]
    assert pipeline.pending("promotion")["request_id"] == second != first["request_id"]
    refused = pipeline.decide_raw(
        APPROVER, body={"request_id": first["request_id"], "decision": "approve", "reason": "looks right"}
    )
    assert refused["statusCode"] == 410 and f"made again as request {second}" in refused["body"], refused
    other_gate = pipeline.local.invoke("ApprovalRequest", again | {"gate": "launch", "token": "a-launch-token"})
    assert {r["request_id"] for r in _all_pending(pipeline)} == {second, other_gate["request_id"]}


def _token_of(pipeline: Pipeline, request: dict[str, Any]) -> str:
    """The task token the execution waits on (the harness reads the engine; nobody else can)."""
    (token,) = [
        json.loads(e["taskScheduledEventDetails"]["parameters"])["Payload"]["token"]
        for e in pipeline.local.history(request["execution"])
        if e["type"] == "TaskScheduled" and "waitForTaskToken" in e["taskScheduledEventDetails"]["resource"]
    ]
    return token  # type: ignore[no-any-return]


def _all_pending(pipeline: Pipeline) -> list[dict[str, Any]]:
    response = pipeline.decide_raw(APPROVER, method="GET")
    assert response["statusCode"] == 200, response
    return json.loads(response["body"])["pending"]  # type: ignore[no-any-return]

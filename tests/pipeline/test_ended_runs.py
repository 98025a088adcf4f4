"""Every way a run ends reaches its recipients: a run stopped by a person, which no state of it can tell, is told
by TellEndedRun on the execution's end, with the cause in words; a run that told them itself is not told twice."""

from __future__ import annotations

import json
from typing import Any

from localrun.aws.clock import Clock
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import Pipeline

QUALITY_MISSED = Poll("Completed", "Completed", metrics={"validation:loss": 9.0}, billable_seconds=60)


def _ended_notices(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("Subject", "").startswith("Training run ended")]


def _told(pipeline: Pipeline, arn: str) -> None:
    """Wait until TellEndedRun has been delivered this execution's end."""

    def delivered() -> bool:
        return any(
            d["function"].startswith("TellEndedRun") and arn in json.dumps(d.get("event", {}))
            for d in pipeline.local.events.deliveries
        )

    pipeline.local.wait(arn, 30, until=delivered)
    pipeline.local.events.drain()


def test_a_stopped_run_tells_its_recipients_who_stopped_it_and_why(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll()]], clock=Clock(wait_scale=0.001))
    arn = pipeline.start(pipeline.input(notify=["alice@example.org"]))
    pipeline.run_until(arn, "Check progress")
    pipeline.local.sfn.stop_execution(executionArn=arn, error="StoppedByUser", cause="wrong dataset")
    _told(pipeline, arn)
    (notice,) = _ended_notices(pipeline.local.messages("TopicsRuns"))
    body = json.loads(notice["Message"])
    assert (body["run_name"], body["execution"], body["status"]) == ("gpt2-small", arn, "ABORTED")
    assert body["reason"] == "stopped: wrong dataset (StoppedByUser)"
    assert "alice@example.org" in notice["MessageAttributes"]["recipients"]["Value"]


def test_a_run_stopped_while_its_task_fails_ends_stopped_and_is_told_so(pipeline_factory: Any) -> None:
    """The task in flight when a person stops the run fails after the stop: the run still ends ABORTED, as Step
    Functions ends it, and its recipients are told who stopped it (not left untold as if its states had told)."""
    started: dict[str, str] = {}

    def stopped_then_failed(_name: str, _request: dict[str, Any]) -> None:
        pipeline.local.sfn.stop_execution(executionArn=started["arn"], error="StoppedByUser", cause="wrong dataset")
        raise RuntimeError("the poll in flight fails after the stop")

    pipeline = pipeline_factory(scripts=[[Poll(), Poll(effect=stopped_then_failed)]], clock=Clock(wait_scale=0.001))
    started["arn"] = arn = pipeline.start(pipeline.input(notify=["alice@example.org"]))
    described = pipeline.finish(arn)
    assert (described["status"], pipeline.error(described)) == ("ABORTED", ("StoppedByUser", "wrong dataset"))
    _told(pipeline, arn)
    (notice,) = _ended_notices(pipeline.local.messages("TopicsRuns"))
    assert json.loads(notice["Message"])["reason"] == "stopped: wrong dataset (StoppedByUser)"


def test_a_run_that_told_its_recipients_itself_is_not_told_again(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll(), QUALITY_MISSED]])
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described)[0] == "QualityBelowThreshold"
    _told(pipeline, arn)
    messages = pipeline.local.messages("TopicsRuns")  # read once: reading takes them off the topic's queue
    assert _ended_notices(messages) == []
    assert any("below its quality gate" in m.get("Subject", "") for m in messages)

"""A run whose polling would outlive its execution's history goes on in a new execution (stacks/pipeline/handover.py),
executed by moto's Step Functions engine with an execution's budget of polls lowered to 3."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from lambdas.validate import resume
from lambdas.validate.resume import ResumeError
from localrun.aws.cfn import REGION
from localrun.aws.clock import Clock
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from tests.pipeline.conftest import COMPLETED, Pipeline
from tools import run_state


def _executions(pipeline: Pipeline) -> list[dict[str, Any]]:
    sfn = pipeline.local.sfn
    listed = sfn.list_executions(stateMachineArn=pipeline.local.state_machine_arn)["executions"]
    return sorted(listed, key=lambda e: e["startDate"])


def _live(pipeline: Pipeline, name: str, timeout: float = 120) -> str:
    """The ARN of the execution called `name` once it has started."""
    arns: list[str] = []

    def started() -> bool:
        arns[:] = [e["executionArn"] for e in _executions(pipeline) if e["name"] == name]
        return bool(arns)

    first = _executions(pipeline)[0]["executionArn"]
    pipeline.local.wait(first, timeout, until=started)
    return arns[0]


def test_a_run_crosses_three_executions_to_its_end_with_one_job_and_one_approval(
    open_platform: Any, handing_assembly: Path
) -> None:
    # 7 polls of a running job, then its end: polls 1-3 in the first execution, 4-6 in the second, 7-8 in the third.
    pipeline = open_platform(handing_assembly, [[*[Poll()] * 7, COMPLETED]])
    first = pipeline.start(pipeline.input(), name="long-run")
    assert pipeline.finish(first)["status"] == "SUCCEEDED", pipeline.local.explain(first)
    handed = json.loads(pipeline.local.sfn.describe_execution(executionArn=first)["output"])
    base = pipeline.training.created_names[0].rsplit("-", 1)[0]
    assert handed["run"]["execution"] == first and handed["run"]["handovers"] == 1
    assert handed["continues_in"].endswith(f":{base}-handover-1")
    second = handed["continues_in"]
    assert pipeline.finish(second)["status"] == "SUCCEEDED"
    third = json.loads(pipeline.local.sfn.describe_execution(executionArn=second)["output"])["continues_in"]
    assert third.endswith(f":{base}-handover-2")
    pipeline.run_until(third, "Approval gate (promotion)")
    _asked_after_the_run_by_its_first_execution(pipeline, first, third)
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(third)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)

    assert len(pipeline.training.created_names) == 1  # the same job, followed by three executions
    entered = pipeline.local.states_entered(third)
    assert entered[:3] == ["Handed over?", "Take over the run", "Continue which loop?"]
    assert "Validate request" not in entered and "Create training job (instance storage)" not in entered
    assert entered.count("Check progress") == 2
    assert "Model promoted" in entered
    # Each execution made its polls, the last one its remaining two.
    assert [pipeline.local.states_entered(arn).count("Check progress") for arn in (first, second)] == [3, 3]
    runs = pipeline.local.messages("TopicsRuns")
    assert [m["MessageAttributes"]["kind"]["Value"] for m in runs] == ["approval", "run"]
    success = json.loads(runs[-1]["Message"])
    assert success["execution"] == first  # the run is named by its first execution
    (package,) = pipeline.model_packages()
    assert package["ModelApprovalStatus"] == "Approved"
    assert pipeline.lineage()["execution"] == first


def _asked_after_the_run_by_its_first_execution(pipeline: Pipeline, first: str, now: str) -> None:
    """`tp watch` and `resume_from` of a run's first execution see the run as it is in the execution it went on in
    (the first one has succeeded, handing it over)."""
    watched = run_state.snapshot(boto3.Session(region_name=REGION), first)
    assert (watched["run"], watched["status"], watched["state"]) == ("long-run", "RUNNING", "Approval gate (promotion)")
    assert watched["job"] is not None and watched["job"]["name"] == pipeline.training.created_names[0]
    with pytest.raises(ResumeError, match=f"the run is still RUNNING \\(in {re.escape(now)}, which it was handed"):
        resume.find(
            first, own_execution=now, sfn=pipeline.local.sfn, s3=None, artifacts_bucket="", checkpoints_bucket=""
        )


@contextlib.contextmanager
def _platform(assembly: Path, scripts: list[list[Poll]], *, wait_scale: float) -> Iterator[Pipeline]:
    """The handing platform with Wait states at `wait_scale` of their time."""
    training = ScriptedTraining(scripts=scripts)
    local = LocalPlatform(assembly, training=training, clock=Clock(wait_scale=wait_scale))
    try:
        yield Pipeline(local.__enter__(), training)
    finally:
        local.__exit__(None, None, None)


def test_a_hand_over_no_execution_made_is_refused(handing_assembly: Path) -> None:
    # The run it names waits out its first Wait (300 s) meanwhile: running, and handing nothing over.
    with _platform(handing_assembly, [[Poll()]], wait_scale=1.0) as pipeline:
        _refused(pipeline)


def _refused(pipeline: Pipeline) -> None:
    running = pipeline.start(pipeline.input(), name="victim")
    pipeline.run_until(running, "Wait for training")
    state = {"request": {"job_name_base": "x"}, "run": {"execution": running, "loop": "Wait for training"}}
    for name, source in (
        ("forged-running", running),  # a real, running execution that never started it
        ("forged-elsewhere", running.replace(":execution:", ":execution:other-machine-").rsplit(":", 1)[0] + ":x"),
    ):
        forged = pipeline.local.start({"handover": {"from": source, "state": state}}, name=name, requester=None)
        described = pipeline.finish(forged)
        assert described["status"] == "FAILED"
        assert pipeline.error(described)[0] == "HandOverRefused"
        assert "hand-over refused" in pipeline.error(described)[1]
        entered = pipeline.local.states_entered(forged)
        assert "Wait for training" not in entered and "Validate request" not in entered
    assert len(pipeline.training.created_names) == 1


def test_tp_stop_of_a_handed_over_run_stops_its_live_execution_and_its_job(
    handing_assembly: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tools.test_tp import _wired

    # Each Wait a few seconds: the live execution is stopped between its polls, as a person would.
    with _platform(handing_assembly, [[Poll()]], wait_scale=0.02) as pipeline:
        _stop_the_live_execution(_wired(pipeline, monkeypatch))


def _stop_the_live_execution(pipeline: Pipeline) -> None:
    from tests.tools.test_tp import _answer, tp

    first = pipeline.start(pipeline.input(), name="stopped-later")
    assert pipeline.finish(first)["status"] == "SUCCEEDED"
    live = json.loads(pipeline.local.sfn.describe_execution(executionArn=first)["output"])["continues_in"]
    pipeline.run_until(live, "Check progress")
    result = tp("stop", "stopped-later", "--reason", "enough", "--json")
    assert result.exit_code == 0, result.output
    assert _answer(result.stdout)["execution_arn"] == live
    assert pipeline.finish(live)["status"] == "ABORTED"
    # The ended execution's cleanup (EventBridge) stops the job its run's first execution created.
    pipeline.local.wait(live, 30, until=lambda: bool(pipeline.local.events.deliveries))
    pipeline.local.events.drain()
    assert pipeline.training.stopped_names == pipeline.jobs() != []
    # TellEndedRun names the run by its first execution, and the execution that was stopped.
    (told,) = [m for m in pipeline.local.messages("TopicsRuns") if m["Subject"].startswith("Training run ended")]
    body = json.loads(told["Message"])
    assert (body["execution"], body["ended_execution"], body["status"]) == (first, live, "ABORTED")

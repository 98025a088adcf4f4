"""Waiting on the local platform: a condition named by the test is waited for even after the execution ended."""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from localrun.aws.engine import LambdaCall, LocalPlatform


def _ended(status: str, calls: list[LambdaCall] | None = None) -> Any:
    described = {"name": "run-1", "status": status}
    if status == "FAILED":
        described |= {"error": "RuntimeError", "cause": "dictionary changed size during iteration"}
    sfn = SimpleNamespace(
        describe_execution=lambda executionArn: described,  # noqa: N803
        list_executions=lambda stateMachineArn: {"executions": [{"executionArn": "arn"}]},  # noqa: N803
    )
    platform = SimpleNamespace(
        sfn=sfn, states_entered=lambda _arn: ["Validate request"], lambda_calls=calls or [], state_machine_arn="sm"
    )
    platform.explain = lambda *arns: LocalPlatform.explain(platform, *arns)  # type: ignore[arg-type]
    return platform


def test_an_ended_execution_does_not_end_the_wait_for_what_follows_its_end() -> None:
    # The EventBridge delivery of an ABORTED status change is listed on another thread, after the status.
    listed: list[str] = []
    threading.Timer(0.3, lambda: listed.append("StopBatchJobs")).start()
    described = LocalPlatform.wait(_ended("ABORTED"), "arn", 10, until=lambda: bool(listed))  # type: ignore[arg-type]
    assert described["status"] == "ABORTED" and listed == ["StopBatchJobs"]


def test_without_a_condition_the_wait_ends_with_the_execution() -> None:
    platform, looks = _ended("SUCCEEDED"), []
    describe = platform.sfn.describe_execution
    platform.sfn.describe_execution = lambda executionArn: looks.append(executionArn) or describe(executionArn)  # noqa: N803
    assert LocalPlatform.wait(platform, "arn", 10)["status"] == "SUCCEEDED"
    assert looks == ["arn"]  # one look, no rest: an ended execution is not waited on


def test_a_condition_that_never_holds_fails_saying_why_the_run_ended_and_which_handler_raised() -> None:
    raised = LambdaCall("ApprovalRequestFunction", "lambdas.approvals.handler.request", {}, None, "KeyError", "'gate'")
    with pytest.raises(TimeoutError) as failed:
        LocalPlatform.wait(_ended("FAILED", [raised]), "arn", 0.2, until=lambda: False)  # type: ignore[arg-type]
    assert "in 0.2 s" in str(failed.value)
    assert "run-1 FAILED (error 'RuntimeError', cause 'dictionary changed size during iteration')" in str(failed.value)
    assert "ApprovalRequestFunction: KeyError: 'gate'" in str(failed.value)
    assert "states entered: ['Validate request']" in str(failed.value)


def test_the_wait_rests_a_tenth_of_a_second_or_more_between_looks() -> None:
    # A look is cheap (a few ms); looking every 10 ms made the waits of the suite's runs a share of its CPU.
    # With a condition, a look is a check of it (the execution is described once, after it held).
    platform, looks = _ended("RUNNING"), []
    ready = threading.Event()
    threading.Timer(0.45, ready.set).start()
    LocalPlatform.wait(platform, "arn", 10, until=lambda: looks.append(time.monotonic()) or ready.is_set())  # type: ignore[arg-type]
    assert 2 <= len(looks) <= 6
    assert all(later - earlier >= 0.1 for earlier, later in itertools.pairwise(looks)), looks

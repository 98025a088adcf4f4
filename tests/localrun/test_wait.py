"""Waiting on the local platform: a condition named by the test is waited for even after the execution ended."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from localrun.engine import LocalPlatform


def _ended(status: str) -> Any:
    sfn = SimpleNamespace(describe_execution=lambda executionArn: {"status": status})  # noqa: N803
    return SimpleNamespace(sfn=sfn, states_entered=lambda _arn: ["Validate request"])


def test_an_ended_execution_does_not_end_the_wait_for_what_follows_its_end() -> None:
    # The EventBridge delivery of an ABORTED status change is listed on another thread, after the status.
    listed: list[str] = []
    threading.Timer(0.3, lambda: listed.append("StopBatchJobs")).start()
    described = LocalPlatform.wait(_ended("ABORTED"), "arn", 10, until=lambda: bool(listed))  # type: ignore[arg-type]
    assert described["status"] == "ABORTED" and listed == ["StopBatchJobs"]


def test_without_a_condition_the_wait_ends_with_the_execution() -> None:
    started = time.monotonic()
    assert LocalPlatform.wait(_ended("SUCCEEDED"), "arn", 10)["status"] == "SUCCEEDED"  # type: ignore[arg-type]
    assert time.monotonic() - started < 5


def test_a_condition_that_never_holds_fails_naming_the_status() -> None:
    with pytest.raises(TimeoutError, match=r"execution FAILED after 0\.2 s"):
        LocalPlatform.wait(_ended("FAILED"), "arn", 0.2, until=lambda: False)  # type: ignore[arg-type]

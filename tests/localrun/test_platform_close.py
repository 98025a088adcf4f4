"""An execution whose worker has not started yet: closing the local platform stops it, and callbacks meant for other
executions pass it over."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from botocore.exceptions import ClientError
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.parser.models import stepfunctions_parser_backends

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import ScriptedTraining


@contextmanager
def _workers_held() -> Iterator[tuple[threading.Event, threading.Event]]:
    """(reached, release): moto's execution is RUNNING once StartExecution answers; its worker thread makes the
    environment a stop or a callback acts on. Holding that thread before it does is the moment after a start, made
    to last, until `release` is set."""
    reached, release = threading.Event(), threading.Event()
    entrypoint = ExecutionWorker._get_evaluation_entrypoint

    def held(worker: ExecutionWorker) -> Any:
        reached.set()
        release.wait(60)
        return entrypoint(worker)

    with mock.patch.object(ExecutionWorker, "_get_evaluation_entrypoint", held):
        try:
            yield reached, release
        finally:
            release.set()


def test_a_platform_closed_right_after_a_start_stops_the_execution_whose_worker_has_not_started(platform: Any) -> None:
    local = LocalPlatform(Path(platform.assembly.directory), training=ScriptedTraining())
    raised: list[BaseException] = []

    def close() -> None:
        try:
            local.__exit__(None, None, None)
        except BaseException as exc:  # reported by the test's assertion: it is raised on the closing thread
            raised.append(exc)

    with _workers_held() as (reached, release):
        local.__enter__()
        arn = local.start({"run_name": "closed-at-once"}, requester=None)
        execution = stepfunctions_parser_backends[ACCOUNT][REGION].describe_execution(arn)
        assert reached.wait(30) and execution.exec_worker.env is None
        closer = threading.Thread(target=close)
        closer.start()
        # The worker is held while the close runs: a close that fails on it fails now, before the worker goes on.
        closer.join(2)
        release.set()
        closer.join(120)
    assert not closer.is_alive() and raised == [], raised
    deadline = time.monotonic() + 30
    while execution.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = ("ABORTED", "PlatformClosed", "local platform closed")
    assert (execution.status, execution.error, execution.cause) == stopped
    # Stopped before its first state, as Step Functions stops it: nothing ran after the platform closed.
    events = [event["type"].value for event in execution.to_history_output()["events"]]
    assert events == ["ExecutionStarted", "ExecutionAborted"], events
    assert local.lambda_calls == []


@pytest.mark.parametrize(
    ("call", "arguments"),
    [
        ("send_task_success", {"output": "{}"}),
        ("send_task_failure", {"error": "Rejected"}),
        ("send_task_heartbeat", {}),
    ],
)
def test_a_callback_while_a_run_is_starting_is_answered_as_for_any_other_token(
    platform: Any, call: str, arguments: dict[str, str]
) -> None:
    with (
        LocalPlatform(Path(platform.assembly.directory), training=ScriptedTraining()) as local,
        _workers_held() as (
            reached,
            _,
        ),
    ):
        arn = local.start({"run_name": "starting"}, requester=None)
        assert reached.wait(30)
        assert stepfunctions_parser_backends[ACCOUNT][REGION].describe_execution(arn).exec_worker.env is None
        # A token no execution holds: the answer Step Functions gives, whatever else is starting.
        with pytest.raises(ClientError) as refused:
            getattr(local.sfn, call)(taskToken="a-token-of-no-execution", **arguments)
    assert refused.value.response["Error"]["Code"] == "InvalidToken"

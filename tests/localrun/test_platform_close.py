"""Closing the local platform stops every execution it started, one whose worker has not started yet too."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.parser.models import stepfunctions_parser_backends

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import ScriptedTraining


def test_a_platform_closed_right_after_a_start_stops_the_execution_whose_worker_has_not_started(platform: Any) -> None:
    # moto's execution is RUNNING once StartExecution answers; its worker thread makes the environment a stop acts
    # on. Holding that thread before it does is the moment after a start, made to last.
    reached, release = threading.Event(), threading.Event()
    entrypoint = ExecutionWorker._get_evaluation_entrypoint

    def held(worker: ExecutionWorker) -> Any:
        reached.set()
        release.wait(60)
        return entrypoint(worker)

    local = LocalPlatform(Path(platform.assembly.directory), training=ScriptedTraining())
    raised: list[BaseException] = []

    def close() -> None:
        try:
            local.__exit__(None, None, None)
        except BaseException as exc:  # reported by the test's assertion: it is raised on the closing thread
            raised.append(exc)

    with mock.patch.object(ExecutionWorker, "_get_evaluation_entrypoint", held):
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

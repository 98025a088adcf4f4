"""Handler environments are per thread: the process environment other threads read never changes."""

from __future__ import annotations

import io
import os
import threading
import urllib.request

import pytest

from localrun.aws.environ import handler_environment, handler_stdout


def test_a_handlers_variables_are_seen_by_its_thread_only() -> None:
    before = dict(os.environ)
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def handler() -> None:
        with handler_environment({"TABLE_NAME": "approvals", "HOME": "/handler"}):
            seen["inside"] = (os.environ["TABLE_NAME"], os.getenv("HOME"), "TABLE_NAME" in dict(os.environ))
            os.environ["SET_BY_HANDLER"] = "1"
            entered.set()
            release.wait(10)
        seen["after"] = (os.getenv("TABLE_NAME"), os.getenv("SET_BY_HANDLER"))

    thread = threading.Thread(target=handler)
    thread.start()
    assert entered.wait(10)
    # While the handler runs, this thread reads the unchanged process environment.
    assert dict(os.environ) == before
    assert "TABLE_NAME" not in os.environ and os.getenv("SET_BY_HANDLER") is None
    release.set()
    thread.join(10)
    assert seen == {"inside": ("approvals", "/handler", True), "after": (None, None)}
    assert dict(os.environ) == before


def test_the_process_environment_can_still_be_changed_outside_handlers() -> None:
    with handler_environment({}):
        pass
    os.environ["LOCALRUN_ENVIRON_TEST"] = "1"
    try:
        assert os.getenv("LOCALRUN_ENVIRON_TEST") == "1"
    finally:
        del os.environ["LOCALRUN_ENVIRON_TEST"]
    assert "LOCALRUN_ENVIRON_TEST" not in os.environ


def test_a_handlers_output_goes_to_its_log_and_other_threads_keep_the_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = io.StringIO()
    entered, release = threading.Event(), threading.Event()

    def handler() -> None:
        with handler_stdout(log):
            print('{"_aws": "an embedded metric"}')
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=handler)
    thread.start()
    assert entered.wait(10)
    print("demo progress")  # another thread, while the handler runs
    release.set()
    thread.join(10)
    assert log.getvalue() == '{"_aws": "an embedded metric"}\n'
    assert capsys.readouterr().out == "demo progress\n"


def test_a_handler_reading_every_variable_survives_another_thread_removing_one() -> None:
    # botocore reads the proxy settings on every request (urllib's getproxies_environment: os.environ.items()),
    # while the test harness's CLI runner sets and removes process variables (AWS_REGION, ...) on another thread.
    stop, failures = threading.Event(), []

    def handler() -> None:
        with handler_environment({"TABLE_NAME": "approvals"}):
            while not stop.is_set():
                try:
                    urllib.request.getproxies_environment()
                    assert os.environ.copy()["TABLE_NAME"] == dict(os.environ.items())["TABLE_NAME"] == "approvals"
                except Exception as exc:
                    failures.append(repr(exc))
                    return

    thread = threading.Thread(target=handler)
    thread.start()
    try:
        for _ in range(20_000):
            os.environ["PLATFORM_TEST_RACE"] = "1"
            del os.environ["PLATFORM_TEST_RACE"]
    finally:
        stop.set()
        thread.join(10)
    assert failures == []

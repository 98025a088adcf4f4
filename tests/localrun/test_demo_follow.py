"""The demo's follow loop: states printed, gates answered as the approver, until the execution ends."""

from __future__ import annotations

import json
from typing import Any

from localrun.demo.cli import _follow, _Printer, awaits_a_decision

APPROVER = "arn:aws:iam::123456789012:role/DemoApprover"


def _task(kind: str, resource: str) -> dict[str, Any]:
    detail = {"Scheduled": "taskScheduledEventDetails", "Succeeded": "taskSucceededEventDetails"}[kind]
    return {"type": f"Task{kind}", detail: {"resourceType": "lambda", "resource": resource}}


GATE_OPEN = [_task("Scheduled", "createTrainingJob"), _task("Scheduled", "invoke.waitForTaskToken")]
GATE_DECIDED = [*GATE_OPEN, _task("Succeeded", "invoke.waitForTaskToken"), _task("Scheduled", "updateModelPackage")]


class _Platform:
    """An execution that runs for `passes` looks, at a gate from the second look until the gate is decided."""

    def __init__(self, passes: int) -> None:
        self.passes, self.looks = passes, 0
        self.sign_ins: list[str] = []
        self.calls: list[tuple[object, str]] = []
        self.decided = False

    def person(self, role_arn: str, session_name: str) -> object:
        self.sign_ins.append(role_arn)
        return object()

    def history(self, _arn: str) -> list[dict[str, Any]]:
        return [] if self.looks < 2 else GATE_DECIDED if self.decided else GATE_OPEN

    def call_decision_url(self, session: object, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        self.calls.append((session, method))
        if method == "POST":
            self.decided = True
            return {"statusCode": 200, "body": json.dumps({"decision": body and body["decision"], "by": APPROVER})}
        request = {"execution": "arn", "request_id": "r1", "gate": "launch", "run_name": "run", "summary": "{}"}
        return {"statusCode": 200, "body": json.dumps({"pending": [] if self.decided else [request]})}

    @property
    def sfn(self) -> Any:
        platform = self

        class Sfn:
            @staticmethod
            def describe_execution(executionArn: str) -> dict[str, Any]:  # noqa: N803
                platform.looks += 1
                return {"status": "RUNNING" if platform.looks < platform.passes else "SUCCEEDED"}

        return Sfn()


def test_the_approver_signs_in_once_and_looks_for_requests_only_while_a_gate_waits() -> None:
    platform = _Platform(passes=5)
    described, decisions = _follow(
        platform,  # type: ignore[arg-type]
        "arn",
        _Printer(verbose=False),
        approver=APPROVER,
        auto_approve=True,
        reject=None,
        timeout_seconds=60,
        verbose=False,
    )
    assert described["status"] == "SUCCEEDED" and [d["decision"] for d in decisions] == ["approve"]
    assert platform.sign_ins == [APPROVER]
    # One look at the pending requests, at the gate, and the decision, both signed by the one session.
    assert [method for _, method in platform.calls] == ["GET", "POST"]
    assert len({id(session) for session, _ in platform.calls}) == 1


def test_an_execution_awaits_a_decision_while_a_task_waits_for_its_token() -> None:
    assert not awaits_a_decision([]) and not awaits_a_decision(GATE_OPEN[:1])
    assert awaits_a_decision(GATE_OPEN) and not awaits_a_decision(GATE_DECIDED)
    failed = {"type": "TaskFailed", "taskFailedEventDetails": {"resource": "invoke.waitForTaskToken", "error": "x"}}
    assert not awaits_a_decision([*GATE_OPEN, failed])

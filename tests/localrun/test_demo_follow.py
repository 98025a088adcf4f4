"""The demo's follow loop: states printed, gates answered as the approver, until the execution ends."""

from __future__ import annotations

import json
from typing import Any

from localrun.demo.cli import _follow, _Printer


class _Platform:
    """An execution that runs for `passes` looks, with one gate open from the second look until it is decided."""

    def __init__(self, passes: int) -> None:
        self.passes, self.looks = passes, 0
        self.sign_ins: list[str] = []
        self.signed_by: list[object] = []
        self.open = False

    def person(self, role_arn: str, session_name: str) -> object:
        self.sign_ins.append(role_arn)
        return object()

    def history(self, _arn: str) -> list[dict[str, Any]]:
        return []

    def call_decision_url(self, session: object, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        self.signed_by.append(session)
        if method == "POST":
            self.open = False
            return {"statusCode": 200, "body": json.dumps({"decision": body and body["decision"], "by": "approver"})}
        request = {"execution": "arn", "request_id": "r1", "gate": "launch", "run_name": "run", "summary": "{}"}
        return {"statusCode": 200, "body": json.dumps({"pending": [request] if self.open else []})}

    @property
    def sfn(self) -> Any:
        platform = self

        class Sfn:
            @staticmethod
            def describe_execution(executionArn: str) -> dict[str, Any]:  # noqa: N803
                platform.looks += 1
                platform.open = platform.open or platform.looks == 2
                return {"status": "RUNNING" if platform.looks < platform.passes else "SUCCEEDED"}

        return Sfn()


def test_the_approver_signs_in_once_and_every_look_and_decision_is_signed_by_that_session() -> None:
    platform = _Platform(passes=4)
    described, decisions = _follow(
        platform,  # type: ignore[arg-type]
        "arn",
        _Printer(verbose=False),
        approver="arn:aws:iam::123456789012:role/DemoApprover",
        auto_approve=True,
        reject=None,
        timeout_seconds=60,
        verbose=False,
    )
    assert described["status"] == "SUCCEEDED" and [d["decision"] for d in decisions] == ["approve"]
    assert platform.sign_ins == ["arn:aws:iam::123456789012:role/DemoApprover"]
    assert len(platform.signed_by) == 5 and len(set(map(id, platform.signed_by))) == 1  # 4 looks and the POST

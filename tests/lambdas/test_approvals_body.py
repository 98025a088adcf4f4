"""Every decision body the handler cannot read is answered 400, never a crash; a gate goes on only as recorded."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from lambdas.approvals import handler, identity
from lambdas.approvals.store import ApprovalStore, DecisionError, DecisionNotRecordedError, _decode_cursor


class _Context:
    function_name = "ApprovalDecide"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ApprovalDecide"
    aws_request_id = "req-1"


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("TABLE_NAME", "approvals")
    monkeypatch.setenv("TOKEN_KEY_ARN", "arn:aws:kms:us-east-1:123456789012:key/k")
    monkeypatch.setenv("APPROVERS", json.dumps(["arn:aws:iam::123456789012:role/Approver"]))
    monkeypatch.setenv("TEAM_APPROVERS", "{}")
    monkeypatch.setenv("FORBID_SELF_APPROVAL", "true")


def _post(body: str | None, *, base64_encoded: bool = False) -> tuple[int, str]:
    event: dict[str, Any] = {"requestContext": {"http": {"method": "POST"}}, "headers": {}, "body": body}
    if base64_encoded:
        event["isBase64Encoded"] = True
    response = handler.decide(event, _Context())
    return response["statusCode"], json.loads(response["body"])["error"]


# 100k deep (what crashed it: json.loads recursed out of stack), and deep but small enough to reach the parser.
DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000
DEEP_SMALL = '{"reason": ' + "[" * 1000 + "]" * 1000 + "}"


@pytest.mark.parametrize(
    ("body", "encoded", "says"),
    [
        (DEEP, False, "at most"),
        (DEEP_OBJECT, False, "at most"),
        (DEEP_SMALL, False, "nested too deeply"),
        ('{"request_id": "' + "x" * 100_000 + '"}', False, "at most"),
        (base64.b64encode(b'{"reason": "\xff\xfe"}').decode(), True, "UTF-8"),
        ("not base64!", True, "not valid base64"),
        ("{not json", False, "must be JSON"),
        ("[1, 2]", False, "JSON object"),
        ('"approve"', False, "JSON object"),
        ('{"request_id": 1, "decision": "approve", "reason": "ok"}', False, "request_id must be a string"),
        ('{"request_id": "r", "decision": ["approve"], "reason": {"a": 1}}', False, "decision, reason must be"),
    ],
)
def test_an_unreadable_body_is_a_400_that_says_what_to_send(body: str, encoded: bool, says: str) -> None:
    status, error = _post(body, base64_encoded=encoded)
    assert status == 400
    assert says in error and "{request_id, decision, reason}" in error


def test_a_readable_body_goes_on_to_the_identity_check() -> None:
    # Parsed, then refused for want of a proof: the body was not the problem.
    status, error = _post(json.dumps({"request_id": "r", "decision": "approve", "reason": "ok"}))
    assert status == 401 and "proof" in error
    encoded = base64.b64encode(json.dumps({"request_id": "r", "decision": "approve", "reason": "ok"}).encode())
    assert _post(encoded.decode(), base64_encoded=True)[0] == 401


def test_a_deeply_nested_proof_or_cursor_is_refused_not_crashed() -> None:
    # The other JSON the decision URL reads: the identity proof header (every call) and the page cursor.
    deep = base64.b64encode(b"[" * 5000 + b"]" * 5000).decode()
    event = {
        "requestContext": {"http": {"method": "POST"}},
        "headers": {identity.PROOF_HEADER: deep},
        "body": json.dumps({"request_id": "r", "decision": "approve", "reason": "ok"}),
    }
    response = handler.decide(event, _Context())
    assert response["statusCode"] == 401 and "not base64-encoded JSON" in response["body"]
    with pytest.raises(DecisionError) as refused:
        _decode_cursor(base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).decode())
    assert refused.value.status == 400 and "cursor" in str(refused.value)


class _Table:
    """The approvals table, as `ApprovalStore.verify` reads it."""

    def __init__(self, *items: dict[str, Any]) -> None:
        self.items = {item["request_id"]: item for item in items}

    def get_item(self, *, Key: dict[str, str], ConsistentRead: bool) -> dict[str, Any]:  # noqa: N803 - boto3's names
        assert ConsistentRead
        item = self.items.get(Key["request_id"])
        return {"Item": item} if item else {}


EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:pipeline:run-1"
APPROVER = "arn:aws:iam::123456789012:role/Approver"
RECORDED = {"request_id": "r1", "execution": EXECUTION, "gate": "launch", "status": "APPROVED", "decided_by": APPROVER}
PENDING = {"request_id": "r2", "execution": EXECUTION, "gate": "launch", "status": "PENDING"}
OTHER_RUN = {**RECORDED, "request_id": "r3", "execution": EXECUTION.replace("run-1", "run-2")}
OTHER_GATE = {**RECORDED, "request_id": "r4", "gate": "promotion"}


@pytest.mark.parametrize(
    "decision",
    [
        {},  # no request named
        {"request_id": "nope", "decision": "approved", "by": APPROVER},  # no such request
        {"request_id": "r2", "decision": "approved", "by": APPROVER},  # still pending: nobody decided
        {"request_id": "r2", "decision": "rejected", "by": APPROVER},  # a forged rejection is caught too
        {"request_id": "r1", "decision": "rejected", "by": APPROVER},  # another outcome than recorded
        {"request_id": "r1", "decision": "approved", "by": "arn:aws:iam::123456789012:role/Other"},  # another approver
        {"request_id": "r3", "decision": "approved", "by": APPROVER},  # another run's decision
        {"request_id": "r4", "decision": "approved", "by": APPROVER},  # the same run's other gate
        {"request_id": ["r1"], "decision": "approved", "by": APPROVER},  # not a request ID at all
    ],
)
def test_a_gate_goes_on_only_with_the_decision_the_decision_function_recorded(decision: dict[str, Any]) -> None:
    store = ApprovalStore(table=_Table(RECORDED, PENDING, OTHER_RUN, OTHER_GATE), sfn=None)
    with pytest.raises(DecisionNotRecordedError, match="did not record"):
        store.verify(execution=EXECUTION, gate="launch", decision=decision)
    store.verify(
        execution=EXECUTION, gate="launch", decision={"request_id": "r1", "decision": "approved", "by": APPROVER}
    )

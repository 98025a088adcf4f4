"""Every decision body the handler cannot read is answered 400 with what to send, never a crash."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from lambdas.approvals import handler


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

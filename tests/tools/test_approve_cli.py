"""The approval CLI signs its calls to the decision URL with SigV4 for Lambda."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from tools.cli_errors import UserError
from tools.tp import signed_request

URL = "https://abc123def456.lambda-url.eu-west-1.on.aws/"


def test_requests_are_signed_for_lambda_in_the_urls_region() -> None:
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1")
    request = signed_request(URL, "POST", {"request_id": "r1", "decision": "approve", "reason": "ok"}, session)
    authorization = request.get_header("Authorization")
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/lambda/aws4_request" in authorization
    assert json.loads(request.data) == {"request_id": "r1", "decision": "approve", "reason": "ok"}  # type: ignore[arg-type]
    assert request.get_method() == "POST"


@pytest.mark.parametrize(
    "url",
    [
        "http://evil.example.org/",
        "http://abc123def456.lambda-url.eu-west-1.on.aws/",  # a function URL, but not over TLS
        "http://127.0.0.1.evil.example.org:8080/",
        "http://localhost:8080/",
        "https://127.0.0.1:8080/",
    ],
)
def test_only_function_urls_and_the_local_platforms_loopback_are_accepted(url: str) -> None:
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1")
    with pytest.raises(UserError, match="is not a Lambda function URL"):
        signed_request(url, "GET", None, session)


def test_the_local_platforms_decision_url_is_signed_for_the_sessions_region(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1")
    request = signed_request("http://127.0.0.1:8765/", "GET", None, session)
    assert "/us-east-1/lambda/aws4_request" in request.get_header("Authorization")
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    regionless = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")
    assert regionless.region_name is None
    with pytest.raises(UserError, match="with AWS_REGION set"):
        signed_request("http://127.0.0.1:8765/", "GET", None, regionless)

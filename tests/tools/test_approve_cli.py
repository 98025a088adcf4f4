"""The approval CLI signs its calls to the decision URL with SigV4 for Lambda."""

from __future__ import annotations

import json

import boto3
import pytest

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


def test_only_function_urls_are_accepted() -> None:
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1")
    with pytest.raises(SystemExit, match="is not a Lambda function URL"):
        signed_request("http://evil.example.org/", "GET", None, session)

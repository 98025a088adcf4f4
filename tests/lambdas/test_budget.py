"""Validate's reading of the budget stop: only the stop's explicit deny means the budget is spent."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from lambdas.validate.budget import budget_stopped, probe_job, refusal

PROBE = "platform-budget-probe"


def _answer(code: str, message: str) -> bool:
    sagemaker = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(sagemaker) as stub:
        stub.add_client_error("describe_training_job", code, message, expected_params={"TrainingJobName": PROBE})
        return budget_stopped(sagemaker, PROBE)


def test_not_found_means_the_stop_is_not_in_force() -> None:
    assert _answer("ValidationException", f"Requested resource not found: {PROBE}") is False


def test_an_explicit_deny_means_it_is() -> None:
    message = (
        "User: arn:aws:sts::1:assumed-role/Validate/x is not authorized to perform: sagemaker:DescribeTrainingJob "
        "on resource: arn:aws:sagemaker:us-east-1:1:training-job/platform-budget-probe with an explicit deny in an "
        "identity-based policy: arn:aws:iam::1:policy/BudgetStopDeny"
    )
    assert _answer("AccessDeniedException", message) is True


def test_a_missing_permission_is_a_fault_not_a_spent_budget() -> None:
    with pytest.raises(ClientError, match="no identity-based policy allows"):
        _answer("AccessDeniedException", "... because no identity-based policy allows the action")


def test_each_team_has_a_probe_and_a_refusal_of_its_own() -> None:
    assert probe_job() == PROBE and probe_job("vision") == f"{PROBE}-vision"
    message = refusal(limit_usd=2000, contact="vision@example.org", team="vision")
    assert "team 'vision''s monthly budget of $2,000.00 is spent" in message
    assert "on every backend" in message and "Ask vision@example.org" in message
    assert "teams[].monthly_budget_usd" in message

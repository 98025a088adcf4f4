"""`make outputs` reads the deployed pipeline stack's outputs (CloudFormation stubbed with botocore's Stubber)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from stacks import outputs
from tools import outputs as tool

DEPLOYED = {
    outputs.STATE_MACHINE_ARN: "arn:aws:states:eu-west-1:123456789012:stateMachine:training-platform-prod",
    outputs.DECISION_URL: "https://abc.lambda-url.eu-west-1.on.aws/",
    outputs.DATASETS_BUCKET: "tp-prod-datasets-123456789012-eu-west-1",
    outputs.ARTIFACTS_BUCKET: "tp-prod-artifacts-123456789012-eu-west-1",
    outputs.DASHBOARD_URL: "https://eu-west-1.console.aws.amazon.com/cloudwatch/home?region=eu-west-1#dashboards:name=x",
    outputs.TRAINING_LOG_GROUP: "/aws/sagemaker/TrainingJobs",
}


def _stack(name: str, values: dict[str, str]) -> dict[str, Any]:
    return {
        "StackName": name,
        "CreationTime": datetime(2026, 1, 1),
        "StackStatus": "UPDATE_COMPLETE",
        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in reversed(values.items())],
    }


@pytest.fixture
def cloudformation() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("cloudformation", region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_the_outputs_of_the_stages_pipeline_stack_in_their_pinned_order(cloudformation: Any) -> None:
    client, stubber = cloudformation
    name = "training-platform-prod-pipeline"
    extra = {**DEPLOYED, "SomethingElse": "ignored"}
    stubber.add_response("describe_stacks", {"Stacks": [_stack(name, extra)]}, {"StackName": name})
    assert list(tool.read_outputs(client, name).items()) == list(DEPLOYED.items())


def test_a_stack_deployed_before_the_outputs_or_not_at_all_is_explained(cloudformation: Any) -> None:
    client, stubber = cloudformation
    name = "training-platform-prod-pipeline"
    stubber.add_response("describe_stacks", {"Stacks": [_stack(name, {})]}, {"StackName": name})
    with pytest.raises(tool.OutputsError, match=r"has no output StateMachineArn, DecisionUrl.*make deploy"):
        tool.read_outputs(client, name)
    stubber.add_client_error("describe_stacks", "ValidationError", f"Stack with id {name} does not exist")
    with pytest.raises(tool.OutputsError, match=r"is not deployed in eu-west-1: deploy it \(make deploy\)"):
        tool.read_outputs(client, name)


def test_make_outputs_reads_the_stage_from_the_settings_and_context(
    cloudformation: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client, stubber = cloudformation
    name = "training-platform-prod-pipeline"
    stubber.add_response("describe_stacks", {"Stacks": [_stack(name, DEPLOYED)]}, {"StackName": name})
    regions: list[str | None] = []

    class Session:
        def __init__(self, region_name: str | None = None) -> None:
            regions.append(region_name)

        def client(self, service: str) -> Any:
            assert service == "cloudformation"
            return client

    monkeypatch.setattr(tool.aws_session.boto3, "Session", Session)
    monkeypatch.setenv("PLATFORM_CONTEXT", json.dumps({"stage": "prod", "region": "eu-west-1"}))
    assert tool.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DEPLOYED
    assert regions == ["eu-west-1"]

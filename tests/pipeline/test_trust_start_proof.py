"""A start proof starts one run: its own execution of its own state machine, within minutes, once.

Attacks by an insider who holds a real requester's proof (from a shared shell history, a log, an
execution's history) and wants to start a run in that requester's name and then approve it: the
platform as cdk.json deploys it, executed locally with IAM enforced.
"""

from __future__ import annotations

import inspect
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import APPROVER
from tests.pipeline.conftest import Pipeline

VICTIM = "arn:aws:iam::123456789012:role/DataScientist"
OTHER_STAGE = "arn:aws:states:us-east-1:123456789012:stateMachine:TrainingPipeline-prod"


def _proof(
    pipeline: Pipeline, execution_input: dict[str, Any], name: str, *, state_machine: str, by: str = VICTIM
) -> dict[str, Any]:
    """The input plus the proof `by`'s `tp start` makes for `state_machine`."""
    from tools import start_run

    session = pipeline.local.person(by, "starter")
    if "state_machine" not in inspect.signature(start_run.with_proof).parameters:
        # The tool's older form, bound to the execution name and input only: what these attacks replay.
        return start_run.with_proof(execution_input, name, "us-east-1", session)  # type: ignore[no-any-return]
    return start_run.with_proof(execution_input, state_machine, name, session)


def _cause(pipeline: Pipeline, arn: str) -> str:
    described = pipeline.finish(arn)
    assert described["status"] == "FAILED", f"the run was accepted: {described['status']}"
    error, cause = pipeline.error(described)
    assert error == "InvalidRequest", (error, cause)
    return cause


def test_a_used_proof_does_not_start_a_second_execution(pipeline: Pipeline) -> None:
    execution_input = pipeline.input(run_name="victim-run")
    proven = _proof(pipeline, execution_input, "victim-run", state_machine=pipeline.local.state_machine_arn)
    first = pipeline.local.start(proven, name="victim-run")
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(first)["status"] == "SUCCEEDED"
    # Step Functions forgets an execution name after 90 days, or at once when a deployment replaces
    # the state machine (same name, same ARN): replace it here, then replay the proof.
    sfn = pipeline.local.sfn
    machine = sfn.describe_state_machine(stateMachineArn=pipeline.local.state_machine_arn)
    sfn.delete_state_machine(stateMachineArn=machine["stateMachineArn"])
    recreated = sfn.create_state_machine(
        name=machine["name"], definition=machine["definition"], roleArn=machine["roleArn"]
    )
    assert recreated["stateMachineArn"] == pipeline.local.state_machine_arn
    second = pipeline.local.start(proven, name="victim-run")
    assert "already started another run" in _cause(pipeline, second)


def test_a_proof_for_another_state_machine_does_not_start_a_run_here(pipeline: Pipeline) -> None:
    execution_input = pipeline.input(run_name="prod-run")
    for_prod = _proof(pipeline, execution_input, "prod-run", state_machine=OTHER_STAGE)
    arn = pipeline.local.start(for_prod, name="prod-run")
    assert "made for another request" in _cause(pipeline, arn)


def test_a_proof_older_than_five_minutes_does_not_start_a_run(pipeline: Pipeline) -> None:
    execution_input = pipeline.input(run_name="stale-run")
    signed_at = datetime.now(UTC) - timedelta(minutes=6)
    with mock.patch("botocore.auth.get_current_datetime", return_value=signed_at.replace(tzinfo=None)):
        stale = _proof(pipeline, execution_input, "stale-run", state_machine=pipeline.local.state_machine_arn)
    arn = pipeline.local.start(stale, name="stale-run")
    assert "older than 5 minutes" in _cause(pipeline, arn)


def test_by_default_nobody_approves_a_run_they_started(pipeline: Pipeline) -> None:
    # An approver starts a run with their own proof, then tries to approve its model themself.
    execution_input = pipeline.input(run_name="own-run")
    proven = _proof(pipeline, execution_input, "own-run", state_machine=pipeline.local.state_machine_arn, by=APPROVER)
    arn = pipeline.local.start(proven, name="own-run")
    request = pipeline.pending("promotion")
    assert request["requested_by"] == APPROVER
    own = {"request_id": request["request_id"], "decision": "approve", "reason": "my own run looks great"}
    refused = pipeline.decide_raw(APPROVER, body=own)
    assert refused["statusCode"] == 403, refused
    assert "started this run and may not decide its gates" in json.loads(refused["body"])["error"]
    pipeline.local.sfn.stop_execution(executionArn=arn)


def test_the_proof_goes_no_further_than_validate(pipeline: Pipeline) -> None:
    execution_input = pipeline.input(run_name="quiet-run")
    proven = _proof(pipeline, execution_input, "quiet-run", state_machine=pipeline.local.state_machine_arn)
    proof = proven["requester_proof"]
    arn = pipeline.local.start(proven, name="quiet-run")
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"
    events = pipeline.local.history(arn)
    (validated,) = [
        i
        for i, e in enumerate(events)
        if e["type"] == "TaskStateExited" and e["stateExitedEventDetails"]["name"] == "Validate request"
    ]
    carrying = [e["type"] for e in events[validated:] if proof in json.dumps(e, default=str)]
    assert carrying == [], f"events after Validate that hold the proof: {carrying}"
    # The proven identity travels on instead.
    assert VICTIM in json.dumps(events[validated], default=str)


def test_training_roles_cannot_write_the_used_proofs(pipeline: Pipeline) -> None:
    """Training code could otherwise delete a used proof's record and replay the proof."""
    from moto.iam.models import iam_backends

    table = pipeline.local.environment("Validate")["START_PROOFS_TABLE"]
    roles = {
        service: role.arn
        for role in iam_backends["123456789012"]["aws"].get_roles()
        for service in ("sagemaker.amazonaws.com", "ecs-tasks.amazonaws.com")
        if service in json.dumps(role.assume_role_policy_document)
    }
    assert set(roles) == {"sagemaker.amazonaws.com", "ecs-tasks.amazonaws.com"}
    for service, role in roles.items():
        session = pipeline.local.iam.credentials(role, service)
        dynamodb = boto3.client(
            "dynamodb",
            region_name="us-east-1",
            aws_access_key_id=session.access_key,
            aws_secret_access_key=session.secret_key,
            aws_session_token=session.token,
        )
        with pytest.raises(ClientError, match="not authorized to perform: dynamodb:PutItem"):
            dynamodb.put_item(TableName=table, Item={"proof": {"S": "x"}})
        with pytest.raises(ClientError, match="not authorized to perform: dynamodb:DeleteItem"):
            dynamodb.delete_item(TableName=table, Key={"proof": {"S": "x"}})

"""The start proof, verified by Validate: bound to one state machine, fresh, and used by one execution."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws

from lambdas.validate import start_proof

REGION = "us-east-1"
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:TrainingPipeline"
EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:run-1"
STARTED = "2026-11-23T21:00:00.000Z"
INPUT = {"run_name": "gpt2-small", "dataset": "fsx:///datasets/corpus/", "max_runtime_hours": 2}


@pytest.fixture
def aws() -> Iterator[tuple[Any, Any]]:
    with mock_aws():
        table = boto3.resource("dynamodb", region_name=REGION).create_table(
            TableName="StartProofs",
            KeySchema=[{"AttributeName": "proof", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "proof", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        credentials = boto3.Session(region_name=REGION).get_credentials().get_frozen_credentials()
        yield table, credentials


def _prove(table: Any, proven: dict[str, Any], *, execution: str = EXECUTION, started: str = STARTED) -> str:
    sts = boto3.client("sts", region_name=REGION)
    return start_proof.prove(
        proven, execution_arn=execution, started=started, table=table, now=datetime.now(UTC), sts=sts
    )


def _attach(credentials: Any, *, machine: str = MACHINE, name: str = "run-1") -> dict[str, Any]:
    return start_proof.attach(INPUT, state_machine=machine, execution_name=name, credentials=credentials)


def test_a_retried_validate_of_the_same_execution_is_accepted(aws: tuple[Any, Any]) -> None:
    table, credentials = aws
    proven = _attach(credentials)
    first = _prove(table, proven)
    assert first.startswith("arn:aws:iam::123456789012:")
    assert _prove(table, proven) == first  # Lambda retried Validate: same execution, same start
    (item,) = table.scan()["Items"]
    assert item["execution"] == f"{EXECUTION}@{STARTED}"
    assert proven["requester_proof"] not in str(item)  # a digest of the signature, not the proof


def test_the_same_execution_arn_started_again_is_refused(aws: tuple[Any, Any]) -> None:
    table, credentials = aws
    proven = _attach(credentials)
    _prove(table, proven)
    # The state machine was replaced (same ARN): the same execution ARN with another start time.
    with pytest.raises(start_proof.ProofError, match="already started another run"):
        _prove(table, proven, started="2026-11-23T21:02:00.000Z")


def test_a_proof_for_another_state_machine_or_name_is_refused(aws: tuple[Any, Any]) -> None:
    table, credentials = aws
    other_stage = MACHINE.replace("TrainingPipeline", "TrainingPipeline-prod")
    for proven in (_attach(credentials, machine=other_stage), _attach(credentials, name="run-2")):
        with pytest.raises(start_proof.ProofError, match="made for another request"):
            _prove(table, proven)
    assert table.scan()["Items"] == []  # a refused proof is not recorded


def test_a_proof_signed_more_than_five_minutes_ago_is_refused(aws: tuple[Any, Any]) -> None:
    table, credentials = aws
    signed_at = (datetime.now(UTC) - start_proof.WINDOW - timedelta(seconds=30)).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=signed_at):
        stale = _attach(credentials)
    with pytest.raises(start_proof.ProofError, match="older than 5 minutes"):
        _prove(table, stale)
    fresh_enough = (datetime.now(UTC) - start_proof.WINDOW + timedelta(seconds=30)).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=fresh_enough):
        recent = _attach(credentials)
    assert _prove(table, recent).startswith("arn:aws:iam::123456789012:")


def test_execution_arns_name_their_state_machine() -> None:
    assert start_proof.execution_parts(EXECUTION) == (MACHINE, "run-1")
    with pytest.raises(ValueError, match="not a Step Functions execution ARN"):
        start_proof.execution_parts(MACHINE)

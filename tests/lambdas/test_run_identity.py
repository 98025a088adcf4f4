"""A run's identity: 64 bits of its execution ARN and start time, within SageMaker's name limits."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from lambdas.register.handler import LineageExistsError, _write_once
from lambdas.validate.request import RUN_ID_HEX, resolve, run_identity, start_time
from lambdas.validate.tuning import TUNING_JOB_NAME_LENGTH
from tests.lambdas.test_handlers import LIMITS, _example

ARN = "arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:run-1"
STARTED = "2026-11-23T21:00:00.000Z"
LONGEST_RUN = "r" * 40  # RUN_NAME allows 40 characters
TRAINING_JOB_NAME_LENGTH = 63  # SageMaker's limit on TrainingJobName


def test_the_identity_has_64_bits_and_depends_on_the_start_time_not_only_the_name() -> None:
    identity = run_identity(ARN, STARTED)
    assert len(identity) * 4 >= 64 and RUN_ID_HEX * 4 >= 64
    int(identity, 16)
    assert run_identity(ARN, STARTED) == identity  # a retried Validate resolves the same names
    # The same execution name reused after Step Functions forgot it: another identity.
    assert run_identity(ARN, "2027-02-23T21:00:00.000Z") != identity
    assert run_identity(ARN.replace("run-1", "run-2"), STARTED) != identity


def test_an_ended_executions_event_gives_the_start_its_identity_was_made_from() -> None:
    """EventBridge's startDate (epoch milliseconds) reads back as $$.Execution.StartTime wrote it, so the cleanup of
    an execution stopped from outside knows its run's names."""
    assert start_time(1795467600000) == STARTED
    assert start_time(1795467600007) == "2026-11-23T21:00:00.007Z"


def test_names_carry_the_whole_identity_within_sagemakers_limits() -> None:
    request = resolve(
        _example("single-node-ddp") | {"run_name": LONGEST_RUN},
        execution_name="run-1",
        limits=LIMITS,
        execution=ARN,
        started=STARTED,
    )
    identity = run_identity(ARN, STARTED)
    assert request["job_name_base"] == f"{LONGEST_RUN}-{identity}"
    assert len(f"{request['job_name_base']}-99999") <= TRAINING_JOB_NAME_LENGTH


def test_a_tuning_job_name_cuts_the_run_name_never_the_identity() -> None:
    tuning = {
        "objective": {"metric": "validation:loss", "type": "Minimize"},
        "max_jobs": 2,
        "max_parallel_jobs": 1,
        "ranges": {"lr": {"type": "continuous", "min": 0.0001, "max": 0.001}},
    }
    execution_input = _example("single-node-ddp") | {"run_name": LONGEST_RUN, "tuning": tuning}
    execution_input.pop("warm_pool_minutes", None)
    request = resolve(execution_input, execution_name="run-1", limits=LIMITS, execution=ARN, started=STARTED)
    name = request["tuning"]["job_name"]
    assert len(name) <= TUNING_JOB_NAME_LENGTH and name.endswith(f"-{run_identity(ARN, STARTED)}")


@mock_aws
def test_lineage_is_written_once_and_never_replaced() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="artifacts-bucket")
    key = "runs/r-0123456789abcdef/lineage/lineage.json"
    _write_once(s3, "artifacts-bucket", key, b'{"execution": "first"}', execution="first")
    with pytest.raises(LineageExistsError, match="written once"):
        _write_once(s3, "artifacts-bucket", key, b'{"execution": "second"}', execution="second")
    assert s3.get_object(Bucket="artifacts-bucket", Key=key)["Body"].read() == b'{"execution": "first"}'


@mock_aws
def test_a_retried_register_keeps_what_its_execution_wrote_first() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="artifacts-bucket")
    key = "runs/r-0123456789abcdef/lineage/lineage.json"
    _write_once(s3, "artifacts-bucket", key, b'{"attempt": 1}', execution="first")
    assert _write_once(s3, "artifacts-bucket", key, b'{"attempt": 2}', execution="first") == b'{"attempt": 1}'
    assert s3.get_object(Bucket="artifacts-bucket", Key=key)["Body"].read() == b'{"attempt": 1}'

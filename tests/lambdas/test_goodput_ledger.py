"""A finished job's goodput ledger, as the progress handlers write it: once, into the run's lineage."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from contract import goodput
from contract.layout import run_goodput, run_progress
from lambdas.batch.monitor import attempt_transitions
from lambdas.jobs.progress import record_goodput
from lambdas.sagemaker.monitor import sagemaker_transitions
from lambdas.shared.metrics import Metric, Stage, StageMetrics

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


class _Counted(StageMetrics):
    def __init__(self) -> None:
        super().__init__(Stage.TRAINING)
        self.recorded: list[tuple[Metric, float]] = []

    def record(self, metric: Metric, value: float = 1) -> None:
        super().record(metric, value)
        self.recorded.append((metric, value))


def _poll(run: str, *counts: int) -> Any:
    groups = [SimpleNamespace(instance_count=count) for count in counts]
    return SimpleNamespace(request=SimpleNamespace(job_name_base=run, instance_groups=groups))


@mock_aws
def test_the_ledger_is_written_once_and_counted_once() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    for bucket in ("ckpt", "art"):
        s3.create_bucket(Bucket=bucket)
    record = goodput.ProgressRecord("run-1", T0.isoformat(), 0, 40, T0.isoformat(), {"startup": 10.0, "train": 60.0})
    s3.put_object(Bucket="ckpt", Key=f"{run_progress('run')}{record.name}", Body=json.dumps(vars(record)))
    described = {
        "SecondaryStatusTransitions": [
            {"Status": "Downloading", "StartTime": T0 - timedelta(seconds=20), "EndTime": T0},
            {"Status": "Training", "StartTime": T0, "EndTime": T0 + timedelta(seconds=80)},
            {"Status": "Completed", "StartTime": T0 + timedelta(seconds=80)},
        ]
    }
    metrics = _Counted()

    def record_it() -> dict[str, Any]:
        return record_goodput(
            s3,
            checkpoints_bucket="ckpt",
            artifacts_bucket="art",
            poll=_poll("run", 2, 1),
            job="run-1",
            billed=(T0 - timedelta(seconds=20), T0 + timedelta(seconds=80)),
            transitions=sagemaker_transitions(described),
            into=metrics,
        )

    first = record_it()
    assert first["instances"] == 3 and first["billed_seconds"] == 100 and first["goodput"] == 0.6
    assert first["parts"]["provisioning"] == 20 and first["parts"]["other"] == 10
    stored = json.loads(s3.get_object(Bucket="art", Key=f"{run_goodput('run')}run-1.json")["Body"].read())
    assert stored == first
    assert metrics.recorded == [
        (Metric.BILLED_INSTANCE_SECONDS, 300.0),
        (Metric.PRODUCTIVE_INSTANCE_SECONDS, 180.0),
        (Metric.GOODPUT, 60.0),
    ]
    # A retried poll of the ended job: the same ledger, nothing counted twice.
    assert record_it() == first and len(metrics.recorded) == 3


def test_batch_attempts_are_training_and_the_gaps_between_them_stalls() -> None:
    ms = int(T0.timestamp() * 1000)
    described = {
        "attempts": [
            {"startedAt": ms + 40_000, "stoppedAt": ms + 90_000},
            {"startedAt": ms, "stoppedAt": ms + 30_000},
            {"startedAt": ms + 95_000},  # still running: not a span yet
        ]
    }
    transitions = attempt_transitions(described)
    assert [(t.status, (t.start - T0).seconds, (t.end or T0) - T0) for t in transitions] == [
        ("Training", 0, timedelta(seconds=30)),
        ("Restarting", 30, timedelta(seconds=40)),
        ("Training", 40, timedelta(seconds=90)),
    ]
    ledger = goodput.job_ledger(
        "b-1", instances=2, billed_start=T0, billed_end=T0 + timedelta(seconds=90), transitions=transitions, records=[]
    )
    assert ledger.parts["stalls"] == 10 and ledger.parts["other"] == 80 and ledger.unaccounted_seconds == 0


class _Failing:
    """An S3 client whose every listing fails with `code`."""

    def __init__(self, code: str, status: int) -> None:
        self.error = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "List")

    def get_paginator(self, _name: str) -> Any:
        raise self.error


def test_a_ledger_that_cannot_be_made_is_left_out_and_a_passing_fault_retried() -> None:
    def record_with(s3: Any) -> dict[str, Any] | None:
        return record_goodput(
            s3,
            checkpoints_bucket="ckpt",
            artifacts_bucket="art",
            poll=_poll("run", 1),
            job="run-1",
            billed=(T0, T0 + timedelta(seconds=10)),
            transitions=[],
            into=_Counted(),
        )

    # Accounting never ends a run: a fault that will not pass leaves the ledger out...
    assert record_with(_Failing("AccessDenied", 403)) is None
    # ...and one that passes is raised, for the state machine's retry.
    with pytest.raises(ClientError, match="SlowDown"):
        record_with(_Failing("SlowDown", 503))

"""A training job as the run report of `make demo` shows it, whichever backend ran it (localrun/report.py)."""

from __future__ import annotations

from dataclasses import dataclass

import boto3

from localrun.cfn import REGION
from training.layout import complete_steps, split_s3_uri
from training.metrics import TRAIN_LOSS, VALIDATION_LOSS, metric_series


@dataclass
class Job:
    """A training job as SageMaker describes it, with its log and its checkpoints in S3."""

    name: str
    log: str
    train_loss: list[tuple[int, float]]
    val_loss: list[tuple[int, float]]
    status: str
    secondary_status: str | None
    failure: str | None
    notes: list[str]
    transitions: list[str]
    metrics: dict[str, float]
    checkpoints_uri: str
    checkpoint_steps: list[int]


def loss_curve(logs: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) from a training log, the last value of each step."""
    series = metric_series(logs)
    return sorted(series.get(TRAIN_LOSS, {}).items()), sorted(series.get(VALIDATION_LOSS, {}).items())


def checkpoint_steps(checkpoints_uri: str) -> list[int]:
    """The steps of the complete checkpoints under a run's checkpoints URI in S3."""
    bucket, prefix = split_s3_uri(checkpoints_uri)
    listed = boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return complete_steps([o["Key"] for o in listed.get("Contents", [])])

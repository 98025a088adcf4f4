"""A training job as the run report of `make demo` shows it, whichever backend ran it (localrun/demo/report.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from contract.layout import LEDGER_CHANNEL, split_s3_uri
from contract.ledger import OPENED
from contract.metrics import TRAIN_LOSS, VALIDATION_LOSS, metric_series
from contract.stored_checkpoints import complete_checkpoints
from localrun.aws.cfn import REGION


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
    model_folder: Path | None = None
    """A fine-tuning job's model folder (Hugging Face layout), as its first host wrote it."""
    cluster: str = ""
    """The cluster its request asked for (`2 x ml.p5.48xlarge`); "" where the report does not name it."""


def loss_curve(logs: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) from a training log, the last value of each step."""
    series = metric_series(logs)
    return sorted(series.get(TRAIN_LOSS, {}).items()), sorted(series.get(VALIDATION_LOSS, {}).items())


_STEP = re.compile(r"\bstep=(\d+) loss=")
_RESUMED = re.compile(r"resumed from checkpoint step-(\d+)")


def interruptions(logs: str) -> list[tuple[int, int]]:
    """(last step logged before the interruption, step resumed from), for each resume after a logged step; a resume
    before any (`started_from`) is where the log's training began, not an interruption."""
    out: list[tuple[int, int]] = []
    last = None
    for line in logs.splitlines():
        if (resumed := _RESUMED.search(line)) and last is not None:
            out.append((last, int(resumed.group(1))))
        elif step := _STEP.search(line):
            last = int(step.group(1))
    return out


def started_from(logs: str) -> int | None:
    """The checkpoint step a training log began from (a resume before its first step), or None."""
    for line in logs.splitlines():
        if resumed := _RESUMED.search(line):
            return int(resumed.group(1))
        if _STEP.search(line):
            return None
    return None


def checkpoint_steps(checkpoints_uri: str) -> list[int]:
    """The steps of the complete checkpoints under a run's checkpoints URI in S3."""
    bucket, prefix = split_s3_uri(checkpoints_uri)
    return sorted(c.step for c in complete_checkpoints(boto3.client("s3", region_name=REGION), bucket, prefix))


def recorded_checkpoints(s3: Any, channels: list[dict[str, Any]]) -> list[str]:
    """The checkpoint records in the run's ledger, as the job's ledger channel names it (contract/ledger.py):
    the checkpoints a restarted job may resume from."""
    (channel,) = [c for c in channels if c["ChannelName"] == LEDGER_CHANNEL]
    bucket, prefix = split_s3_uri(channel["DataSource"]["S3DataSource"]["S3Uri"])
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return [o["Key"] for o in listed if o["Key"] != f"{prefix}{OPENED}"]

"""Pruning keeps the newest complete checkpoint of the run and of each tuning trial, whatever lies beside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lambdas.jobs.prune import prune_checkpoints
from tests.stored import CHECKPOINTS as BUCKET
from tests.stored import RUN, buckets, put_checkpoint


@pytest.fixture
def s3() -> Iterator[Any]:
    with buckets() as client:
        yield client


def _steps(s3: Any, prefix: str = RUN) -> list[str]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    return sorted({key[len(prefix) :].split("/")[0] for key in keys})


@pytest.mark.parametrize(
    "partial",
    [{"omit": ("__0_0.distcp",)}, {"omit": (".metadata",)}, {"manifest": b"{}"}, {"manifest": b"\x00"}],
    ids=["missing-shard", "missing-metadata", "empty-manifest", "garbage-manifest"],
)
def test_a_newer_partial_checkpoint_never_costs_the_newest_complete_one(s3: Any, partial: dict[str, Any]) -> None:
    for step in (5, 10):
        put_checkpoint(s3, BUCKET, RUN, step)
    put_checkpoint(s3, BUCKET, RUN, 20, **partial)
    result = prune_checkpoints(s3, BUCKET, RUN)
    assert _steps(s3) == ["step-10", "step-20"]
    assert [k["step"] for k in result["kept"]] == [10]


def test_older_debris_goes_and_a_run_with_nothing_complete_keeps_everything(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{RUN}step-3/__0_0.distcp", Body=b"interrupted")
    put_checkpoint(s3, BUCKET, RUN, 4, omit=("__0_0.distcp",))
    assert prune_checkpoints(s3, BUCKET, RUN) == {"kept": [], "deleted_objects": 0}
    assert _steps(s3) == ["step-3", "step-4"]
    put_checkpoint(s3, BUCKET, RUN, 8)
    prune_checkpoints(s3, BUCKET, RUN)
    assert _steps(s3) == ["step-8"]


def test_every_tuning_trial_keeps_its_newest_complete_checkpoint(s3: Any) -> None:
    best, other = f"{RUN}tune-001-aa/", f"{RUN}tune-002-bb/"
    for step in (10, 20):
        put_checkpoint(s3, BUCKET, best, step)
    for step in (30, 40):
        put_checkpoint(s3, BUCKET, other, step)
    put_checkpoint(s3, BUCKET, other, 50, omit=("__0_0.distcp",))
    prune_checkpoints(s3, BUCKET, RUN)
    assert _steps(s3, best) == ["step-20"]
    assert _steps(s3, other) == ["step-40", "step-50"]

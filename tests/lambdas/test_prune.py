"""Pruning keeps, of the run and of each tuning trial, the newest checkpoint the run may resume from (complete, and
as its ledger records it), whatever lies beside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from contract import ledger
from contract.stored_checkpoints import complete_checkpoints
from lambdas.jobs.environment import CleanupEnvironment
from lambdas.jobs.prune import prune_checkpoints
from tests.stored import ARTIFACTS, RUN, buckets, put_checkpoint
from tests.stored import CHECKPOINTS as BUCKET

STORES = CleanupEnvironment(checkpoints_bucket=BUCKET, artifacts_bucket=ARTIFACTS)


@pytest.fixture
def s3() -> Iterator[Any]:
    with buckets(BUCKET, ARTIFACTS) as client:
        yield client


def _steps(s3: Any, prefix: str = RUN) -> list[str]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    return sorted({key[len(prefix) :].split("/")[0] for key in keys})


def _polled(s3: Any) -> None:
    """What a poll of the run does: record its complete checkpoints in its ledger (lambdas/jobs/progress.py)."""
    stored = complete_checkpoints(s3, BUCKET, RUN)
    ledger.record_seen(s3, ARTIFACTS, "r-1", stored, job="r-1-1", execution="arn:execution")


@pytest.mark.parametrize(
    "partial",
    [{"omit": ("__0_0.distcp",)}, {"omit": (".metadata",)}, {"manifest": b"{}"}, {"manifest": b"\x00"}],
    ids=["missing-shard", "missing-metadata", "empty-manifest", "garbage-manifest"],
)
def test_a_newer_partial_checkpoint_never_costs_the_newest_complete_one(s3: Any, partial: dict[str, Any]) -> None:
    for step in (5, 10):
        put_checkpoint(s3, BUCKET, RUN, step)
    put_checkpoint(s3, BUCKET, RUN, 20, **partial)
    _polled(s3)
    result = prune_checkpoints(s3, STORES, "r-1")
    assert _steps(s3) == ["step-10", "step-20"]
    assert [k["step"] for k in result["kept"]] == [10]


def test_a_recorded_checkpoint_changed_since_never_costs_the_intact_one_before_it(s3: Any) -> None:
    """Its bytes changed after the platform recorded it (another run's code wrote into the prefix): the run can no
    longer resume from it, so the intact step-5 is what it keeps; step-10 is newer and is left as it is."""
    for step in (2, 5, 10):
        put_checkpoint(s3, BUCKET, RUN, step)
    _polled(s3)
    put_checkpoint(s3, BUCKET, RUN, 10, files={".metadata": b"planted", "__0_0.distcp": b"planted"})
    result = prune_checkpoints(s3, STORES, "r-1")
    assert [k["step"] for k in result["kept"]] == [5]
    assert _steps(s3) == ["step-10", "step-5"]


def test_a_complete_checkpoint_the_ledger_never_recorded_is_not_what_is_kept(s3: Any) -> None:
    put_checkpoint(s3, BUCKET, RUN, 5)
    _polled(s3)
    put_checkpoint(s3, BUCKET, RUN, 10)  # planted after the last poll, or written after it: not the run's own yet
    prune_checkpoints(s3, STORES, "r-1")
    assert _steps(s3) == ["step-10", "step-5"]


def test_older_debris_goes_and_a_run_with_nothing_resumable_keeps_everything(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{RUN}step-3/__0_0.distcp", Body=b"interrupted")
    put_checkpoint(s3, BUCKET, RUN, 4, omit=("__0_0.distcp",))
    assert prune_checkpoints(s3, STORES, "r-1") == {"kept": [], "deleted_objects": 0}
    assert _steps(s3) == ["step-3", "step-4"]
    put_checkpoint(s3, BUCKET, RUN, 8)
    prune_checkpoints(s3, STORES, "r-1")  # complete, but no ledger records it
    assert _steps(s3) == ["step-3", "step-4", "step-8"]
    _polled(s3)
    prune_checkpoints(s3, STORES, "r-1")
    assert _steps(s3) == ["step-8"]


def test_every_tuning_trial_keeps_its_newest_resumable_checkpoint(s3: Any) -> None:
    best, other = f"{RUN}tune-001-aa/", f"{RUN}tune-002-bb/"
    for step in (10, 20):
        put_checkpoint(s3, BUCKET, best, step)
    for step in (30, 40):
        put_checkpoint(s3, BUCKET, other, step)
    put_checkpoint(s3, BUCKET, other, 50, omit=("__0_0.distcp",))
    _polled(s3)
    prune_checkpoints(s3, STORES, "r-1")
    assert _steps(s3, best) == ["step-20"]
    assert _steps(s3, other) == ["step-40", "step-50"]

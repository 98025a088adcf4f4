"""The checkpoint ledger: written once per checkpoint, read back by jobs as the digests they may load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract import ledger
from contract.layout import run_checkpoints, run_ledger
from contract.stored_checkpoints import complete_checkpoints
from tests.stored import ARTIFACTS, CHECKPOINTS, buckets, put_checkpoint


@pytest.fixture
def s3() -> Iterator[Any]:
    with buckets(CHECKPOINTS, ARTIFACTS) as client:
        yield client


def _seen(s3: Any, run: str = "r-1") -> ledger.Seen:
    stored = complete_checkpoints(s3, CHECKPOINTS, run_checkpoints(run))
    return ledger.record_seen(s3, ARTIFACTS, run, stored, job=f"{run}-1", execution="arn:execution")


def test_each_complete_checkpoint_is_recorded_once_as_first_seen(s3: Any) -> None:
    first = put_checkpoint(s3, CHECKPOINTS, run_checkpoints("r-1"), 10)
    put_checkpoint(s3, CHECKPOINTS, run_checkpoints("r-1"), 20, omit=("__0_0.distcp",))  # not complete: not recorded
    assert [(r.checkpoint, r.manifest_sha256) for r in _seen(s3).recorded] == [("step-10/", first)]
    assert _seen(s3).recorded == []  # nothing new
    assert [r.step for r in ledger.records(s3, ARTIFACTS, "r-1")] == [10]


def test_a_checkpoint_changed_after_it_was_recorded_is_reported_and_its_record_stands(s3: Any) -> None:
    first = put_checkpoint(s3, CHECKPOINTS, run_checkpoints("r-1"), 10)
    _seen(s3)
    put_checkpoint(s3, CHECKPOINTS, run_checkpoints("r-1"), 10, files={".metadata": b"other", "__0_0.distcp": b"x"})
    seen = _seen(s3)
    assert seen.not_as_recorded == [f"s3://{CHECKPOINTS}/{run_checkpoints('r-1')}step-10/"]
    assert [r.manifest_sha256 for r in ledger.records(s3, ARTIFACTS, "r-1")] == [first]


def test_a_record_is_never_replaced(s3: Any) -> None:
    kwargs = {"checkpoint": "step-1/", "step": 1, "job": "r-1-1", "execution": "e"}
    original = ledger.record(s3, ARTIFACTS, "r-1", manifest_sha256="a" * 64, **kwargs)
    again = ledger.record(s3, ARTIFACTS, "r-1", manifest_sha256="b" * 64, **kwargs)
    assert again == original


def test_tuning_trials_are_recorded_under_their_own_directory(s3: Any) -> None:
    put_checkpoint(s3, CHECKPOINTS, f"{run_checkpoints('r-1')}tune-001-aa/", 5)
    assert [r.checkpoint for r in _seen(s3).recorded] == ["tune-001-aa/step-5/"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=ARTIFACTS)["Contents"]]
    assert keys == [f"{run_ledger('r-1')}tune-001-aa/step-5.json"]


def test_the_ledger_channel_gives_a_job_the_records_of_its_own_checkpoints(s3: Any, tmp_path: Path) -> None:
    assert ledger.delivered(tmp_path / "absent", job="r-1-1") is None
    digest = put_checkpoint(s3, CHECKPOINTS, run_checkpoints("r-1"), 10)
    trial = put_checkpoint(s3, CHECKPOINTS, f"{run_checkpoints('r-1')}tune-001-aa/", 5)
    ledger.open_ledger(s3, ARTIFACTS, "r-1", execution="e", continues=None)
    _seen(s3)
    channel = tmp_path / "ledger"
    for obj in s3.list_objects_v2(Bucket=ARTIFACTS, Prefix=run_ledger("r-1"))["Contents"]:
        target = channel / obj["Key"].removeprefix(run_ledger("r-1"))
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(ARTIFACTS, obj["Key"], str(target))
    # A job's checkpoints are the run's (a single job) or its own folder's (a tuning trial, which SageMaker names).
    assert ledger.delivered(channel, job="r-1-1") == ledger.Recorded({"step-10/": digest})
    assert ledger.delivered(channel, job="tune-001-aa") == ledger.Recorded({"step-10/": digest, "step-5/": trial})
    assert ledger.delivered(channel, job="tune-002-bb") == ledger.Recorded({"step-10/": digest})


def test_a_checkpoint_may_be_resumed_from_only_as_its_own_record_holds_it(s3: Any) -> None:
    """Complete and with the manifest recorded of its own directory: not changed since, not recorded elsewhere."""
    run = run_checkpoints("r-1")
    intact = put_checkpoint(s3, CHECKPOINTS, run, 5)
    changed = put_checkpoint(s3, CHECKPOINTS, run, 10)
    _seen(s3)
    put_checkpoint(s3, CHECKPOINTS, run, 10, files={".metadata": b"other", "__0_0.distcp": b"x"})
    put_checkpoint(s3, CHECKPOINTS, run, 15, omit=("__0_0.distcp",))  # recorded never: not complete
    stored = complete_checkpoints(s3, CHECKPOINTS, run)
    recorded = ledger.recorded(s3, ARTIFACTS, "r-1")
    assert recorded == ledger.Recorded({"step-5/": intact, "step-10/": changed})
    assert [c.step for c in ledger.resumable(stored, recorded, "r-1")] == [5]
    assert not recorded.admits("step-15/", intact)

"""The goodput ledger: the trainer's progress records and a job's billed time split into its parts."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from contract import goodput, hang
from contract.goodput import JobLedger, ProgressRecord, ProgressWriter, RunLedger, Transition, job_ledger
from contract.layout import JOB_NAME_ENV, LAUNCHED_ENV, run_goodput, run_progress

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _record(job: str, started: float, *, step: int, **phases: float) -> ProgressRecord:
    return ProgressRecord(job, _at(started).isoformat(), 0, step, _at(started + 1).isoformat(), phases)


def test_a_spot_restarted_job_splits_its_billed_time_into_measured_parts() -> None:
    # SageMaker's transitions: downloading, training, a reclaim, a restart, training again, the upload.
    transitions = [
        Transition("Starting", _at(-30), _at(0)),  # before TrainingStartTime: not billed
        Transition("Downloading", _at(0), _at(5)),
        Transition("Training", _at(5), _at(45)),
        Transition("Interrupted", _at(45), _at(55)),
        Transition("Downloading", _at(55), _at(58)),
        Transition("Training", _at(58), _at(98)),
        Transition("Uploading", _at(98), _at(100)),
        Transition("Completed", _at(100)),
    ]
    records = [
        _record("job-1", 5, step=30, startup=6, train=28, checkpoint=2, eval=1),
        _record("job-1", 58, step=60, startup=6, checkpoint_load=1, rework=4, train=25, checkpoint=2, export=1),
    ]
    ledger = job_ledger(
        "job-1", instances=2, billed_start=_at(0), billed_end=_at(100), transitions=transitions, records=records
    )
    assert ledger.billed_seconds == 100
    assert ledger.parts == {
        "provisioning": 8.0,
        "startup": 12.0,
        "preflight": 0.0,
        "checkpoint_load": 1.0,
        "productive": 53.0,
        "rework": 4.0,
        "checkpoint": 4.0,
        "eval": 1.0,
        "export": 1.0,
        "other": 80.0 - 76.0,  # container time outside every phase
        "upload": 2.0,
        "stalls": 10.0,
    }
    assert ledger.unaccounted_seconds == 0 and ledger.starts == 2
    assert ledger.goodput == pytest.approx(0.53)


def test_transitions_without_an_end_last_until_the_next_and_are_clipped_to_the_billed_interval() -> None:
    transitions = [
        Transition("Starting", _at(-20)),
        Transition("Downloading", _at(-2)),  # begun before billing: only its billed part counts
        Transition("Training", _at(3)),
        Transition("Completed", _at(50)),
    ]
    ledger = job_ledger(
        "j-1", instances=1, billed_start=_at(0), billed_end=_at(50), transitions=transitions, records=[]
    )
    assert ledger.parts["provisioning"] == 3.0 and ledger.parts["other"] == 47.0
    assert sum(ledger.parts.values()) == ledger.billed_seconds and ledger.goodput == 0


def test_a_gap_the_transitions_leave_is_unaccounted_not_hidden() -> None:
    transitions = [Transition("Training", _at(0), _at(40)), Transition("Completed", _at(50))]
    ledger = job_ledger(
        "j-1", instances=1, billed_start=_at(0), billed_end=_at(60), transitions=transitions, records=[]
    )
    # Nothing held from 40 to 50, and "Completed" (from 50) is no part: twenty seconds are in none.
    assert ledger.unaccounted_seconds == 20.0


def test_phases_longer_than_the_container_are_bounded_by_it_and_say_so() -> None:
    transitions = [Transition("Training", _at(0), _at(10))]
    ledger = job_ledger(
        "j-1",
        instances=1,
        billed_start=_at(0),
        billed_end=_at(10),
        transitions=transitions,
        records=[_record("j-1", 0, step=5, train=10.2)],
    )
    assert ledger.parts["other"] == 0.0 and ledger.parts["productive"] == 10.0 and ledger.bounded_seconds == 0.2


def test_a_hang_is_a_stall_taken_from_the_container_time_no_phase_holds() -> None:
    transitions = [Transition("Training", _at(0), _at(100))]
    records = [_record("j-1", 0, step=30, startup=5, train=40)]
    kwargs = {"instances": 1, "billed_start": _at(0), "billed_end": _at(100), "transitions": transitions}
    hung = job_ledger("j-1", **kwargs, records=records, hung_seconds=45)  # type: ignore[arg-type]
    assert (hung.parts["stalls"], hung.parts["other"]) == (45.0, 10.0)
    # Never more than the container time outside the phases.
    longer = job_ledger("j-1", **kwargs, records=records, hung_seconds=600)  # type: ignore[arg-type]
    assert (longer.parts["stalls"], longer.parts["other"]) == (55.0, 0.0) and longer.unaccounted_seconds == 0
    reason = "AlgorithmError: HangDetected: no training step for 45 s after step 30 on algo-1"
    assert hang.hung_seconds(reason) == 45 and hang.hung_seconds("AlgorithmError: out of memory") == 0


def test_without_transitions_the_billed_interval_ran_the_container() -> None:
    ledger = job_ledger(
        "batch-1",
        instances=2,
        billed_start=_at(0),
        billed_end=_at(20),
        transitions=[],
        records=[_record("batch-1", 0, step=9, startup=5, train=12)],
    )
    assert ledger.parts["other"] == 3.0 and ledger.parts["provisioning"] == 0.0 and ledger.goodput == 0.6


def test_a_run_weighs_each_job_by_its_instances() -> None:
    parts = dict.fromkeys(goodput.PARTS, 0.0)
    small = JobLedger("a-1", 1, 100.0, parts | {"productive": 10.0, "stalls": 90.0}, 0.0, 1)
    large = JobLedger("a-2", 4, 100.0, parts | {"productive": 90.0, "other": 10.0}, 0.0, 1)
    run = RunLedger([small, large])
    assert run.billed_instance_seconds == 500 and run.goodput == pytest.approx((10 + 360) / 500)
    assert JobLedger.from_json(json.loads(json.dumps(large.to_json()))) == large
    assert run.summary().startswith("74.0% of 500.0 billed instance-seconds (productive 370.0 s (74%), stalls 90.0 s")


def test_the_writer_keeps_one_record_per_start_and_rewrites_it_when_due(tmp_path: Path) -> None:
    started = time.monotonic() - 3
    writer = ProgressWriter(tmp_path, job="run-1", started=started, first_step=20)
    assert writer.write(21, {"startup": 2.5, "train": 0.5})
    assert not writer.write(22, {"startup": 2.5, "train": 0.9}, due_only=True)  # within PROGRESS_SECONDS
    assert writer.write(40, {"startup": 2.5, "train": 9.0, "checkpoint": 0.4})  # a checkpoint: always
    (record,) = goodput.local_records(tmp_path)
    assert (record.job, record.first_step, record.step) == ("run-1", 20, 40)
    assert record.phases == {"startup": 2.5, "train": 9.0, "checkpoint": 0.4}
    # Its clock began `started`: the record's start is about three seconds ago.
    age = (datetime.now(UTC) - datetime.fromisoformat(record.started_at)).total_seconds()
    assert 2.5 < age < 10
    assert [p.name for p in (tmp_path / "progress").iterdir()] == [writer.path.name]


def test_the_furthest_step_is_an_earlier_starts_not_this_ones(tmp_path: Path) -> None:
    earlier = ProgressWriter(tmp_path, job="run-1", started=time.monotonic() - 60, first_step=0)
    earlier.write(37, {"train": 30.0})
    now = ProgressWriter(tmp_path, job="run-1", started=time.monotonic(), first_step=20)
    now.write(90, {"train": 1.0})
    records = goodput.local_records(tmp_path)
    assert goodput.furthest_step(records, besides=now.path) == 37
    assert goodput.furthest_step([], besides=now.path) == 0


@pytest.mark.parametrize(
    "body",
    [
        '{"job": "j", "started_at": "2026-11-26T12:00:00+00:00", "first_step": 0, "step": 1e999, "updated_at": "x"}',
        "[" * 100_000,
        json.dumps({**vars(_record("j", 0, step=3)), "phases": {"train": float("nan")}}),
        json.dumps({**vars(_record("j", 0, step=3)), "phases": {"train": 1e6, "startup": -1e6}}),
        json.dumps({**vars(_record("j", 0, step=-3))}),
        json.dumps({**vars(_record("j", 0, step=3)), "updated_at": "yesterday"}),
    ],
)
def test_a_malformed_or_hostile_record_is_no_record(body: str) -> None:
    assert goodput.parse_record(body) is None


def test_a_reclaims_notice_while_the_processes_still_checkpoint_is_their_time_not_a_stall() -> None:
    # Interrupted at 40 while the first start's processes ran (their phases) until 45.
    transitions = [
        Transition("Training", _at(0), _at(40)),
        Transition("Interrupted", _at(40), _at(55)),
        Transition("Training", _at(55), _at(100)),
    ]
    records = [_record("j-1", 0, step=30, startup=5, train=38, checkpoint=2), _record("j-1", 55, step=60, train=44)]
    kwargs = {"instances": 1, "billed_start": _at(0), "billed_end": _at(100), "transitions": transitions}
    ledger = job_ledger("j-1", **kwargs, records=records)  # type: ignore[arg-type]
    assert ledger.parts["stalls"] == 10.0 and ledger.parts["other"] == 1.0 and ledger.unaccounted_seconds == 0
    # Phases the container cannot hold are scaled down to it, and the ledger says by how much.
    longer = [_record("j-1", 0, step=30, train=60), _record("j-1", 55, step=60, train=44)]
    over = job_ledger("j-1", **kwargs, records=longer)  # type: ignore[arg-type]
    assert over.bounded_seconds == 4.0 and over.unaccounted_seconds == 0  # 104 s of phases in 100 s of container
    assert over.parts["productive"] == 100.0 and sum(over.parts.values()) == 100.0


def test_records_that_are_not_records_are_ignored() -> None:
    assert goodput.parse_record(b"not json") is None
    assert goodput.parse_record(json.dumps({"job": "x"})) is None
    body = json.dumps({**vars(_record("j", 0, step=3, train=1.0)), "phases": {"train": 1.0, "invented": 9}})
    parsed = goodput.parse_record(body)
    assert parsed is not None and parsed.phases == {"train": 1.0}


@mock_aws
def test_stored_records_are_the_jobs_own_not_a_longer_names() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    for job, started, step in (("run-1", 0, 5), ("run-1", 50, 9), ("run-12", 10, 99)):
        record = _record(job, started, step=step, train=1.0)
        s3.put_object(Bucket="ckpt", Key=f"{run_progress('run')}{record.name}", Body=json.dumps(vars(record)))
    s3.put_object(Bucket="ckpt", Key=f"{run_progress('run')}run-1-notes.json", Body=b"{}")
    assert [r.step for r in goodput.stored_records(s3, "ckpt", "run", "run-1")] == [5, 9]


@mock_aws
def test_stored_ledgers_are_the_runs_jobs() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="art")
    parts = dict.fromkeys(goodput.PARTS, 0.0) | {"productive": 5.0, "other": 5.0}
    for job in ("run-1", "run-2"):
        body = JobLedger(job, 2, 10.0, parts, 0.0, 1).to_json()
        s3.put_object(Bucket="art", Key=f"{run_goodput('run')}{job}.json", Body=json.dumps(body))
    ledgers = goodput.stored_ledgers(s3, "art", "run")
    assert [j.job for j in ledgers.jobs] == ["run-1", "run-2"] and ledgers.goodput == 0.5
    assert goodput.stored_ledgers(s3, "art", "other-run").jobs == []


def test_the_trainers_clock_starts_at_the_launchers_start_on_this_host_only() -> None:
    now = time.monotonic()
    assert goodput.launched({LAUNCHED_ENV: repr(now - 4)}, now) == now - 4
    assert goodput.launched({LAUNCHED_ENV: repr(now + 50)}, now) == now  # another host's clock
    assert goodput.launched({LAUNCHED_ENV: repr(now - 7200)}, now) == now - 7200  # a long download first
    assert goodput.launched({LAUNCHED_ENV: repr(now - 90000)}, now) == now  # stale
    assert goodput.launched({LAUNCHED_ENV: "soon"}, now) == now
    assert goodput.launched({}, now) == now
    assert goodput.job_name({JOB_NAME_ENV: "run-3"}) == "run-3" and goodput.job_name({}) == "local"

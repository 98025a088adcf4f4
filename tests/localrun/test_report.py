"""The run report's sections that read a job's log and the run's goodput ledgers."""

from __future__ import annotations

from pathlib import Path

from contract import goodput
from contract.goodput import JobLedger, RunLedger
from localrun.demo.jobs import Job
from localrun.demo.report import _render_job, compact_states, render_goodput
from training.stragglers import Straggler


def _job(log: str) -> Job:
    return Job(
        name="run-1",
        log=log,
        train_loss=[],
        val_loss=[],
        status="Completed",
        secondary_status="Completed",
        failure=None,
        notes=[],
        transitions=["Training", "Completed"],
        metrics={},
        checkpoints_uri="s3://ckpt/runs/run/checkpoints/",
        checkpoint_steps=[10],
    )


def test_a_job_names_the_stragglers_its_log_named(tmp_path: Path) -> None:
    slow = Straggler("algo-2", (1,), 1.31, 50, 1200)
    log = f"step=1200 loss=2.0 lr=0.1 grad_norm=1.0 tokens_per_sec=9.0\nWARNING trainer: {slow.log_line()}\n"
    lines = _render_job(_job(log), tmp_path)
    assert f"Straggler: {slow.describe()}" in lines
    assert not [line for line in _render_job(_job("step=1 loss=2.0\n"), tmp_path) if line.startswith("Straggler")]


def test_the_goodput_section_has_the_run_and_each_jobs_parts() -> None:
    parts = dict.fromkeys(goodput.PARTS, 0.0) | {"productive": 60.0, "rework": 5.0, "stalls": 15.0, "other": 20.0}
    lines = render_goodput(RunLedger([JobLedger("run-1", 2, 100.0, parts, 0.0, 2)]))
    assert "Goodput: 60.0% of 200.0 billed instance-seconds (productive 120.0 s (60%), other 40.0 s (20%)," in (
        "\n".join(lines)
    )
    (row,) = [line for line in lines if line.startswith("| run-1 ")]
    assert row.startswith("| run-1 | 2 | 100.0 | 0.0 |") and row.endswith("| 60.0% |")


def test_a_job_that_began_from_a_checkpoint_was_not_interrupted(tmp_path: Path) -> None:
    began = "INFO trainer: resumed from checkpoint step-108 (110592 tokens consumed)\nstep=110 loss=2.1\n"
    lines = _render_job(_job(began), tmp_path)
    assert "Started from the checkpoint of step 108" in lines
    assert not [line for line in lines if line.startswith("Interrupted")]
    restarted = "step=40 loss=3.0\nINFO trainer: resumed from checkpoint step-40\nstep=41 loss=2.9\n"
    lines = _render_job(_job(restarted), tmp_path)
    assert "Interrupted after step 40; resumed from the checkpoint of step 40" in lines
    assert not [line for line in lines if line.startswith("Started from")]


def test_the_states_table_gives_a_polling_loop_one_row_per_state_with_how_often() -> None:
    poll = [("Wait for training", 2.0), ("Check progress", 0.5), ("Job finished?", 0.0)]
    states = [("Receive input", 0.0), ("Create training job", 0.2), *poll * 3, ("Wait for training", 2.0)]
    states += [("Check progress", 0.5), ("Prune checkpoints", 1.0), ("Model promoted", 0.0)]
    assert compact_states(states) == [
        ("Receive input", 1, 0.0),
        ("Create training job", 1, 0.2),
        ("Wait for training", 4, 8.0),
        ("Check progress", 4, 2.0),
        ("Job finished?", 3, 0.0),
        ("Prune checkpoints", 1, 1.0),
        ("Model promoted", 1, 0.0),
    ]
    # A state entered twice in a row is a loop of one; states that do not repeat are their own rows.
    assert compact_states([("A", 1.0), ("A", 1.0), ("B", 1.0), ("A", 1.0)]) == [
        ("A", 2, 2.0),
        ("B", 1, 1.0),
        ("A", 1, 1.0),
    ]

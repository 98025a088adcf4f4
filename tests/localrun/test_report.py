"""The run report's sections that read a job's log and the run's goodput ledgers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from contract import goodput
from contract.execution_state import JobCost
from contract.goodput import JobLedger, RunLedger
from localrun.demo.jobs import Job
from localrun.demo.report import (
    RUN_TOKENS,
    Charge,
    RunFacts,
    TeamAttempt,
    TeamRun,
    _render_job,
    compact_states,
    render,
    render_goodput,
    render_teams,
    save,
    save_teams,
    team_loss_chart,
    throughputs,
)
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


def test_the_report_charts_every_jobs_tokens_per_second_on_one_chart(tmp_path: Path) -> None:
    def train(step: int, rate: float) -> str:
        return f"step={step} loss=2.0 lr=0.1 grad_norm=1.0 tokens_per_sec={rate}\n"

    first = replace(_job(train(5, 900.0) + train(10, 1000.0) + train(15, 1100.0)), name="run-1")
    second = replace(_job(train(20, 500.0) + train(25, 700.0)), name="run-2")
    silent = replace(_job("step=1 val_loss=3.0\n"), name="run-3")  # reported no throughput: not charted
    facts = RunFacts("run", "SUCCEEDED", None, None, [], None, [first, second, silent], [], [], [], [], [], [])
    assert throughputs(facts.jobs) == {
        "run-1": [(5, 900.0), (10, 1000.0), (15, 1100.0)],
        "run-2": [(20, 500.0), (25, 700.0)],
    }
    save(facts, tmp_path)
    assert (tmp_path / RUN_TOKENS).read_bytes().startswith(b"\x89PNG")
    text = render(facts, tmp_path)
    section = text.split("\n## Throughput\n", 1)[1].split("\n## ", 1)[0]
    assert f"![tokens/s across the run's jobs]({RUN_TOKENS})" in section
    assert "| run-1 | 3 | 1,000 | 1,100 |" in section and "| run-2 | 2 | 600 | 700 |" in section
    assert "run-3" not in section


def test_the_teams_report_shows_each_teams_cost_and_loss_curves(tmp_path: Path) -> None:
    def run(run_id: str, team: str, usd: float, losses: dict[int, float]) -> TeamRun:
        attempts = [TeamAttempt(f"{run_id}-1", "", losses, "", False)] if losses else []
        cost = JobCost(actual_usd=usd, on_demand_usd=usd, spot_savings_usd=0.0)
        charged = [Charge(f"{run_id}-1", 60, cost)] if losses else []
        return TeamRun(run_id, team, "arn:aws:iam::1:role/x", "arn", "SUCCEEDED", "SUCCEEDED", None, None, 1.0,
                       "SUCCEEDED", attempts, charges=charged)  # fmt: skip

    runs = [
        run("a-first", "team-a", 0.0125, {1: 3.0, 2: 2.5}),
        run("a-second", "team-a", 0.0075, {1: 3.1}),
        run("b-own", "team-b", 0.002, {5: 2.0}),
        run("b-refused", "team-b", 0.0, {}),
    ]
    save_teams(runs, tmp_path)
    for team in ("team-a", "team-b"):
        assert (tmp_path / team_loss_chart(team)).read_bytes().startswith(b"\x89PNG")
    text = render_teams(runs, [], [])
    section = text.split("\n## Cost and loss by team\n", 1)[1].split("\n## ", 1)[0]
    assert "| team-a | 2 | 2 | $0.0200 |" in section and "| team-b | 2 | 1 | $0.0020 |" in section
    assert f"![team team-a: loss]({team_loss_chart('team-a')})" in section
    assert f"![team team-b: loss]({team_loss_chart('team-b')})" in section

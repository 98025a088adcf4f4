"""Hang detection: the workers' step reports, the launcher's judgement of them, and a worker that hangs."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from training_helpers import TINY_JOB, clean_env, free_port, launcher, make_opt_ml, run

from training.checkpoint import committed_steps
from training.config import ConfigError, from_hyperparameters
from training.hang import Hang, HangWatch, StepReport, newest_step
from training.launcher import EXIT_HANG_DETECTED
from training.layout import HANG_DETECTED, HEARTBEAT_ENV, RETRIED_ON_FRESH_NODES


def _watch(tmp_path: Path, **limits: float) -> HangWatch:
    settings = {"fixed_seconds": 0.0, "floor_seconds": 60.0, "factor": 5.0, **limits}
    return HangWatch(tmp_path, host="algo-2", last_step=100, **settings)


def test_nothing_is_judged_before_training_starts(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    # The pre-flight check and the checkpoint load: no worker has reported its loop started.
    assert watch.observe(None, 0.0) is None
    assert watch.observe(None, 10_000.0) is None


def test_the_first_step_is_judged_against_the_floor(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    assert watch.observe(40, 1000.0) is None  # the loop started at step 40 (a resume)
    assert watch.observe(40, 1060.0) is None  # at the floor: not yet
    hang = watch.observe(40, 1061.0)
    assert hang == Hang(seconds=61.0, step=40, host="algo-2", limit=60.0)
    assert hang.line() == "HangDetected: no training step for 61 s after step 40 on algo-2"


def test_the_derived_limit_grows_with_the_longest_interval_so_a_long_save_is_no_hang(tmp_path: Path) -> None:
    watch = _watch(tmp_path)
    now = 0.0
    for step in range(1, 11):  # steps of 1 s: the floor applies
        assert watch.observe(step, now) is None
        now += 1.0
    assert watch.limit == 60.0
    # A 50 s checkpoint save between steps 10 and 11, under the floor: no hang, and the limit becomes 5 x 50 s.
    assert watch.observe(10, now + 49.0) is None
    assert watch.observe(11, now + 50.0) is None
    assert (watch.longest, watch.limit) == (51.0, 255.0)
    now += 50.0
    assert watch.observe(11, now + 200.0) is None  # past the floor, within the derived limit
    hang = watch.observe(11, now + 256.0)
    assert hang is not None and (hang.step, hang.seconds, hang.limit) == (11, 256.0, 255.0)


def test_a_fixed_limit_ignores_the_observed_intervals(tmp_path: Path) -> None:
    watch = _watch(tmp_path, fixed_seconds=30.0)
    watch.observe(1, 0.0)
    watch.observe(2, 100.0)  # a slow step would raise a derived limit, not this one
    assert watch.limit == 30.0
    assert watch.observe(2, 130.0) is None
    assert watch.observe(2, 131.0) is not None


def test_after_the_last_step_nothing_is_judged(tmp_path: Path) -> None:
    # The final evaluation and the export follow the last step: they may take long and report no step.
    watch = _watch(tmp_path)
    watch.observe(99, 0.0)
    watch.observe(100, 1.0)
    assert watch.observe(100, 10_000.0) is None


def test_workers_report_to_the_directory_the_launcher_names_and_the_newest_step_counts(tmp_path: Path) -> None:
    assert newest_step(tmp_path) is None
    env = {HEARTBEAT_ENV: str(tmp_path / "beats")}
    first, second = StepReport.from_env(env, 0), StepReport.from_env(env, 1)
    first(12)
    second(11)
    assert newest_step(tmp_path / "beats") == 12
    second(13)
    assert newest_step(tmp_path / "beats") == 13
    assert sorted(p.name for p in (tmp_path / "beats").iterdir()) == ["rank-0.step", "rank-1.step"]


def test_without_a_launcher_watching_a_worker_reports_nothing(tmp_path: Path) -> None:
    report = StepReport.from_env({}, 0)
    report(5)
    assert report.path is None


def test_the_watch_reads_the_reports_at_most_once_a_second(tmp_path: Path) -> None:
    watch = _watch(tmp_path, floor_seconds=0.5)
    report = StepReport(tmp_path / "rank-0.step")
    report(3)
    assert watch.check(0.0) is None  # started at step 3
    assert watch.check(0.9) is None  # past the limit, but not read again yet
    hang = watch.check(1.0)
    assert hang is not None and hang.step == 3


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hang.action", "kill", "hang.action='kill' is invalid: choose one of replace, off"),
        ("hang.minutes", "-1", "hang.minutes=-1.0 is invalid: use > 0 for a fixed limit, or 0 to derive it"),
        ("hang.floor_minutes", "0", "hang.floor_minutes=0.0 is invalid: use > 0, e.g. 10"),
        ("hang.factor", "0.5", "hang.factor=0.5 is invalid: use >= 1, e.g. 5"),
    ],
)
def test_bad_hang_settings_say_how_to_fix_them(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"hyperparameter {message}")):
        from_hyperparameters({key: value})


def test_the_pipeline_retries_a_hang_on_fresh_nodes() -> None:
    assert HANG_DETECTED == "HangDetected" and HANG_DETECTED in RETRIED_ON_FRESH_NODES
    assert from_hyperparameters({}).hang.action == "replace"


# GPT-2 whose 7th forward pass never returns: a worker that stops making progress mid-run, as one stuck in a
# collective does (on this one-process host nothing else would notice).
HANGS_AT_STEP_7 = """
import time
from torch import nn
from training.models.gpt2 import GPT2


class Hangs(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.inner = GPT2(args)
        self.layers = self.inner.layers
        self.calls = 0

    def forward(self, idx):
        self.calls += 1
        if self.calls == 7:
            time.sleep(3600)
        return self.inner(idx)


def build(args):
    return Hangs(args)
"""


@pytest.mark.slow
def test_a_worker_that_stops_making_progress_is_killed_and_the_job_fails_with_hang_detected(
    tmp_path: Path, corpus: Path
) -> None:
    job = {
        **TINY_JOB,
        "max_steps": "20",
        "checkpoint.interval_steps": "4",
        "eval.interval_steps": "0",
        "model.factory": "model:build",
        "hang.floor_minutes": "0.05",  # 3 s; the tiny steps make the derived limit no longer
    }
    paths = make_opt_ml(tmp_path, job, corpus=corpus)
    paths.channel("code").mkdir(parents=True)
    (paths.channel("code") / "model.py").write_text(HANGS_AT_STEP_7)
    started = time.monotonic()
    env = clean_env(tmp_path, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=str(free_port()))
    result = run(launcher(), env, timeout=120)
    log = result.stdout
    assert result.returncode == EXIT_HANG_DETECTED, log[-3000:]
    first = paths.failure.read_text().splitlines()[0]
    found = re.fullmatch(r"HangDetected: no training step for (\d+) s after step 6 on algo-1", first)
    assert found, first
    assert 3 <= int(found.group(1)) <= 15  # the 3 s floor, read once a second (a loaded machine reads later)
    assert "step=6 loss=" in log and "step=7 loss=" not in log
    assert "(the hang limit is 3 s, see hang.* in training/README.md): killing the workers" in log
    assert committed_steps(paths.checkpoints) == [4]  # what the retry on fresh nodes resumes from
    assert time.monotonic() - started < 100

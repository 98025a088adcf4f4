"""Hang detection: the workers' step reports, the launcher's judgement of them, and a worker that hangs."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from test_launcher_contract import _two_hosts
from training_helpers import REPO, TINY_JOB, clean_env, free_port, launcher, make_opt_ml, run

from contract.config import ConfigError, from_hyperparameters
from contract.hang import Hang, StepReport, newest_step
from contract.layout import HANG_DETECTED, HEARTBEAT_ENV, RETRIED_ON_FRESH_NODES
from training.checkpoint import committed_steps
from training.hang import HangWatch
from training.launcher import EXIT_FAILED, EXIT_HANG_DETECTED, Launch, LaunchPlan, Supervisor, _hang_watch, _outcome
from training.sagemaker_contract import Paths, ResourceConfig


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


def test_workers_that_fail_after_a_stall_of_about_the_limit_hung_with_a_peer(tmp_path: Path) -> None:
    # A peer host's launcher found the hang a poll earlier and killed its workers: these lost their connection.
    watch = _watch(tmp_path, fixed_seconds=60.0)
    watch.observe(8, 0.0)
    stalled = watch.stalled(59.0)
    assert stalled is not None and (stalled.step, stalled.seconds, stalled.host) == (8, 59.0, "algo-2")
    # Workers that fail well within the limit crashed: that is a training failure, not a hang.
    assert watch.stalled(30.0) is None
    # A step this host's workers finished since the last poll counts.
    StepReport(tmp_path / "rank-0.step")(9)
    assert watch.stalled(61.0) is None


def test_workers_that_fail_before_training_or_after_the_last_step_did_not_hang(tmp_path: Path) -> None:
    watch = _watch(tmp_path, fixed_seconds=60.0)
    assert watch.stalled(1000.0) is None
    watch.observe(100, 0.0)
    assert watch.stalled(1000.0) is None


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


def test_a_report_torn_by_its_write_is_skipped(tmp_path: Path) -> None:
    # A read that met the write half-way: a prefix of the new record, the rest of the old one.
    (tmp_path / "rank-0.step").write_text(f"{12:020d} {11:020d}\n")
    assert newest_step(tmp_path) is None
    StepReport(tmp_path / "rank-1.step")(10)
    assert newest_step(tmp_path) == 10


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


# A worker that finished step 6, waited in a collective, then failed: its peer was killed (or crashed).
_WAITS_THEN_FAILS = """
import pathlib, sys, time
from contract.hang import StepReport
StepReport(pathlib.Path(sys.argv[1]))(6)
time.sleep(float(sys.argv[3]))
pathlib.Path(sys.argv[2]).write_text("RuntimeError: Connection closed by peer\\n")
sys.exit(1)
"""


@pytest.mark.parametrize(("waits", "outcome"), [(3.5, EXIT_HANG_DETECTED), (0.2, EXIT_FAILED)])
def test_workers_that_fail_after_a_stall_of_about_the_limit_name_the_hang_first(
    tmp_path: Path, waits: float, outcome: int
) -> None:
    paths = Paths(tmp_path / "opt_ml")
    paths.output.mkdir(parents=True)
    watch = HangWatch(tmp_path, host="algo-1", last_step=100, fixed_seconds=4.0, floor_seconds=60.0, factor=5.0)
    command = [sys.executable, "-c", _WAITS_THEN_FAILS, str(tmp_path / "rank-0.step"), str(paths.failure), str(waits)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    supervisor = Supervisor(command, env, grace_seconds=10.0, mpi=False, watch=watch)
    returncode, expired = supervisor.run()
    assert _outcome(paths, supervisor, returncode, expired, 10.0) == outcome
    lines = paths.failure.read_text().splitlines()
    if outcome == EXIT_FAILED:  # failed soon after a step: the worker's own failure stands
        assert lines[0] == "RuntimeError: Connection closed by peer"
        return
    assert re.fullmatch(r"HangDetected: no training step for [234] s after step 6 on algo-1", lines[0]), lines
    assert "the workers' failure (exit status 1): RuntimeError: Connection closed by peer" in lines


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


def _launch(**hang: str) -> Launch:
    cfg = from_hyperparameters({"max_steps": "500", **{f"hang.{k}": v for k, v in hang.items()}})
    plan = LaunchPlan(("algo-1",), 0, 1, "127.0.0.1", 29500, "ddp")
    return Launch(ResourceConfig("algo-1", ("algo-1",)), plan, 110.0, None, None, cfg.hang, cfg.train.max_steps)


def test_the_launcher_hands_the_workers_a_directory_and_judges_it_as_configured() -> None:
    env: dict[str, str] = {}
    watch = _hang_watch(_launch(floor_minutes="2", factor="3"), env)
    assert watch is not None and env == {HEARTBEAT_ENV: str(watch.directory)} and watch.directory.is_dir()
    watch.directory.rmdir()
    assert (watch.host, watch.last_step, watch.limit) == ("algo-1", 500, 120.0)
    watch.longest = 50.0
    assert watch.limit == 150.0
    fixed = _hang_watch(_launch(minutes="7"), {})
    assert fixed is not None and fixed.limit == 420.0
    fixed.directory.rmdir()


def test_hang_action_off_watches_nothing_and_the_workers_report_nothing() -> None:
    env: dict[str, str] = {}
    assert _hang_watch(_launch(action="off"), env) is None
    assert env == {}


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
    assert "step=6 loss=" in log and "step=7 loss=" not in log
    # The 3 s floor, or 5 x the longest interval between two steps' reports (read once a second).
    limit = re.search(r"\(the hang limit is (\d+) s, see hang\.\* in training/README\.md\): killing the workers", log)
    assert limit is not None and 3 <= int(limit.group(1)) <= 10, log[-3000:]
    assert int(limit.group(1)) <= int(found.group(1)) <= int(limit.group(1)) + 10  # a loaded machine reads later
    assert committed_steps(paths.checkpoints) == [4]  # what the retry on fresh nodes resumes from
    assert time.monotonic() - started < 100


# The same, on the second host only (rank 1): its peer on the first host waits for it in the gradient all-reduce.
SECOND_HOST_HANGS_AT_STEP_7 = HANGS_AT_STEP_7.replace(
    "if self.calls == 7:", "if self.calls == 7 and os.environ['RANK'] == '1':"
)
SECOND_HOST_HANGS_AT_STEP_7 = SECOND_HOST_HANGS_AT_STEP_7.replace("import time", "import os, time")


@pytest.mark.slow
def test_one_hung_host_fails_every_host_with_hang_detected(tmp_path: Path, corpus: Path) -> None:
    job = {
        **TINY_JOB,
        "max_steps": "20",
        "checkpoint.interval_steps": "4",
        "eval.interval_steps": "0",
        "model.factory": "model:build",
        "hang.minutes": "0.05",
    }
    hosts = _two_hosts(tmp_path, corpus, job, {}, code=SECOND_HOST_HANGS_AT_STEP_7)
    for host, (status, log, paths) in hosts.items():
        assert status == EXIT_HANG_DETECTED, (host, log[-3000:])
        # Whichever launcher found the hang first, the other host's failure names the hang, not the lost peer.
        first = paths.failure.read_text().splitlines()[0]
        assert re.fullmatch(rf"HangDetected: no training step for \d+ s after step 6 on {host}", first), first

"""A local host's processes end together, whatever sessions its launcher and torchrun start."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract.layout import LEDGER_CHANNEL, MANIFEST
from localrun.backends import processes
from localrun.backends.sagemaker import REGION, LocalJob, LocalTraining

# A launcher whose child starts a grandchild in a session of its own, as torchrun starts its workers.
_LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import subprocess, sys, time; "
     "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
     "time.sleep(600)"],
    start_new_session=True,
)
print("up", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    return processes.state(pid) not in (None, "Z")


def test_killing_a_host_kills_what_its_launcher_started_in_other_sessions() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, start_new_session=True)
    assert launcher.stdout is not None and launcher.stdout.readline() == b"up\n"
    deadline = time.monotonic() + 10
    while len(tree := processes.tree(launcher.pid)) < 3:
        assert time.monotonic() < deadline, tree
        time.sleep(0.05)
    processes.kill(launcher.pid)
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in tree):
        assert time.monotonic() < deadline, [pid for pid in tree if _alive(pid)]
        time.sleep(0.05)


# A launcher that starts a worker in a session of its own and exits without waiting for it.
_EXITING_LAUNCHER = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(worker.pid, flush=True)
"""


def test_ending_a_host_kills_what_its_exited_launcher_left_running(tmp_path: Path) -> None:
    # init adopts the orphan, so no tree from the launcher finds it; the host's OPT_ML_ROOT still does.
    root = tmp_path / "host-1"
    env = {"PATH": "/usr/bin:/bin", "OPT_ML_ROOT": str(root)}
    launcher = subprocess.Popen([sys.executable, "-c", _EXITING_LAUNCHER], stdout=subprocess.PIPE, env=env)
    assert launcher.stdout is not None
    worker = int(launcher.stdout.readline())
    launcher.wait(timeout=10)
    assert _alive(worker) and worker in processes.under(tmp_path) and processes.under(tmp_path / "host-2") == []
    processes.end([launcher], tmp_path)
    deadline = time.monotonic() + 10
    while _alive(worker):
        assert time.monotonic() < deadline, worker
        time.sleep(0.05)


def _states_become(pids: list[int], stopped: bool) -> None:
    """A signal is acted on when its process next runs: wait for it, within a deadline."""
    deadline = time.monotonic() + 10
    while any((processes.state(pid) == "T") != stopped for pid in pids):
        assert time.monotonic() < deadline, {pid: processes.state(pid) for pid in pids}
        time.sleep(0.02)


def _argv(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


def _launched(launcher: subprocess.Popen[bytes]) -> list[int]:
    """_LAUNCHER's tree once its grandchild runs its own program: a process stopped between fork and exec
    would hold its parent in the fork (state D, not T)."""
    deadline = time.monotonic() + 10
    while (tree := processes.tree(launcher.pid)) and _argv(tree[-1])[-1:] != [b"import time; time.sleep(600)"]:
        assert time.monotonic() < deadline, tree
        time.sleep(0.05)
    return tree


def test_a_paused_job_is_frozen_whole_and_so_is_a_host_started_while_paused(tmp_path: Path) -> None:
    # The teams scenario holds training while a run's request reaches the queue (localrun/demo/cli.py, _Driver.start).
    training = LocalTraining(root=tmp_path, datasets_bucket="")
    job = LocalJob("job", {}, tmp_path / "job", ["algo-1", "algo-2"])
    training.jobs["job"] = job
    env = {"PATH": "/usr/bin:/bin", "OPT_ML_ROOT": str(job.tree("algo-1"))}
    with (tmp_path / "log").open("wb") as log:
        first = training._spawn(job, [sys.executable, "-c", _LAUNCHER], env, log)
        running = _launched(first)
        assert len(running) == 3
        try:
            with training.paused():
                _states_become(running, stopped=True)
                second = training._spawn(job, [sys.executable, "-c", "import time; time.sleep(600)"], env, log)
                _states_become([second.pid], stopped=True)
            _states_become([*running, second.pid], stopped=False)
        finally:
            LocalTraining._end_hosts(job)


def test_a_job_is_not_paused_where_the_hang_demo_stopped_a_worker(tmp_path: Path) -> None:
    # Resuming a paused job would also resume the worker the hang check must find stopped.
    training = LocalTraining(root=tmp_path, datasets_bucket="", hang_after_checkpoint=True)
    with pytest.raises(ValueError, match="hang"), training.paused():
        pass


def test_a_pause_resumes_only_the_processes_it_stopped_and_starts_a_stop_grace_on_its_release(tmp_path: Path) -> None:
    training = LocalTraining(root=tmp_path, datasets_bucket="")
    job = LocalJob("job", {}, tmp_path / "job", ["algo-1"])
    training.jobs["job"] = job
    env = {"PATH": "/usr/bin:/bin", "OPT_ML_ROOT": str(job.tree("algo-1"))}
    with (tmp_path / "log").open("wb") as log:
        host = training._spawn(job, [sys.executable, "-c", "import time; time.sleep(600)"], env, log)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # A pid whose process is not the one frozen (its pid reused by another): not resumed.
        (frozen,) = processes.freeze(other.pid)
        _states_become([other.pid], stopped=True)
        processes.resume({frozen: "not its start time"})
        assert processes.state(other.pid) == "T"
        processes.resume(processes.identify([frozen]))
        _states_become([other.pid], stopped=False)
        # A stop requested before the release: SageMaker's grace counts from the SIGTERM's delivery.
        job.stopping, job.stop_requested_at = True, 0.0
        before = time.monotonic()
        with training.paused():
            _states_become([host.pid], stopped=True)
        assert job.stop_requested_at >= before
        _states_become([host.pid], stopped=False)
    finally:
        for process in (other, host):
            process.kill()
            process.wait(timeout=10)


# A launcher, and under it a process whose arguments name training.train, as a training worker's do.
_WITH_WORKER = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', 'training.train']); time.sleep(600)"
)


def _watched_job(tmp_path: Path, s3: Any, workers: list[bool]) -> LocalJob:
    """A job of one host per entry of `workers`, each with a training worker under its launcher or none (its
    training has ended); its first host has committed a checkpoint, which the run's ledger records."""
    s3.create_bucket(Bucket="ledger")
    s3.put_object(Bucket="ledger", Key="r/ledger/step-10", Body=b"{}")
    channel = {"ChannelName": LEDGER_CHANNEL, "DataSource": {"S3DataSource": {"S3Uri": "s3://ledger/r/ledger/"}}}
    hosts = [f"algo-{i + 1}" for i in range(len(workers))]
    job = LocalJob("job", {"InputDataConfig": [channel]}, tmp_path / "job", hosts)
    manifest = job.tree("algo-1") / "checkpoints" / "step-10" / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{}")
    for worker in workers:
        code = _WITH_WORKER if worker else "import time; time.sleep(600)"
        job.processes.append(subprocess.Popen([sys.executable, "-c", code]))
        deadline = time.monotonic() + 10
        while len(processes.tree(job.processes[-1].pid)) < (2 if worker else 1):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    return job


def _watch(watch: Any) -> None:
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the watch still holds the hosts"


def _stopped(job: LocalJob) -> list[int]:
    return [pid for launcher in job.processes for pid in processes.tree(launcher.pid) if processes.state(pid) == "T"]


@pytest.mark.parametrize(
    ("fault", "workers"), [("reclaim", [False]), ("hang", [True, False])], ids=["reclaim", "hang-last-host"]
)
def test_a_fault_held_for_after_the_training_ended_releases_the_hosts_and_is_not_played(
    fault: str, workers: list[bool], tmp_path: Path
) -> None:
    """The hold comes after the training ended: the run's first checkpoint seen was its last, or the host whose
    worker a hang stops has none left. Holding on would freeze launchers with no training left, and the job
    would wait for its deadline, for a fault that can no longer be played."""
    training, acted = LocalTraining(root=tmp_path, datasets_bucket=""), []
    with mock_aws():
        job = _watched_job(tmp_path, boto3.client("s3", region_name=REGION), workers)
        try:
            if fault == "hang":
                _watch(lambda: training._hang_after_first_checkpoint(job))
            else:
                _watch(lambda: training._after_recorded_checkpoint(job, lambda held: acted.append(held) or True))
            assert _stopped(job) == []
        finally:
            LocalTraining._end_hosts(job)
    assert acted == []
    assert job.notes == ["training ended before a checkpoint was recorded: no fault played"]


def test_a_fault_held_for_with_training_under_way_is_played_on_the_held_hosts(tmp_path: Path) -> None:
    training, held_states = LocalTraining(root=tmp_path, datasets_bucket=""), []

    def act(held: dict[int, str | None]) -> bool:
        held_states.append({processes.state(pid) for pid in held})
        processes.resume(held)
        return True

    with mock_aws():
        job = _watched_job(tmp_path, boto3.client("s3", region_name=REGION), [True, False])
        try:
            _watch(lambda: training._after_recorded_checkpoint(job, act))
        finally:
            LocalTraining._end_hosts(job)
    assert held_states == [{"T"}] and job.notes == []


def test_a_host_started_after_its_job_was_stopped_gets_the_stop_s_sigterm(tmp_path: Path) -> None:
    """StopTrainingJob while a job's hosts still download: each launcher is signalled as it starts, rather than
    trained until SageMaker's grace runs out."""
    training = LocalTraining(root=tmp_path, datasets_bucket="")
    job = LocalJob("job", {}, tmp_path / "job", ["algo-1"])
    training.jobs["job"] = job
    training.stopped("job", None)
    env = {"PATH": "/usr/bin:/bin", "OPT_ML_ROOT": str(job.tree("algo-1"))}
    with (tmp_path / "log").open("wb") as log:
        host = training._spawn(job, [sys.executable, "-c", "import time; time.sleep(600)"], env, log)
    try:
        assert host.wait(timeout=20) == -signal.SIGTERM
    finally:
        LocalTraining._end_hosts(job)

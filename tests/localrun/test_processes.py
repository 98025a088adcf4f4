"""A local host's processes end together, whatever sessions its launcher and torchrun start."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from localrun import processes
from localrun.sagemaker_local import LocalJob, LocalTraining

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
    # The teams scenario holds training while a run's request reaches the queue (localrun/demo.py, _Driver.start).
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
            processes.end(job.processes, job.workdir)
            for launcher in job.processes:
                launcher.wait(timeout=10)


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

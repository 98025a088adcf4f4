"""The launcher against SageMaker's container contract: fail-fast input errors, launch plan, EFA, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from training_helpers import TINY_JOB, clean_env, free_port, kill_tree, launcher, make_opt_ml, run, run_until

from contract import goodput
from contract.config import JobConfig
from contract.metrics import metric_series
from training import stragglers
from training.checkpoint import committed_steps
from training.launcher import (
    EXIT_INVALID_INPUT,
    EXIT_PREFLIGHT_FAILED,
    LaunchPlan,
    Supervisor,
    efa_devices,
    efa_for_host,
    mpirun_command,
    network_env,
    plan_launch,
    torchrun_command,
)
from training.sagemaker_contract import ContractError, Paths, ResourceConfig, read_resource_config


def _first_line(paths: Paths) -> str:
    return paths.failure.read_text().splitlines()[0]


def test_unknown_hyperparameter_fails_fast_with_the_reason(tmp_path: Path, corpus: Path) -> None:
    paths = make_opt_ml(tmp_path, {"optim.lrr": "0.1"}, corpus=corpus)
    result = run(launcher(), clean_env(tmp_path), timeout=30)
    assert result.returncode == EXIT_INVALID_INPUT
    assert _first_line(paths) == (
        "unknown hyperparameter 'optim.lrr' (did you mean 'optim.lr'?); "
        "the accepted names are listed in docs/reference/hyperparameters.md"
    )
    assert not paths.checkpoints.exists() and "rank 0/" not in result.stdout  # no worker started


def test_a_layout_the_hosts_cannot_hold_fails_before_any_worker_starts(tmp_path: Path, corpus: Path) -> None:
    # GPT-2 tiny's heads, widths and vocabulary split in 4, but a host of 2 processes cannot hold tp=4.
    hyperparameters = {"model": "tiny", "distribution": "fsdp", "seq_len": "32", "parallel.tp": "4"}
    paths = make_opt_ml(tmp_path, hyperparameters, corpus=corpus)
    result = run(launcher(), clean_env(tmp_path, TRAINING_NPROC_PER_NODE="2"), timeout=30)
    assert result.returncode == EXIT_INVALID_INPUT
    assert _first_line(paths) == (
        "2 processes cannot be tp=4: tp must divide 2, the GPUs per host (a tensor-parallel group stays on one "
        "host); use parallel.tp=2"
    )
    assert "rank 0/" not in result.stdout  # no worker started


def test_bad_value_names_key_value_and_what_is_allowed(tmp_path: Path, corpus: Path) -> None:
    paths = make_opt_ml(tmp_path, {"distribution": "zero3"}, corpus=corpus)
    assert run(launcher(), clean_env(tmp_path), timeout=30).returncode == EXIT_INVALID_INPUT
    assert _first_line(paths) == ("hyperparameter distribution='zero3' is invalid: choose one of ddp, fsdp, smddp, mpi")


def test_missing_train_channel_names_the_channel_and_path(tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {"model": "tiny"}, corpus=None)
    assert run(launcher(), clean_env(tmp_path), timeout=30).returncode == EXIT_INVALID_INPUT
    assert _first_line(paths).startswith(
        f"data channel 'train' is missing: expected a directory at {paths.channel('train')}."
    )


def test_empty_train_channel_fails_fast(tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=None)
    paths.channel("train").mkdir(parents=True)
    assert run(launcher(), clean_env(tmp_path), timeout=30).returncode == EXIT_INVALID_INPUT
    assert "has no training shards" in _first_line(paths)


@pytest.mark.parametrize("name", ["hyperparameters.json", "resourceconfig.json"])
def test_malformed_config_files_are_input_errors(tmp_path: Path, corpus: Path, name: str) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    (paths.hyperparameters.parent / name).write_text("{not json")
    assert run(launcher(), clean_env(tmp_path), timeout=30).returncode == EXIT_INVALID_INPUT
    assert _first_line(paths).startswith(f"{paths.hyperparameters.parent / name} is not valid JSON")


def test_bad_grace_period_is_an_input_error(tmp_path: Path, corpus: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    env = clean_env(tmp_path, TRAINING_SIGTERM_GRACE_SECONDS="soon")
    assert run(launcher(), env, timeout=30).returncode == EXIT_INVALID_INPUT
    assert "TRAINING_SIGTERM_GRACE_SECONDS='soon' must be a number" in _first_line(paths)


def test_efa_asked_for_on_a_host_without_it_is_an_input_error(tmp_path: Path, corpus: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    env = clean_env(tmp_path, TRAINING_EFA="true")  # this machine has no EFA device
    result = run(launcher(), env, timeout=30)
    assert result.returncode == EXIT_INVALID_INPUT
    assert _first_line(paths).startswith("the run asks for EFA (TRAINING_EFA=true) but this host has no EFA device")
    assert "rank 0/" not in result.stdout  # no worker started


def _resources(current: str = "algo-2") -> ResourceConfig:
    return ResourceConfig(current_host=current, hosts=("algo-1", "algo-2", "algo-3"), network_interface_name="eth0")


def test_plan_node_rank_is_the_hosts_position_and_rendezvous_the_first_host() -> None:
    plan = plan_launch(JobConfig(), _resources(), {"SM_NUM_GPUS": "8"})
    assert plan == LaunchPlan(
        hosts=("algo-1", "algo-2", "algo-3"),
        node_rank=1,
        nproc_per_node=8,
        master_addr="algo-1",
        master_port=29500,
        distribution="ddp",
    )
    command = torchrun_command(plan)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=3", "--node_rank=1", "--nproc_per_node=8", "--master_addr=algo-1"} <= set(command)
    assert command[-2:] == ["-m", "training.train"]


def test_plan_overrides_for_local_runs() -> None:
    env = {"TRAINING_MASTER_ADDR": "127.0.0.1", "TRAINING_MASTER_PORT": "1234", "TRAINING_NPROC_PER_NODE": "2"}
    plan = plan_launch(JobConfig(), _resources("algo-1"), {**env, "SM_NUM_GPUS": "8"})
    assert (plan.master_addr, plan.master_port, plan.nproc_per_node, plan.node_rank) == ("127.0.0.1", 1234, 2, 0)
    with pytest.raises(ContractError, match="TRAINING_NPROC_PER_NODE='0' must be at least 1"):
        plan_launch(JobConfig(), _resources(), {"TRAINING_NPROC_PER_NODE": "0"})


def test_mpirun_spans_every_host_and_forwards_the_environment() -> None:
    plan = plan_launch(JobConfig(distribution="mpi"), _resources("algo-1"), {"SM_NUM_GPUS": "4"})
    command = mpirun_command(plan, ["FI_PROVIDER"], "eth0")
    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    assert command[command.index("--host") + 1] == "algo-1:4,algo-2:4,algo-3:4"
    assert command[command.index("-np") + 1] == "12"
    assert "MASTER_ADDR=algo-1" in command and "FI_PROVIDER" in command
    assert command[command.index("btl_tcp_if_include") + 1] == "eth0"
    assert command[-2:] == ["-m", "training.train"]


def test_resource_config_must_contain_the_current_host(tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=None, hosts=("algo-1", "algo-2"), current_host="algo-9")
    with pytest.raises(ContractError, match=r"current_host 'algo-9' is not in hosts \['algo-1', 'algo-2'\]"):
        read_resource_config(paths, {})
    assert read_resource_config(Paths(tmp_path / "none"), {}).hosts == ("localhost",)
    sm = read_resource_config(Paths(tmp_path / "none"), {"SM_CURRENT_HOST": "b", "SM_HOSTS": '["a", "b"]'})
    assert sm.node_rank == 1


def test_efa_is_detected_from_sysfs_and_configures_libfabric(tmp_path: Path) -> None:
    sysfs = tmp_path / "infiniband"
    drivers = tmp_path / "drivers"
    (drivers / "efa").mkdir(parents=True)
    (drivers / "mlx5_core").mkdir()
    for device, driver in (("rdmap16s27", "efa"), ("mlx5_0", "mlx5_core")):
        (sysfs / device / "device").mkdir(parents=True)
        (sysfs / device / "device" / "driver").symlink_to(drivers / driver)
    assert efa_devices(sysfs) == ["rdmap16s27"]
    assert efa_devices(tmp_path / "absent") == []

    resources = _resources()
    wanted = network_env(resources, {}, efa=["rdmap16s27"], efa_rdma=True)
    assert wanted == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }
    # Values from the image or the job's Environment win; no EFA, no libfabric settings.
    kept = network_env(resources, {"NCCL_SOCKET_IFNAME": "ens5"}, efa=[], efa_rdma=False)
    assert kept == {"GLOO_SOCKET_IFNAME": "eth0"}


def test_the_runs_efa_choice_decides_the_transport() -> None:
    devices = ["rdmap16s27"]
    assert efa_for_host({}, devices) == devices  # not said: whatever the host has
    assert efa_for_host({}, []) == []
    assert efa_for_host({"TRAINING_EFA": "true"}, devices) == devices
    assert efa_for_host({"TRAINING_EFA": "false"}, devices) is None
    with pytest.raises(ContractError, match="has no EFA device"):
        efa_for_host({"TRAINING_EFA": "true"}, [])
    with pytest.raises(ContractError, match="TRAINING_EFA='maybe' must be true or false"):
        efa_for_host({"TRAINING_EFA": "maybe"}, devices)
    # Turned off on a host that has EFA: NCCL's own sockets, no libfabric settings.
    off = network_env(_resources(), {}, efa=efa_for_host({"TRAINING_EFA": "false"}, devices), efa_rdma=False)
    assert off == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_NET": "Socket"}


def test_supervisor_kills_workers_that_outlive_the_grace_period() -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    supervisor = Supervisor([sys.executable, "-c", stubborn], os.environ, grace_seconds=0.5, mpi=True)
    threading.Timer(1.0, supervisor._forward, args=(signal.SIGTERM, None)).start()
    started = time.monotonic()
    status, expired = supervisor.run()
    assert expired
    assert status == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert supervisor.signal_name == "SIGTERM"
    assert "up" in supervisor.tail


def test_bad_preflight_expectation_is_an_input_error(tmp_path: Path, corpus: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    result = run(launcher(), clean_env(tmp_path, TRAINING_EXPECTED_GPUS="eight"), timeout=30)
    assert result.returncode == EXIT_INVALID_INPUT
    assert _first_line(paths) == "environment variable TRAINING_EXPECTED_GPUS='eight' must be a number >= 0"


def _two_hosts(
    tmp_path: Path, corpus: Path, job: dict[str, str], env: dict[str, dict[str, str]], code: str = ""
) -> dict[str, tuple[int, str, Paths]]:
    """Both hosts' launchers, one process each on gloo: host -> (exit status, log, /opt/ml tree); `code`:
    a module written as code/model.py on every host (for `model.factory`)."""
    hosts = ("algo-1", "algo-2")
    port = str(free_port())
    trees = {host: make_opt_ml(tmp_path / host, job, corpus=corpus, hosts=hosts, current_host=host) for host in hosts}
    for paths in trees.values():
        if code:
            paths.channel("code").mkdir(parents=True)
            (paths.channel("code") / "model.py").write_text(code)
    procs = {
        host: subprocess.Popen(
            launcher(),
            env=clean_env(paths.root, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=port, **env.get(host, {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host, paths in trees.items()
    }
    try:
        logs = {host: proc.communicate(timeout=150)[0] for host, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    return {host: (procs[host].returncode, logs[host], trees[host]) for host in hosts}


SHORT_JOB = {
    **TINY_JOB,
    "max_steps": "2",
    "optim.warmup_steps": "1",
    "checkpoint.interval_steps": "0",
    "eval.interval_steps": "0",
}


@pytest.mark.slow
def test_preflight_fails_every_host_when_one_sees_fewer_gpus_than_expected(tmp_path: Path, corpus: Path) -> None:
    # algo-2 is told its type has a GPU; this machine has none, so it sees 0.
    hosts = _two_hosts(tmp_path, corpus, SHORT_JOB, {"algo-2": {"TRAINING_EXPECTED_GPUS": "1"}})
    expected = "PreflightFailed: GPUs missing (torch.cuda.device_count()): host algo-2 sees 0 of the 1 expected"
    for host, (status, log, paths) in hosts.items():
        assert status == EXIT_PREFLIGHT_FAILED, log[-3000:]
        # Every host reached the same verdict: whichever SageMaker reports, it names the bad host.
        assert _first_line(paths) == expected, host
        # Training never started: no step, no checkpoint (a progress record of the start may be there).
        assert "step=" not in log and not list(paths.checkpoints.glob("step-*"))
        assert all(record.step == 0 for record in goodput.local_records(paths.checkpoints))
        assert "training failed" not in log  # the verdict, not a worker's traceback


@pytest.mark.slow
def test_preflight_passes_on_two_hosts_then_training_runs(tmp_path: Path, corpus: Path) -> None:
    expect_none = {"TRAINING_EXPECTED_GPUS": "0", "TRAINING_MIN_BUSBW_GBPS": "80"}  # what ml.m5.* hosts get
    hosts = _two_hosts(tmp_path, corpus, SHORT_JOB, {"algo-1": expect_none, "algo-2": expect_none})
    for host, (status, log, paths) in hosts.items():
        assert status == 0, log[-3000:]
        assert f"host {host} sees 0 GPUs, as expected" in log
        assert "pre-flight check passed in" in log
        assert not paths.failure.exists()
    first = hosts["algo-1"][1]
    # In the training's own processes: after they joined its process group, before the first step.
    assert first.index("rank 0/2") < first.index("pre-flight check passed") < first.index("step=2 loss=")
    assert " phases wall_s=" in first and " preflight_s=" in first  # the worker counts the check's time


@pytest.mark.slow
def test_preflight_false_skips_the_check(tmp_path: Path, corpus: Path) -> None:
    # The same bad expectation as above, which the check would fail on: with the check off, training runs.
    job = {**SHORT_JOB, "preflight": "false"}
    hosts = _two_hosts(tmp_path, corpus, job, {"algo-2": {"TRAINING_EXPECTED_GPUS": "1"}})
    for status, log, paths in hosts.values():
        assert status == 0, log[-3000:]
        assert "pre-flight check off (hyperparameter preflight=false)" in log
        assert "pre-flight check passed" not in log and not paths.failure.exists()
    assert "step=2 loss=" in hosts["algo-1"][1]


@pytest.mark.slow
def test_sigterm_during_the_preflight_stops_the_launcher_before_training(tmp_path: Path, corpus: Path) -> None:
    # algo-2 never comes, so the workers wait at the rendezvous when SageMaker stops the job.
    paths = make_opt_ml(tmp_path, SHORT_JOB, corpus=corpus, hosts=("algo-1", "algo-2"), current_host="algo-1")
    env = clean_env(tmp_path, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=str(free_port()))

    def stop(proc: subprocess.Popen[str]) -> None:
        time.sleep(1)  # past the moment the launcher starts torchrun and takes SIGTERM over
        proc.send_signal(signal.SIGTERM)

    status, log = run_until(launcher(), env, r"pre-flight check in the training workers: ", stop)
    assert status == 0, log[-3000:]
    assert "stopped by SIGTERM during the pre-flight check; training did not start" in log
    assert not paths.failure.exists() and "rank 0/" not in log


# GPT-2 whose forward pass takes 50 ms longer on rank 1 (algo-2): a host that computes slower than its peer.
SLOW_SECOND_RANK = """
import os, time
from torch import nn
from training.models.gpt2 import GPT2


class Slow(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.inner = GPT2(args)
        self.layers = self.inner.layers

    def forward(self, idx):
        if os.environ["RANK"] == "1":
            # Slower than noise can make the other host's first forward: 0.05 s was not, in a CI run on two cores.
            time.sleep(0.25)
        return self.inner(idx)


def build(args):
    return Slow(args)
"""
STRAGGLER_JOB = {
    **SHORT_JOB,
    "max_steps": "12",
    "model.factory": "model:build",
    "stragglers.steps": "5",
    "stragglers.interval_steps": "5",
    "checkpoint.interval_steps": "0",
}


@pytest.mark.slow
def test_a_host_slower_than_its_peers_is_named_and_with_replace_stopped_after_a_checkpoint(
    tmp_path: Path, corpus: Path
) -> None:
    hosts = _two_hosts(tmp_path / "warn", corpus, STRAGGLER_JOB, {}, code=SLOW_SECOND_RANK)
    status, log, _ = hosts["algo-1"]
    assert status == 0 and hosts["algo-2"][0] == 0, log[-3000:]
    named = re.search(r"straggler: host algo-2 \(ranks 1\) computed its steps (\d+)% slower than the other", log)
    assert named and int(named.group(1)) >= 15, log[-3000:]
    assert "for 5 consecutive steps, since step 1" in log
    assert "host algo-1" not in log.split("straggler:", 1)[1].split("\n", 1)[0]
    # What the run report names (localrun/demo/report.py): the one slow host, once.
    (reported,) = stragglers.named(log)
    assert reported.startswith("host algo-2 (ranks 1) computed its steps ")
    series = metric_series(log)
    assert series["stragglers:hosts"] == {5: 1.0, 10: 1.0} and series["stragglers:slowdown"][5] >= 1.15
    assert "step=12 loss=" in log  # warn: training goes on

    replace = {**STRAGGLER_JOB, "stragglers.action": "replace"}
    hosts = _two_hosts(tmp_path / "replace", corpus, replace, {}, code=SLOW_SECOND_RANK)
    for host, (status, log, paths) in hosts.items():
        assert status == 1, log[-3000:]
        first = _first_line(paths)
        assert first.startswith("StragglerDetected: host algo-2 (ranks 1) computed its steps "), (host, first)
        assert first.endswith("checkpoint step-5 is committed: replace the host (stragglers.action=replace)")
        assert "step=6 loss=" not in log
    assert committed_steps(hosts["algo-1"][2].checkpoints) == [5]

    # Found at the last step: training is done, so the job ends as it would have, with the warning.
    last = {**replace, "max_steps": "10", "stragglers.steps": "10"}
    hosts = _two_hosts(tmp_path / "last", corpus, last, {}, code=SLOW_SECOND_RANK)
    for status, log, paths in hosts.values():
        assert status == 0 and not paths.failure.exists(), log[-3000:]
    assert "straggler: host algo-2 (ranks 1)" in hosts["algo-1"][1]
    assert (hosts["algo-1"][2].model / "model.safetensors").exists()

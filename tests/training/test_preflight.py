"""The pre-flight's parts: NCCL log parsing and forwarding, bus bandwidth arithmetic, verdicts, its settings,
how workers report it and how the launcher reads their report."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import training.preflight
from contract.config import JobConfig
from contract.layout import PREFLIGHT_ENV
from training.launcher import (
    EXIT_OK,
    EXIT_PREFLIGHT_FAILED,
    Supervisor,
    _preflight_outcome,
    plan_launch,
    torchrun_command,
)
from training.preflight import (
    Checks,
    DeviceReport,
    NcclLog,
    NcclNetwork,
    Preflight,
    PreflightError,
    bandwidth_verdict,
    bus_bandwidth_gbps,
    checks_from_env,
    device_verdict,
    efa_verdict,
    failure_line,
    nccl_network,
    run_checks,
)
from training.sagemaker_contract import ContractError, Paths, ResourceConfig

# NCCL's and aws-ofi-nccl's INFO lines (NCCL_DEBUG_SUBSYS=INIT,NET): from a published two-host EFA log
# (aws-ofi-nccl before 1.14 wrote "Selected Provider is"); the current wording, from both projects'
# sources; NCCL's own sockets when the plugin is missing (NCCL 2.22's wording); and the plugin on a
# fabric that is not EFA (a published Slingshot log, provider cxi).
EFA_LOG = """\
compute-gpu-st-distributed-ml-1:7614:7691 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)
compute-gpu-st-distributed-ml-1:7614:7691 [0] NCCL INFO NET/OFI Selected Provider is efa (found 1 nics)
compute-gpu-st-distributed-ml-1:7614:7691 [0] NCCL INFO NET/OFI Global registrations supported
compute-gpu-st-distributed-ml-1:7614:7691 [0] NCCL INFO Using network AWS Libfabric
compute-gpu-st-distributed-ml-1:7614:7691 [0] NCCL INFO DMA-BUF is available on GPU device 0
"""
EFA_LOG_CURRENT = """\
algo-1:212:280 [3] NCCL INFO NET/OFI Using Libfabric version 2.1
algo-1:212:280 [3] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
algo-1:212:280 [3] NCCL INFO Using network Libfabric
"""
SOCKET_LOG = """\
algo-2:98:98 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
algo-2:98:98 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.17<0>
algo-2:98:98 [0] NCCL INFO Using network Socket
"""
CXI_LOG = """\
NCCL INFO NET/OFI Using aws-ofi-nccl 1.6.0
NCCL INFO NET/OFI Selected Provider is cxi (found 2 nics)
NCCL INFO Using network AWS Libfabric
"""


def test_the_network_and_provider_come_from_nccls_init_log() -> None:
    assert nccl_network(EFA_LOG) == NcclNetwork("AWS Libfabric", "efa")
    assert nccl_network(EFA_LOG_CURRENT) == NcclNetwork("Libfabric", "efa")
    assert nccl_network(SOCKET_LOG) == NcclNetwork("Socket", None)
    assert nccl_network(CXI_LOG) == NcclNetwork("AWS Libfabric", "cxi")
    assert nccl_network("") == NcclNetwork(None, None)
    assert [nccl_network(log).efa for log in (EFA_LOG, EFA_LOG_CURRENT, SOCKET_LOG, CXI_LOG)] == [
        True,
        True,
        False,
        False,
    ]


def test_efa_verdict_names_each_host_that_fell_back() -> None:
    ok = nccl_network(EFA_LOG_CURRENT)
    assert efa_verdict([("algo-1", ok), ("algo-1", ok), ("algo-2", ok)]) is None
    # A log that names no network is not judged (NCCL's wording may change); the worker warns instead.
    assert efa_verdict([("algo-1", ok), ("algo-2", NcclNetwork(None, None))]) is None
    verdict = efa_verdict([("algo-1", ok), ("algo-2", nccl_network(SOCKET_LOG)), ("algo-2", nccl_network(SOCKET_LOG))])
    assert verdict == (
        "NCCL is not using EFA though the run asks for it: host algo-2: NCCL uses network 'Socket', "
        "not the OFI plugin (Libfabric) over EFA"
    )
    assert efa_verdict([("algo-3", nccl_network(CXI_LOG))]) == (
        "NCCL is not using EFA though the run asks for it: host algo-3: the OFI plugin chose provider 'cxi', not efa"
    )


def test_bus_bandwidth_is_nccl_tests_busbw() -> None:
    # AWS's published 2 x p5.48xlarge all_reduce_perf row: 536870912 B in 2559.2 us, algbw 209.78, busbw 393.34.
    assert bus_bandwidth_gbps(536_870_912, 2559.2e-6, 16) == pytest.approx(393.34, abs=0.01)
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, 2) == pytest.approx(1.0)  # 2(n-1)/n = 1 for two ranks


def test_bandwidth_verdict_compares_with_the_floor() -> None:
    assert bandwidth_verdict(393.3, 80.0, hosts=2, ranks=16) is None
    assert bandwidth_verdict(80.0, 80.0, hosts=2, ranks=16) is None
    assert bandwidth_verdict(11.96, 80.0, hosts=2, ranks=16) == (
        "all-reduce bus bandwidth 12.0 GB/s across 2 hosts (16 ranks) is below the 80 GB/s floor for this "
        "instance type (TRAINING_MIN_BUSBW_GBPS); a host or its network is degraded"
    )


def test_device_verdict_names_hosts_short_of_their_type_or_their_peers() -> None:
    full = [DeviceReport(f"algo-{h}", 8, 8) for h in (1, 2) for _ in range(8)]
    assert device_verdict(full) is None
    assert device_verdict([DeviceReport("algo-1", 0, 0), DeviceReport("algo-2", 0, 0)]) is None  # CPU hosts
    short = [*full[:8], *[DeviceReport("algo-2", 7, 8)] * 7]
    assert device_verdict(short) == "GPUs missing (torch.cuda.device_count()): host algo-2 sees 7 of the 8 expected"
    # Without an expectation (a local run), as many as any other host sees.
    peers = [DeviceReport("algo-1", 4, None), DeviceReport("algo-2", 2, None), DeviceReport("algo-3", 0, None)]
    assert device_verdict(peers) == (
        "GPUs missing (torch.cuda.device_count()): host algo-2 sees 2 of the 4 expected, "
        "host algo-3 sees 0 of the 4 expected"
    )
    # More than the type has is no failure: training starts one process per GPU it finds.
    assert device_verdict([DeviceReport("algo-1", 1, 0)]) is None
    assert failure_line("x").startswith("PreflightFailed: ")


def test_checks_come_from_the_environment_and_reach_the_workers() -> None:
    env = {"TRAINING_EXPECTED_GPUS": "8", "TRAINING_MIN_BUSBW_GBPS": "80.0"}
    checks = checks_from_env(env, efa=True, timeout_minutes=10.0)
    assert checks == Checks(expected_gpus=8, efa=True, min_busbw_gbps=80.0, timeout_minutes=10.0)
    assert Checks.from_env({PREFLIGHT_ENV: checks.to_env()}) == checks
    assert checks_from_env({}, efa=False, timeout_minutes=1.0) == Checks(None, False, 0.0, 1.0)
    no_gpus = Checks(None, False, 0.0, 1.0, passed_file="/tmp/x/passed")
    assert Checks.from_env({PREFLIGHT_ENV: no_gpus.to_env()}) == no_gpus
    assert Checks.from_env({}) is None and Preflight.from_env({}) is None
    # States.Format writes the request's numbers as JSON does.
    assert checks_from_env({"TRAINING_EXPECTED_GPUS": "8.0"}, efa=False, timeout_minutes=1.0).expected_gpus == 8
    for name, value in (
        ("TRAINING_EXPECTED_GPUS", "eight"),
        ("TRAINING_EXPECTED_GPUS", "7.5"),
        ("TRAINING_EXPECTED_GPUS", "-1"),
        ("TRAINING_MIN_BUSBW_GBPS", "nan"),
    ):
        with pytest.raises(ContractError, match=f"environment variable {name}="):
            checks_from_env({name: value}, efa=False, timeout_minutes=1.0)


def test_the_check_runs_in_the_training_workers_not_a_torchrun_of_its_own() -> None:
    resources = ResourceConfig(current_host="algo-2", hosts=("algo-1", "algo-2"))
    plan = plan_launch(JobConfig(), resources, {"SM_NUM_GPUS": "8", "TRAINING_MASTER_PORT": "29500"})
    command = torchrun_command(plan)
    assert {"--nnodes=2", "--node_rank=1", "--nproc_per_node=8", "--master_port=29500"} <= set(command)
    assert command[-2:] == ["-m", "training.train"]


def test_nccls_log_goes_to_the_check_and_what_the_job_asked_for_goes_on(tmp_path: Path) -> None:
    warn = "algo-1:7:9 [0] NCCL WARN NET/OFI Request failed\n"
    info = "algo-1:7:9 [0] NCCL INFO Using network Libfabric\n"
    # The pipeline's setting: warnings, on stdout.
    job = {"NCCL_DEBUG": "WARN"}
    env = dict(job)
    nccl = NcclLog.capture(env, tmp_path / "launcher")
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"], env["NCCL_DEBUG_FILE"]) == ("INFO", "INIT,NET", str(nccl.path))
    assert nccl.path.parent == tmp_path / "launcher"
    nccl.path.write_text(info + warn + "algo-1:7:9 [0] NCCL INFO partial")
    out = io.StringIO()
    assert nccl.forward(out) == 1 and out.getvalue() == warn
    assert nccl_network(nccl.text()) == NcclNetwork("Libfabric", None)
    with nccl.path.open("a") as file:
        file.write(" line\n" + warn)
    assert nccl.forward(out) == 1 and out.getvalue() == warn + warn  # each line once, complete lines only
    # A worker NCCL aborted copies no more: the launcher copies what it had not, from the job's settings.
    with nccl.path.open("a") as file:
        file.write(info + "algo-1:7:9 [0] NCCL WARN Watchdog caught collective operation timeout\n")
    leftovers = io.StringIO()
    assert NcclLog.forward_leftovers(tmp_path / "launcher", job, leftovers) == 1
    assert leftovers.getvalue() == "algo-1:7:9 [0] NCCL WARN Watchdog caught collective operation timeout\n"
    # No NCCL_DEBUG: NCCL printed nothing, so nothing is forwarded.
    quiet = NcclLog.capture({})
    quiet.path.write_text(warn)
    assert quiet.forward(io.StringIO()) == 0
    # INFO with the job's own subsystems and file: those are kept (ours added), its file receives the lines.
    target = tmp_path / "nccl-%h.log"
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_DEBUG_FILE": str(target)}
    verbose = NcclLog.capture(env)
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "COLL,INIT,NET")
    verbose.path.write_text(info + warn)
    assert verbose.forward() == 2
    assert (tmp_path / f"nccl-{socket.gethostname()}.log").read_text() == info + warn
    # A job's list of subsystems to leave out keeps ours in.
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^INIT,COLL"}
    NcclLog.capture(env)
    assert env["NCCL_DEBUG_SUBSYS"] == "^COLL"
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^NET"}
    NcclLog.capture(env)
    assert "NCCL_DEBUG_SUBSYS" not in env


def test_a_check_that_cannot_finish_says_so_in_its_own_words(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(job: Any, nccl_log: Path) -> str | None:
        raise RuntimeError("Connection closed by peer [10.0.1.17]:29500")

    monkeypatch.setattr(training.preflight, "run_checks", broken)
    preflight = Preflight(Checks(None, False, 0.0, 1.0), None)
    with pytest.raises(PreflightError) as raised:
        preflight.run("algo-1", rank=0, ranks=1, local_rank=0, group=None)
    assert str(raised.value) == (
        "the pre-flight check did not finish: RuntimeError: Connection closed by peer [10.0.1.17]:29500"
    )
    # A verdict is raised as it is; a pass marks the launcher's file, from each host's first process.
    monkeypatch.setattr(training.preflight, "run_checks", lambda job, nccl_log: "GPUs missing")
    with pytest.raises(PreflightError, match=r"^GPUs missing$"):
        preflight.run("algo-1", rank=0, ranks=1, local_rank=0, group=None)
    monkeypatch.setattr(training.preflight, "run_checks", lambda job, nccl_log: None)
    passed = tmp_path / "launcher" / "passed"
    preflight = Preflight(Checks(None, False, 0.0, 1.0, passed_file=str(passed)), None)
    preflight.run("algo-1", rank=1, ranks=2, local_rank=1, group=None)
    assert not passed.exists()
    preflight.run("algo-1", rank=0, ranks=2, local_rank=0, group=None)
    assert passed.exists()


def test_the_launcher_tells_a_failed_check_from_a_failed_training(tmp_path: Path) -> None:
    def outcome(returncode: int, first_line: str | None, signal_name: str | None = None) -> tuple[int | None, str]:
        paths = Paths(tmp_path / f"{returncode}-{first_line}-{signal_name}".replace(" ", "_").replace(":", ""))
        if first_line is not None:
            paths.output.mkdir(parents=True)
            paths.failure.write_text(first_line + "\n\ntraceback\n")
        supervisor = Supervisor(["true"], {}, grace_seconds=1, mpi=False)
        supervisor.signal_name = signal_name
        supervisor.tail.append("RendezvousTimeoutError")
        status = _preflight_outcome(paths, supervisor, returncode)
        return status, paths.failure.read_text() if paths.failure.exists() else ""

    # The workers' verdict.
    assert outcome(1, "PreflightFailed: GPUs missing")[0] == EXIT_PREFLIGHT_FAILED
    # Workers that ended without one: the check could not run across the cluster (retried on fresh nodes).
    status, failure = outcome(1, None)
    assert status == EXIT_PREFLIGHT_FAILED
    assert failure.startswith(
        "PreflightFailed: the pre-flight check did not finish: its workers on this host exited with status 1\n"
    )
    assert "RendezvousTimeoutError" in failure
    # A worker failed before the check for a reason of its own: the training's outcome applies.
    assert outcome(1, "ConfigError: model.name='x'")[0] is None
    # Stopped while the check ran: nothing was trained, nothing is lost.
    assert outcome(1, None, "SIGTERM") == (EXIT_OK, "")


class _World:
    """Ranks as threads, with all_gather semantics: every rank must make the same collectives in order."""

    def __init__(self, ranks: int) -> None:
        self.slots: list[Any] = [None] * ranks
        self.barrier = threading.Barrier(ranks, timeout=10)


class _FakeRank:
    """What run_checks uses of a pre-flight rank, on GPUs that this machine does not have."""

    def __init__(self, world: _World, rank: int, host: str, *, gpus: int, checks: Checks, seconds: float) -> None:
        self.world, self.rank, self.ranks, self.host, self.checks = world, rank, len(world.slots), host, checks
        self.local_rank = rank % 2
        self.torch = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: gpus))
        self.seconds = seconds
        self.all_reduces = 0

    def gather(self, value: Any) -> list[Any]:
        self.world.slots[self.rank] = value
        self.world.barrier.wait()
        out = list(self.world.slots)
        self.world.barrier.wait()
        return out

    def time_all_reduce(self) -> float:
        self.all_reduces += 1
        return float(max(self.gather(self.seconds)))


def _run_world(
    tmp_path: Path, hosts: dict[str, tuple[int, Checks, str]], seconds: float = 0.01
) -> tuple[list[str | None], list[int]]:
    """Two ranks per host; each host: (GPUs it sees, its checks, its NCCL log). (verdicts, all-reduces) per rank."""
    world = _World(2 * len(hosts))
    ranks = []
    for index, (host, (gpus, checks, log_text)) in enumerate(hosts.items()):
        (tmp_path / f"{host}.log").write_text(log_text)
        ranks += [
            _FakeRank(world, 2 * index + local, host, gpus=gpus, checks=checks, seconds=seconds) for local in (0, 1)
        ]
    verdicts: list[str | None] = [None] * len(ranks)

    def rank_main(rank: _FakeRank) -> None:
        verdicts[rank.rank] = run_checks(rank, tmp_path / f"{rank.host}.log")  # type: ignore[arg-type]

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not any(thread.is_alive() for thread in threads)
    return verdicts, [rank.all_reduces for rank in ranks]


def test_every_rank_reaches_the_same_verdict_through_the_same_collectives(tmp_path: Path) -> None:
    p5 = Checks(expected_gpus=8, efa=True, min_busbw_gbps=80.0, timeout_minutes=1.0)
    # Healthy: EFA in every host's log, 450 GB/s of busbw (512 MiB in 1.79 ms over 4 ranks).
    fast = 536_870_912 / 300e9
    verdicts, all_reduces = _run_world(
        tmp_path, {"algo-1": (8, p5, EFA_LOG_CURRENT), "algo-2": (8, p5, EFA_LOG_CURRENT)}, seconds=fast
    )
    assert verdicts == [None] * 4 and all_reduces == [1] * 4
    # One host fell back to TCP: every rank names it.
    verdicts, _ = _run_world(tmp_path, {"algo-1": (8, p5, EFA_LOG_CURRENT), "algo-2": (8, p5, SOCKET_LOG)})
    assert len(set(verdicts)) == 1 and "host algo-2: NCCL uses network 'Socket'" in str(verdicts[0])
    # EFA fine, bandwidth far below the floor.
    verdicts, _ = _run_world(
        tmp_path, {"algo-1": (8, p5, EFA_LOG_CURRENT), "algo-2": (8, p5, EFA_LOG_CURRENT)}, seconds=1.0
    )
    assert len(set(verdicts)) == 1 and str(verdicts[0]).startswith("all-reduce bus bandwidth 0.8 GB/s across 2 hosts")


def test_ranks_skip_nccl_together_where_no_gpu_check_applies(tmp_path: Path) -> None:
    no_efa = Checks(expected_gpus=4, efa=False, min_busbw_gbps=0.0, timeout_minutes=1.0)
    verdicts, all_reduces = _run_world(tmp_path, {"algo-1": (4, no_efa, ""), "algo-2": (4, no_efa, "")})
    assert verdicts == [None] * 4 and all_reduces == [0] * 4
    # Only one host uses EFA (the other has no EFA device): all ranks still run the NCCL part; only it is judged.
    efa = Checks(expected_gpus=4, efa=True, min_busbw_gbps=0.0, timeout_minutes=1.0)
    verdicts, all_reduces = _run_world(tmp_path, {"algo-1": (4, efa, EFA_LOG), "algo-2": (4, no_efa, SOCKET_LOG)})
    assert verdicts == [None] * 4 and all_reduces == [1] * 4
    # A short host ends it before any NCCL call, on every rank.
    verdicts, all_reduces = _run_world(tmp_path, {"algo-1": (4, efa, EFA_LOG), "algo-2": (3, efa, EFA_LOG)})
    assert all_reduces == [0] * 4 and set(verdicts) == {
        "GPUs missing (torch.cuda.device_count()): host algo-2 sees 3 of the 4 expected"
    }


def test_the_checks_and_the_timed_all_reduce_run_for_real_in_a_process_group(tmp_path: Path) -> None:
    """The collectives the GPU checks use, on gloo and the CPU: the same steps, group released after."""
    import torch.distributed as dist
    from torch.distributed import HashStore  # type: ignore[attr-defined]

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        ctrl = dist.new_group(backend="gloo")
        passed = tmp_path / "passed"
        Preflight(Checks(0, False, 0.0, 1.0, passed_file=str(passed)), None).run(
            "algo-1", rank=0, ranks=1, local_rank=0, group=ctrl
        )
        assert passed.exists()
        job = training.preflight._Job(
            "algo-1", Checks(None, True, 80.0, 1.0), rank=0, ranks=1, local_rank=0, group=ctrl
        )
        groups = len(dist.distributed_c10d._world.pg_map)
        assert job.time_all_reduce(buffer_bytes=1 << 20) > 0
        assert len(dist.distributed_c10d._world.pg_map) == groups
        assert job.gather("still usable") == ["still usable"]
    finally:
        dist.destroy_process_group()


def test_a_host_with_fewer_gpus_than_processes_fails_the_check_before_taking_a_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 7)
    preflight = Preflight(Checks(8, True, 80.0, 1.0), None)
    preflight.check_devices("algo-2", 6)  # GPU 6 of 7: there
    with pytest.raises(PreflightError) as raised:
        preflight.check_devices("algo-2", 7)
    assert str(raised.value) == (
        "GPUs missing (torch.cuda.device_count()): host algo-2 sees 7, fewer than its training processes "
        "(one per GPU; this one is local rank 7)"
    )

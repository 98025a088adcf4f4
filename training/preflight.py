"""The pre-flight check: a short distributed check inside the training workers, before training starts.

The launcher hands the checks to the training workers (``TRAINING_PREFLIGHT``, JSON); every worker
runs them right after joining the training's process group, before it builds the model and so before
any checkpoint is loaded, and training starts only when they pass. Inside the workers rather than as
a job of its own: a second torchrun would start a second interpreter and import torch a second time
on every host (seconds per job, measured in docs/BENCHMARKS.md). NCCL's INIT and NET log, which the
EFA check reads, goes to a file the check owns (`NcclLog`), and what the job's own ``NCCL_DEBUG``
asked for is copied from it to the job's log. A SIGTERM during the check ends the worker at once:
nothing has been trained. The `preflight` hyperparameter turns the check off.

Every rank reports to every other over the training's gloo group, so every host reaches the same
verdict and writes the same first line to its failure file, naming the bad hosts (``PreflightFailed: ...``):

1. devices: every host sees (torch.cuda.device_count()) at least the GPUs its instance type has and
   as many as any other host; on gloo, so CPU hosts run it too;
2. EFA, on GPUs where the run uses EFA: NCCL's own init log names the network it chose, which must be
   the aws-ofi-nccl plugin (``Using network Libfabric``) with the ``efa`` provider, not TCP sockets;
3. bandwidth, on GPUs across more than one host where a floor is given: the bus bandwidth of an
   all-reduce over every rank (nccl-tests' busbw) reaches the instance type's floor.

Torch-free at import (the launcher reads its settings from here); `Preflight.run` imports torch.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from contract.layout import EXPECTED_GPUS_ENV, MIN_BUSBW_ENV, PREFLIGHT_ENV, PREFLIGHT_FAILED
from training.sagemaker_contract import ContractError, describe

log = logging.getLogger("training.preflight")

# 512 MiB of fp32: past the sizes where EFA's all-reduce bandwidth still climbs steeply, a few ms per
# all-reduce on a healthy p5 cluster, a few seconds in all on TCP.
BUFFER_BYTES = 512 * 2**20
WARMUP_ITERS = 3
TIMED_ITERS = 10

# NCCL's init log (src/init.cc: "Using network %s"), and aws-ofi-nccl's provider line: "NET/OFI Selected
# provider is efa, fabric is efa-direct (found 32 nics)"; before aws-ofi-nccl 1.14, "Selected Provider is efa".
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$", re.MULTILINE)
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,(]+)")


class PreflightError(RuntimeError):
    """The check failed, or could not finish; the message is the problem, the same on every rank."""


def failure_line(problem: str) -> str:
    return f"{PREFLIGHT_FAILED}: {problem}"


@dataclass(frozen=True)
class Checks:
    """What this host's pre-flight expects; the launcher resolves it and hands it to the workers."""

    expected_gpus: int | None
    """GPUs the instance type has (None: only as many as the most any host sees)."""
    efa: bool
    """The run uses EFA on this host: NCCL must choose it."""
    min_busbw_gbps: float
    """All-reduce bus bandwidth floor across hosts, GB/s (0: none)."""
    timeout_minutes: float

    passed_file: str = ""
    """A file the workers create on this host when the check passed: the launcher tells by it a check
    that failed or could not finish from a training that failed ("": none)."""

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Checks | None:
        """The checks the launcher handed this worker; None when it runs none."""
        raw = env.get(PREFLIGHT_ENV, "").strip()
        return cls(**json.loads(raw)) if raw else None


def _number_env(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ContractError(f"environment variable {name}={raw!r} must be a number >= 0")
    return value


def checks_from_env(env: Mapping[str, str], *, efa: bool, timeout_minutes: float) -> Checks:
    """The checks from the job's environment (TRAINING_EXPECTED_GPUS, TRAINING_MIN_BUSBW_GBPS)."""
    expected = _number_env(env, EXPECTED_GPUS_ENV)
    if expected is not None and not expected.is_integer():
        raise ContractError(f"environment variable {EXPECTED_GPUS_ENV}={env[EXPECTED_GPUS_ENV]!r} must be an integer")
    floor = _number_env(env, MIN_BUSBW_ENV) or 0.0
    return Checks(None if expected is None else int(expected), efa, floor, timeout_minutes)


@dataclass(frozen=True)
class DeviceReport:
    """What one rank sees."""

    host: str
    gpus: int
    expected_gpus: int | None


def device_verdict(reports: Sequence[DeviceReport]) -> str | None:
    """The hosts that see fewer GPUs than their type has or than another host sees; None when none does."""
    most = max(report.gpus for report in reports)
    short: dict[str, tuple[int, int]] = {}
    for report in reports:
        needed = max(report.expected_gpus or 0, most)
        if report.gpus < needed:
            seen, _ = short.get(report.host, (report.gpus, needed))
            short[report.host] = (min(seen, report.gpus), needed)
    if not short:
        return None
    hosts = ", ".join(f"host {host} sees {seen} of the {needed} expected" for host, (seen, needed) in short.items())
    return f"GPUs missing (torch.cuda.device_count()): {hosts}"


@dataclass(frozen=True)
class NcclNetwork:
    """What NCCL's init log says about the network between hosts (None: the log does not say)."""

    network: str | None
    provider: str | None

    @property
    def efa(self) -> bool:
        return self.network is not None and "libfabric" in self.network.lower() and self.provider in (None, "efa")


def nccl_network(log_text: str) -> NcclNetwork:
    """The network NCCL chose ("Socket", "IB", "Libfabric", "AWS Libfabric") and aws-ofi-nccl's provider."""
    networks = _NETWORK.findall(log_text)
    provider = _PROVIDER.search(log_text)
    return NcclNetwork(networks[-1] if networks else None, provider.group(1) if provider else None)


def efa_verdict(networks: Sequence[tuple[str, NcclNetwork]]) -> str | None:
    """The hosts whose NCCL runs without EFA though the run uses it; hosts whose log says nothing are not judged."""
    bad: dict[str, NcclNetwork] = {}
    for host, network in networks:
        if network.network is not None and not network.efa:
            bad.setdefault(host, network)
    if not bad:
        return None

    def said(network: NcclNetwork) -> str:
        if network.provider is not None and network.provider != "efa":
            return f"the OFI plugin chose provider {network.provider!r}, not efa"
        return f"NCCL uses network {network.network!r}, not the OFI plugin (Libfabric) over EFA"

    hosts = "; ".join(f"host {host}: {said(network)}" for host, network in bad.items())
    return f"NCCL is not using EFA though the run asks for it: {hosts}"


def bus_bandwidth_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' busbw of one all-reduce: algbw (bytes / time, GB/s of 1e9 B) x 2(n-1)/n."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def bandwidth_verdict(busbw_gbps: float, floor_gbps: float, *, hosts: int, ranks: int) -> str | None:
    if busbw_gbps >= floor_gbps:
        return None
    return (
        f"all-reduce bus bandwidth {busbw_gbps:.1f} GB/s across {hosts} hosts ({ranks} ranks) is below the "
        f"{floor_gbps:g} GB/s floor for this instance type ({MIN_BUSBW_ENV}); a host or its network is degraded"
    )


class _Job:
    """This rank's view of the check: the collectives it needs, over the training's gloo group."""

    def __init__(self, host: str, checks: Checks, *, rank: int, ranks: int, local_rank: int, group: Any) -> None:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        self.torch, self.dist, self.host, self.checks, self.group = torch, dist, host, checks, group
        self.timeout = timedelta(minutes=checks.timeout_minutes)
        self.rank, self.ranks, self.local_rank = rank, ranks, local_rank

    def gather(self, value: Any) -> list[Any]:
        """`value` from every rank, in rank order (plain values only)."""
        out: list[Any] = [None] * self.ranks
        self.dist.all_gather_object(out, value, group=self.group)
        return out

    def time_all_reduce(self, buffer_bytes: int = BUFFER_BYTES) -> float:
        """Seconds per all-reduce of `buffer_bytes` over NCCL, on the slowest rank; NCCL logs its init meanwhile.
        The group and the buffer are released before training starts. Without a GPU the same steps run
        over gloo on the CPU (the check never asks for that; tests do, so this path is run on CPU too)."""
        torch, dist = self.torch, self.dist
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(self.local_rank)
        group = dist.new_group(backend="nccl" if cuda else "gloo", timeout=self.timeout)
        buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")

        def synchronize() -> None:
            if cuda:
                torch.cuda.synchronize()

        try:
            for _ in range(WARMUP_ITERS):
                dist.all_reduce(buffer, group=group)
            synchronize()
            dist.barrier(group=group)
            started = time.perf_counter()
            for _ in range(TIMED_ITERS):
                dist.all_reduce(buffer, group=group)
            synchronize()
            elapsed = (time.perf_counter() - started) / TIMED_ITERS
        finally:
            del buffer
            dist.destroy_process_group(group)
            if cuda:
                torch.cuda.empty_cache()
        return float(max(self.gather(elapsed)))


def _gpu_checks(job: _Job, nccl_log: Path, *, efa: bool, hosts: int, floor_gbps: float) -> str | None:
    """EFA and bandwidth, over NCCL: one timed all-reduce serves both (it also makes NCCL log its init)."""
    seconds = job.time_all_reduce()
    if efa:
        network = nccl_network(nccl_log.read_text(errors="replace") if nccl_log.exists() else "")
        if job.checks.efa and job.local_rank == 0:
            if network.network is None:
                log.warning("NCCL's log names no network: EFA use is not verified on host %s", job.host)
            else:
                log.info("host %s: NCCL network %s, provider %s", job.host, network.network, network.provider)
        gathered = job.gather((job.host, job.checks.efa, network.network, network.provider))
        problem = efa_verdict([(host, NcclNetwork(name, provider)) for host, uses, name, provider in gathered if uses])
        if problem:
            return problem
    busbw = bus_bandwidth_gbps(BUFFER_BYTES, seconds, job.ranks)
    if job.rank == 0:
        log.info(
            "all-reduce of %d MiB over %d ranks: %.2f ms, busbw %.1f GB/s",
            BUFFER_BYTES >> 20,
            job.ranks,
            seconds * 1e3,
            busbw,
        )
    if hosts > 1 and floor_gbps > 0:
        return bandwidth_verdict(busbw, floor_gbps, hosts=hosts, ranks=job.ranks)
    return None


def run_checks(job: _Job, nccl_log: Path) -> str | None:
    """The first problem found, the same on every rank; None when the cluster is fit to train."""
    checks, gpus = job.checks, job.torch.cuda.device_count()
    ranks = job.gather((job.host, gpus, checks.expected_gpus, checks.efa, checks.min_busbw_gbps))
    problem = device_verdict([DeviceReport(host, seen, expected) for host, seen, expected, _, _ in ranks])
    if problem:
        return problem
    if job.local_rank == 0:
        log.info("host %s sees %d GPUs, as expected", job.host, gpus)
    # Decided from what every rank said, so that all ranks run the same collectives.
    hosts = len({host for host, *_ in ranks})
    efa = any(uses for *_, uses, _ in ranks)
    floor = max(floor for *_, floor in ranks) if hosts > 1 else 0.0
    # No host is short, so every host sees as many GPUs as this one: on CPU all stop here.
    if gpus == 0 or not (efa or floor > 0):
        return None
    return _gpu_checks(job, nccl_log, efa=efa, hosts=hosts, floor_gbps=floor)


_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


class NcclLog:
    """NCCL's INIT and NET log in a file of the check's, for the EFA verdict.

    NCCL reads its debug settings once per process, when it first initialises, so those set here (before
    the process group exists) hold for the training's own communicators too. A thread copies from the
    file what the job's own settings asked for (the pipeline sets ``NCCL_DEBUG=WARN``) to where they
    asked for it (``NCCL_DEBUG_FILE``, else stdout), so training logs what it logged without the check;
    how far it got is kept beside the file, and the launcher, which outlives a worker that NCCL aborts,
    copies the rest (`forward_leftovers`).
    """

    def __init__(self, path: Path, env: Mapping[str, str], *, poll_seconds: float = 1.0) -> None:
        """A reader of the NCCL log at `path` for a job whose own settings are `env`'s."""
        level = env.get("NCCL_DEBUG", "").strip().upper()
        self._keep = _LEVELS[: _LEVELS.index(level) + 1] if level in _LEVELS else ()
        self._target = env.get("NCCL_DEBUG_FILE", "").strip()
        self.path = path
        self._sent = path.with_name(path.name + ".sent")
        self._offset = int(self._sent.read_text()) if self._sent.is_file() else 0
        self._lock = threading.Lock()
        self._poll = poll_seconds

    @classmethod
    def capture(cls, env: MutableMapping[str, str], directory: Path | None = None) -> NcclLog:
        """Point this process's NCCL log (`env`: its environment, before NCCL starts) at a file of the check's
        in `directory` (a new temporary one if None)."""
        folder = directory or Path(tempfile.mkdtemp(prefix="preflight-nccl-"))
        folder.mkdir(parents=True, exist_ok=True)
        nccl = cls(folder / f"nccl.{os.getpid()}.log", dict(env))
        subsystems = env.get("NCCL_DEBUG_SUBSYS", "").strip()
        if "INFO" not in nccl._keep:
            subsystems = "INIT,NET"
        elif subsystems.startswith("^"):  # the job's list excludes subsystems: do not exclude ours
            subsystems = "^" + ",".join(s for s in subsystems[1:].split(",") if s not in ("INIT", "NET"))
        elif subsystems:  # the job asked for INFO lines of some subsystems: add ours
            subsystems = ",".join(dict.fromkeys([*subsystems.split(","), "INIT", "NET"]))
        env.update(NCCL_DEBUG="TRACE" if "TRACE" in nccl._keep else "INFO", NCCL_DEBUG_FILE=str(nccl.path))
        if subsystems.strip("^"):
            env["NCCL_DEBUG_SUBSYS"] = subsystems
        else:
            env.pop("NCCL_DEBUG_SUBSYS", None)
        return nccl

    @classmethod
    def forward_leftovers(cls, directory: Path, env: Mapping[str, str], out: IO[str] | None = None) -> int:
        """Copy what the workers' threads had not yet copied from every NCCL log in `directory`; how many lines."""
        return sum(cls(path, env).forward(out) for path in sorted(directory.glob("nccl.*.log")))

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def wanted(self, line: str) -> bool:
        """Whether the job's own NCCL_DEBUG would have printed `line` (NCCL: "host:pid:tid [dev] NCCL WARN ...")."""
        level = re.search(r"\bNCCL (WARN|INFO|TRACE)\b", line)
        if level is None:  # NCCL's version banner
            return bool(self._keep)
        return level.group(1) in self._keep

    def forward(self, out: IO[str] | None = None) -> int:
        """Copy the complete lines written since the last call that the job asked for; how many."""
        with self._lock:
            if not self.path.exists():
                return 0
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
            complete = data[: data.rfind(b"\n") + 1]
            if not complete:
                return 0
            self._offset += len(complete)
            lines = [line for line in complete.decode(errors="replace").splitlines(keepends=True) if self.wanted(line)]
            if lines:
                target = self._target.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
                sink = out or (open(target, "a") if target else sys.stdout)  # noqa: SIM115
                sink.writelines(lines)
                sink.flush()
                if sink is not out and sink is not sys.stdout:
                    sink.close()
            self._sent.write_text(str(self._offset))
            return len(lines)

    def follow(self) -> None:
        """Forward in a background thread from now until the process exits."""
        if not self._keep:
            return

        def loop() -> None:
            while True:
                time.sleep(self._poll)
                self.forward()

        threading.Thread(target=loop, name="nccl-log", daemon=True).start()
        atexit.register(self.forward)


@dataclass
class Preflight:
    """What a training worker runs before training: the launcher's checks, and NCCL's log where EFA is judged."""

    checks: Checks
    nccl_log: NcclLog | None

    @classmethod
    def from_env(cls, env: MutableMapping[str, str]) -> Preflight | None:
        """Read the launcher's checks and, where this host's EFA is judged, point NCCL's log at the check;
        before torch starts NCCL. None when the launcher asked for no check."""
        checks = Checks.from_env(env)
        if checks is None:
            return None
        directory = Path(checks.passed_file).parent if checks.passed_file else None  # the launcher's folder
        return cls(checks, NcclLog.capture(env, directory) if checks.efa else None)

    def check_devices(self, host: str, local_rank: int) -> None:
        """Before this process takes its GPU (`local_rank`): a host that sees fewer GPUs than it runs
        training processes fails here, as the device check would, rather than on an invalid device ordinal.
        (Its peers then wait at the rendezvous until the timeout and end as a check that did not finish.)"""
        import torch  # noqa: PLC0415

        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if seen and local_rank >= seen:
            raise PreflightError(
                f"GPUs missing (torch.cuda.device_count()): host {host} sees {seen}, fewer than its training "
                f"processes (one per GPU; this one is local rank {local_rank})"
            )

    def run(self, host: str, *, rank: int, ranks: int, local_rank: int, group: Any) -> None:
        """Run the checks in the training's process group (`group`: its gloo group); raises PreflightError
        with the verdict, the same on every rank, or returns when the cluster is fit to train."""
        if local_rank == 0:
            log.setLevel(logging.INFO)  # one "passed" line per host, whatever the rank's log level
        started = time.monotonic()
        job = _Job(host, self.checks, rank=rank, ranks=ranks, local_rank=local_rank, group=group)
        # Nothing is trained yet: a stop ends the worker at once, as it would a process of its own.
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL) if main_thread else None
        try:
            problem = run_checks(job, self.nccl_log.path if self.nccl_log else Path(os.devnull))
        except Exception as exc:
            raise PreflightError(f"the pre-flight check did not finish: {describe(exc)}") from exc
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if self.nccl_log is not None:
                self.nccl_log.forward()
                self.nccl_log.follow()
        if problem:
            log.error("%s", failure_line(problem))
            raise PreflightError(problem)
        if local_rank == 0:
            if self.checks.passed_file:  # the launcher's temporary folder (created here on mpirun's other hosts)
                Path(self.checks.passed_file).parent.mkdir(parents=True, exist_ok=True)
                Path(self.checks.passed_file).touch()
            log.info("pre-flight check passed in %.2f s", time.monotonic() - started)

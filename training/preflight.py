"""The pre-flight check: a short distributed job on the training job's hosts, before training starts.

The launcher runs it on every host as a torchrun of its own (the same hosts and processes per host,
rendezvous on the training port + 1) and starts training only when it passes, so before the first
step and before any checkpoint is loaded. A phase of its own rather than the trainer's first act:
it can turn NCCL's INFO log on, into a file, for itself without changing what training logs; a bad
cluster ends it with its own exit status and typed failure line before a trainer exists; and the
`preflight` hyperparameter skips it without the trainer knowing. The cost is one more process
start-up per host (measured in docs/BENCHMARKS.md).

Every rank reports to every other over gloo, so every host reaches the same verdict and writes the
same first line to its failure file, naming the bad hosts (``PreflightFailed: ...``):

1. devices: every host sees (torch.cuda.device_count()) at least the GPUs its instance type has and
   as many as any other host; on gloo, so CPU hosts run it too;
2. EFA, on GPUs where the run uses EFA: NCCL's own init log names the network it chose, which must be
   the aws-ofi-nccl plugin (``Using network Libfabric``) with the ``efa`` provider, not TCP sockets;
3. bandwidth, on GPUs across more than one host where a floor is given: the bus bandwidth of an
   all-reduce over every rank (nccl-tests' busbw) reaches the instance type's floor.

Torch-free at import (the launcher reads its settings from here); `main` imports torch.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from training.layout import EXPECTED_GPUS_ENV, MIN_BUSBW_ENV, PREFLIGHT_FAILED
from training.sagemaker_contract import ContractError, Paths, read_resource_config, write_failure

log = logging.getLogger("training.preflight")

PORT_OFFSET = 1
"""The pre-flight's rendezvous port is the training one plus this: the two torchruns never share a store."""
# 512 MiB of fp32: past the sizes where EFA's all-reduce bandwidth still climbs steeply, a few ms per
# all-reduce on a healthy p5 cluster, a few seconds in all on TCP.
BUFFER_BYTES = 512 * 2**20
WARMUP_ITERS = 3
TIMED_ITERS = 10

# NCCL's init log (src/init.cc: "Using network %s"), and aws-ofi-nccl's provider line: "NET/OFI Selected
# provider is efa, fabric is efa-direct (found 32 nics)"; before aws-ofi-nccl 1.14, "Selected Provider is efa".
_NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$", re.MULTILINE)
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^\s,(]+)")


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

    def argv(self) -> list[str]:
        args = [f"--min-busbw-gbps={self.min_busbw_gbps}", f"--timeout-minutes={self.timeout_minutes}"]
        if self.expected_gpus is not None:
            args.append(f"--expected-gpus={self.expected_gpus}")
        return [*args, "--efa"] if self.efa else args

    @classmethod
    def parse(cls, argv: Sequence[str]) -> Checks:
        parser = argparse.ArgumentParser(prog="python -m training.preflight", description=__doc__.split("\n")[0])
        parser.add_argument("--expected-gpus", type=int, default=None)
        parser.add_argument("--efa", action="store_true")
        parser.add_argument("--min-busbw-gbps", type=float, default=0.0)
        parser.add_argument("--timeout-minutes", type=float, default=10.0)
        args = parser.parse_args(argv)
        return cls(args.expected_gpus, args.efa, args.min_busbw_gbps, args.timeout_minutes)


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
    """This rank's view of the pre-flight job: the collectives it needs, over gloo unless told otherwise."""

    def __init__(self, host: str, checks: Checks) -> None:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        self.torch, self.dist, self.host, self.checks = torch, dist, host, checks
        self.timeout = timedelta(minutes=checks.timeout_minutes)
        dist.init_process_group(backend="gloo", timeout=self.timeout)
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def gather(self, value: Any) -> list[Any]:
        """`value` from every rank, in rank order (plain values: ranks unpickle them as `__main__`)."""
        out: list[Any] = [None] * self.ranks
        self.dist.all_gather_object(out, value)
        return out

    def time_all_reduce(self) -> float:
        """Seconds per all-reduce of BUFFER_BYTES over NCCL, on the slowest rank; NCCL logs its init meanwhile."""
        torch, dist = self.torch, self.dist
        torch.cuda.set_device(self.local_rank)
        group = dist.new_group(backend="nccl", timeout=self.timeout)
        buffer = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32, device="cuda")
        for _ in range(WARMUP_ITERS):
            dist.all_reduce(buffer, group=group)
        torch.cuda.synchronize()
        dist.barrier(group=group)
        started = time.perf_counter()
        for _ in range(TIMED_ITERS):
            dist.all_reduce(buffer, group=group)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - started) / TIMED_ITERS
        return float(max(self.gather(elapsed)))

    def close(self) -> None:
        self.dist.destroy_process_group()


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


def main(argv: Sequence[str] | None = None) -> int:
    """One pre-flight rank (under torchrun): 0 when the cluster is fit, 1 with the failure file written."""
    checks = Checks.parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s preflight: %(message)s", stream=sys.stdout
    )
    started = time.monotonic()
    paths = Paths.from_env()
    host = read_resource_config(paths).current_host
    # NCCL reads these when it first initialises, later in this process: its INFO log goes to a file of ours.
    nccl_dir = Path(tempfile.mkdtemp(prefix="preflight-nccl-"))
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=str(nccl_dir / "nccl.log"))
    try:
        job = _Job(host, checks)
        try:
            problem = run_checks(job, nccl_dir / "nccl.log")
        finally:
            job.close()
    finally:
        shutil.rmtree(nccl_dir, ignore_errors=True)
    if problem:
        log.error("%s", failure_line(problem))
        write_failure(paths, failure_line(problem))
        return 1
    if job.rank == 0:
        log.info("passed in %.1f s", time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

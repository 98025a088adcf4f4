"""Process-group setup: rank/world from torchrun or mpirun, device, backend, determinism."""

from __future__ import annotations

import importlib
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from contract import distributions
from contract.config import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job; ``ctrl`` is a gloo group for small CPU-side agreements."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    ctrl: dist.ProcessGroup
    local_world_size: int = 1
    """The processes on this host."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _fill_env() -> None:
    # mpirun sets OMPI_* instead of torchrun's variables; a bare `python -m training.train` sets none.
    distributions.torchrun_variables(os.environ)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))


def host_rank() -> int:
    """This process's rank on its host, from torchrun's or mpirun's variables (0 for a bare process)."""
    _fill_env()
    return int(os.environ["LOCAL_RANK"])


def init_distributed(*, distribution: str, deterministic: bool, timeout_minutes: float) -> DistEnv:
    """Initialise the default process group (NCCL on GPUs, gloo on CPU, smddp on request) and a gloo one."""
    local_rank = host_rank()
    if deterministic:
        # cuBLAS reads this when it initialises, so it must be set before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cuda:nccl,cpu:gloo"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    strategy = distributions.distribution(distribution)
    if strategy.required_module:
        try:
            importlib.import_module(strategy.required_module)  # registers the strategy's backend
        except ImportError as exc:
            raise ConfigError(
                f"hyperparameter distribution={strategy.name!r} is invalid: {strategy.required_module} is not in "
                "this image; use distribution=ddp (NCCL over EFA) instead"
            ) from exc
    if strategy.backend:
        backend = strategy.backend
    timeout = timedelta(minutes=timeout_minutes)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    ctrl = new_group(backend="gloo", timeout=timeout)
    env = DistEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        ctrl=ctrl,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )
    log.info("rank %d/%d on %s (backend %s)", env.rank, env.world_size, device, backend)
    return env


def new_group(**kwargs: Any) -> dist.ProcessGroup:
    """`dist.new_group` of every rank. torch types its result as maybe the marker of a rank outside the group,
    which no rank is here."""
    group = dist.new_group(**kwargs)
    if not isinstance(group, dist.ProcessGroup):
        raise RuntimeError(f"dist.new_group({kwargs}) left rank {dist.get_rank()} out of a group of every rank")
    return group


def set_determinism(*, seed: int, deterministic: bool, device: torch.device) -> None:
    """Seed torch; in deterministic mode also pin GPU kernels, or (on CPU) the thread count."""
    torch.manual_seed(seed)
    if not deterministic:
        torch.backends.cudnn.benchmark = True
        return
    if device.type == "cpu":
        # CPU kernels are deterministic for a fixed thread count; one thread makes results
        # independent of the machine. (use_deterministic_algorithms changes no CPU kernel we use.)
        torch.set_num_threads(1)
        return
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

"""Helpers for the training tests: fake /opt/ml trees, process runners, log parsing."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import mmap
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from contract.config import from_hyperparameters
from contract.metrics import TRAIN_LOSS, VALIDATION_LOSS, metric_series
from training import direct_io
from training.launcher import child_pids
from training.sagemaker_contract import Paths
from training.signals import StopRequest
from training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]

# The tiny job every multi-process test runs; ~20 ms a step on one CPU core per process.
TINY_JOB: dict[str, str] = {
    "model": "tiny",
    "seq_len": "32",
    "batch_size": "4",
    "max_steps": "60",
    "optim.lr": "0.002",
    "optim.warmup_steps": "5",
    "metrics.log_interval": "1",
    "metrics.peak_tflops": "0.001",
    "checkpoint.interval_steps": "10",
    "eval.interval_steps": "30",
    "eval.max_sequences": "64",
    "train.deterministic": "true",
}


# A 12-step run of the tiny model with checkpoints at steps 4, 8 and 12, deterministic (resume tests).
CHECKPOINTED_JOB = {
    "model": "tiny",
    "seq_len": "32",
    "batch_size": "4",
    "max_steps": "12",
    "optim.lr": "0.002",
    "optim.warmup_steps": "2",
    "metrics.log_interval": "1",
    "checkpoint.interval_steps": "4",
    "checkpoint.keep_last": "5",
    "eval.max_sequences": "16",
    "train.deterministic": "true",
}


def make_opt_ml(
    root: Path,
    hyperparameters: Mapping[str, str],
    *,
    corpus: Path | None,
    hosts: tuple[str, ...] = ("algo-1",),
    current_host: str = "algo-1",
) -> Paths:
    """A SageMaker-shaped /opt/ml tree: config files and (unless corpus is None) the train channel."""
    paths = Paths(root)
    paths.hyperparameters.parent.mkdir(parents=True, exist_ok=True)
    paths.hyperparameters.write_text(json.dumps(dict(hyperparameters)))
    paths.resource_config.write_text(
        json.dumps({"current_host": current_host, "hosts": list(hosts), "network_interface_name": "lo"})
    )
    if corpus is not None:
        shutil.copytree(corpus, paths.channel("train"))
    return paths


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env(root: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without SageMaker/launcher variables, pointed at ``root``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SM_", "TRAINING_", "OPT_ML", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))
    }
    env.update(OPT_ML_ROOT=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "training.train",
    ]


def launcher() -> list[str]:
    return [sys.executable, "-m", "training.launcher", "train"]


def run(command: list[str], env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def kill_tree(pid: int, signum: int = signal.SIGKILL) -> None:
    """Signal ``pid`` and its children (torchrun's workers live in their own sessions)."""
    for target in [*child_pids(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)


def run_until(
    command: list[str], env: Mapping[str, str], pattern: str, action: object, timeout: float = 120
) -> tuple[int, str]:
    """Start ``command``, call ``action(proc)`` when a stdout line matches ``pattern``; (status, output)."""
    proc = subprocess.Popen(
        command, env=dict(env), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = []
    fired = False
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if not fired and re.search(pattern, line):
                fired = True
                action(proc)  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError("".join(lines[-30:]))
        status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    assert fired, f"never saw {pattern!r}:\n" + "".join(lines[-30:])
    return status, "".join(lines)


def step_losses(log: str) -> dict[int, float]:
    """step -> train loss from the metrics lines (the last occurrence of a step wins)."""
    return metric_series(log).get(TRAIN_LOSS, {})


def val_losses(log: str) -> dict[int, float]:
    return metric_series(log).get(VALIDATION_LOSS, {})


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def run_in_process(root: Path, hyperparameters: Mapping[str, str], stop: StopRequest | None = None) -> tuple[bool, str]:
    """Run a Trainer in this process as a world of one; (completed, its log)."""
    saved_env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    logger = logging.getLogger("training")
    capture, level = _Capture(), logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        trainer = Trainer(from_hyperparameters(hyperparameters), Paths(root), stop or StopRequest())
        try:
            completed = trainer.train()
        finally:
            trainer.close()
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return completed, "\n".join(capture.lines)


def o_direct_works(directory: Path) -> bool:
    """Whether `directory`'s file system opens files with O_DIRECT."""
    try:
        os.close(os.open(directory / "o-direct-probe", os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0)))
    except OSError:
        return False
    return hasattr(os, "O_DIRECT")


def refuse_o_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make training.direct_io's file system refuse O_DIRECT, as tmpfs did before Linux 6.6 and some overlay and
    FUSE file systems do."""
    real_open = os.open

    def open_without_o_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", open_without_o_direct)


def cached_pages(path: Path) -> int:
    """How many of `path`'s pages the page cache holds: mincore(2) over a private map of the file, which reads
    none of it."""
    size = path.stat().st_size
    if not size:
        return 0
    residency = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    libc = ctypes.CDLL(None, use_errno=True)
    with path.open("rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), residency):
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
        finally:
            del start  # the map closes only once nothing holds its buffer
    return sum(page & 1 for page in residency)


def save_rows_in_pieces(rank: int, world: int, port: int, directory: str, item_bytes: int) -> None:
    """One of `world` processes (torch.multiprocessing.spawn's, which must import it): save a 200 x 20 tensor
    of torch.manual_seed(0), sharded by rows across them, with items of at most `item_bytes`."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import training.checkpoint.planners

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        training.checkpoint.planners._MAX_ITEM = item_bytes
        torch.manual_seed(0)
        sharded = distribute_tensor(torch.randn(200, 20), init_device_mesh("cpu", (world,)), [Shard(0)])
        save(
            {"weight": sharded},
            storage_writer=FileSystemWriter(directory),
            planner=training.checkpoint.planners._PieceSavePlanner(),
        )
    finally:
        dist.destroy_process_group()


def state_layouts(state: Mapping[Any, Mapping[str, Any]]) -> dict[Any, dict[str, Any]]:
    """An optimizer state's layout, not its values: per parameter, each entry's type, and for a tensor its shape,
    placements and local shard's shape and strides (a DTensor's), dtype and device."""

    def layout(value: object) -> object:
        if isinstance(value, torch.Tensor):
            local = getattr(value, "to_local", lambda: value)()
            placements = getattr(value, "placements", None)
            return type(value), value.shape, placements, local.shape, local.stride(), value.dtype, value.device
        return type(value)

    return {name: {key: layout(value) for key, value in entries.items()} for name, entries in state.items()}


def compare_unfilled_sharded_optimizer_state(rank: int, world: int, port: int) -> None:
    """One of `world` processes (torch.multiprocessing.spawn's): raise AssertionError unless the optimizer state
    `training.checkpoint.state._unfilled_optimizer_state` makes for an FSDP2 model is laid out as the state DCP's step
    makes, on shards of unequal size (3 rows over 2 ranks) and an empty one (1 row over 2 ranks)."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state, get_state_dict
    from torch.distributed.fsdp import fully_shard

    import training.checkpoint.state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:

        def built() -> tuple[nn.Module, torch.optim.Optimizer]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
            fully_shard(model)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

        stepped_model, stepped = built()
        unfilled_model, unfilled = built()
        _init_optim_state(stepped)
        assert training.checkpoint.state._unfilled_optimizer_state(unfilled)
        expected = get_state_dict(stepped_model, stepped)[1]["state"]
        made = get_state_dict(unfilled_model, unfilled)[1]["state"]
        assert made.keys() == expected.keys() and len(made) == 4
        assert state_layouts(made) == state_layouts(expected)
    finally:
        dist.destroy_process_group()


class Payload:
    """Unpickling this writes `marker`: what code planted in a checkpoint would do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))

"""Benchmarks of the training package, on the code paths real training runs.

    python -m training.bench train --hp model=gpt2 --hp batch_size=16 --warmup 10 --steps 50
    python -m training.bench loader --seq-len 1024 --batch 64
    python -m training.bench checkpoint --hp model=gpt2
    python -m training.bench startup --hosts 2 --nproc 1
    python -m training.bench stragglers --processes 2 --steps 2000
    python -m training.bench peer --steps 2000 --repeats 2
    python -m training.bench weights --repeats 5

`train` builds the real Trainer (model, parallelisation, optimizer, loader) on synthetic token
shards and runs its real loop; only the step boundaries are timed (with a device sync at the
end of the warm-up and at the end). `loader` times the distributed loader on memory-mapped
shards. `checkpoint` times a blocking DCP save and the blocking part of an async one of the
Trainer's own state, and compares each save's and cold load's bandwidth with the disk's direct
(O_DIRECT, as `dd oflag=direct`) write and read of a file as large, in the same directory, probed
just before and just after it.
`startup` starts the launcher of every "host" on this machine at once and times it to the first
training step, with the pre-flight check and without, alternately. `stragglers` times the straggler
check's own calls per step in a gloo world on this machine.
`peer` runs nanoGPT and this package's trainer on tiny Shakespeare side by side (training/bench_peer.py).
`weights` writes a GPT-2-124M-sized model folder (Hugging Face layout, fp32) and times the trainer's cold load of
it (the folder checked, the model built on meta, its storage made and every weight read: training/finetune.py)
against the disk's direct read of as many bytes, probed just before and just after each load, and against the
same read into memory the process has not touched (as a load's reads fill new memory), probed before each load.
Each prints one row; timings are for docs/BENCHMARKS.md, never asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from contract.config import StragglerConfig, from_hyperparameters, parse_overrides
from contract.layout import MASTER_ADDR_ENV, MASTER_PORT_ENV, NPROC_ENV, OPT_ML_ROOT_ENV, step_dir
from contract.model_args import PRESETS
from training import bench_peer
from training.data import DistributedTokenLoader, TokenSamples, write_shard
from training.direct_io import CHUNK, aligned_buffer, evict, reading_threads
from training.distributed import new_group
from training.sagemaker_contract import Paths
from training.signals import StopRequest
from training.stragglers import StepTimer, StragglerDetector, share_and_judge

if TYPE_CHECKING:
    from training.checkpoint import CheckpointManager
    from training.trainer import Trainer


def _synthetic_shards(folder: Path, *, tokens: int, vocab: int, shards: int = 2, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(shards):
        path = folder / f"bench_train_{i:03d}.bin"
        write_shard(path, rng.integers(0, min(vocab, 50257), tokens // shards, dtype=np.uint16))
        paths.append(path)
    return paths


_SINGLE_PROCESS = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}
SINGLE_PROCESS_ENV = (*_SINGLE_PROCESS, "MASTER_PORT")
"""What `_single_process_env` sets where it is not set: the environment of a process that is its own world."""


def _single_process_env() -> None:
    for key, value in _SINGLE_PROCESS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def _device_name(torch: Any) -> str:
    return str(torch.cuda.get_device_name()) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}"


def _peak_memory_gib(torch: Any) -> float:
    if torch.cuda.is_available():
        return float(torch.cuda.max_memory_allocated()) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kiB on Linux


def _row(fields: dict[str, Any]) -> str:
    return " | ".join(f"{k}={v}" for k, v in fields.items())


def bench_train(hyperparameters: dict[str, str], *, warmup: int, steps: int, tokens: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - keep `python -m training.bench loader` torch-free and fast

    from training.trainer import Trainer  # noqa: PLC0415

    _single_process_env()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        paths = Paths(Path(tmp))
        overrides = {
            "max_steps": str(warmup + steps),
            "checkpoint.interval_steps": "0",
            "checkpoint.interval_minutes": "0",
            "eval.interval_steps": "0",
            "metrics.log_interval": str(10**9),
            "optim.warmup_steps": str(max(1, (warmup + steps) // 10)),
            **hyperparameters,
        }
        cfg = from_hyperparameters(overrides)
        vocab = cfg.model.vocab_size or PRESETS[cfg.model.name].vocab_size
        _synthetic_shards(paths.channel("train"), tokens=tokens, vocab=vocab)
        trainer = Trainer(cfg, paths, StopRequest())
        marks: dict[str, float] = {}
        step_fn: Callable[[], Any] = trainer._train_step

        def timed_step() -> Any:
            result = step_fn()
            done = trainer.state.step + 1
            if done in (warmup, warmup + steps):
                if trainer.env.device.type == "cuda":
                    torch.cuda.synchronize()
                marks["start" if done == warmup else "end"] = time.perf_counter()
            return result

        trainer._train_step = timed_step  # type: ignore[method-assign]
        if warmup == 0:
            marks["start"] = time.perf_counter()
        try:
            trainer.train()
        finally:
            trainer.close()
        seconds = marks["end"] - marks["start"]
        tokens_per_step = trainer.global_batch * trainer.seq_len
        tokens_per_sec = steps * tokens_per_step / seconds
        peak = trainer.peak_flops
        return {
            "model": cfg.model.name,
            "distribution": cfg.distribution,
            "layout": trainer.layout.describe(),
            "batch": trainer.global_batch,
            "seq": trainer.seq_len,
            "tokens_per_sec": round(tokens_per_sec),
            "mfu": round(tokens_per_sec * trainer.flops_per_token / peak, 4) if peak else "n/a",
            "step_ms": round(1000 * seconds / steps, 1),
            "peak_mem_gib": round(_peak_memory_gib(torch), 2),
            "torch": torch.__version__,
            "device": _device_name(torch),
        }


def bench_loader(*, seq_len: int, batch: int, tokens: int, batches: int, world_size: int) -> dict[str, Any]:
    """Tokens per second of one rank's loader (rank 0 of `world_size`) reading memory-mapped shards."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        shards = _synthetic_shards(Path(tmp), tokens=tokens, vocab=50304)
        samples = TokenSamples(shards, seq_len)
        loader = DistributedTokenLoader(samples, micro_batch=batch, rank=0, world_size=world_size, seed=0, shuffle=True)
        for _ in range(10):  # first touches fault pages in; the page cache then holds the shards
            loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        seconds = time.perf_counter() - start
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "loader": "DistributedTokenLoader (shuffled, memmap)",
        "batch": batch,
        "seq": seq_len,
        "tokens_per_sec": round(batches * batch * seq_len / seconds),
        "us_per_batch": round(1e6 * seconds / batches, 1),
    }


_DIRECT_BLOCK = 64 << 20  # dd bs=64M; a multiple of every device's logical block size


class _DiskProbe:
    """The disk's direct write and read, as `dd oflag=direct` and `iflag=direct` measure them: `write` writes a
    new file in `directory` as large as `size` bytes rounded up to whole blocks (then fsync), `read` reads it
    back, both with O_DIRECT from a page-aligned buffer; each returns GiB/s. Where the file system refuses
    O_DIRECT (tmpfs, some overlays), `method` says "buffered+fsync" and a read drops the file's cached pages
    first. `close` deletes the file."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / "direct-io-probe"
        self.blocks = max(1, -(-size // _DIRECT_BLOCK))
        self.method = "O_DIRECT"
        self.buffer = aligned_buffer(_DIRECT_BLOCK)
        self.buffer.write(os.urandom(_DIRECT_BLOCK))

    def _gibps(self, seconds: float) -> float:
        return self.blocks * _DIRECT_BLOCK / 2**30 / seconds

    def write(self) -> float:
        self.path.unlink(missing_ok=True)  # what it frees is synced (and trimmed, where a commit trims) untimed
        os.sync()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        except OSError:
            self.method = "buffered+fsync"
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        start = time.perf_counter()
        try:
            for _ in range(self.blocks):
                os.write(fd, self.buffer)
            os.fsync(fd)
        finally:
            os.close(fd)
        return self._gibps(time.perf_counter() - start)

    def read(self) -> float:
        if self.method == "O_DIRECT":
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        else:
            evict(self.path)
            fd = os.open(self.path, os.O_RDONLY)
        start = time.perf_counter()
        try:
            while os.readv(fd, [self.buffer]):
                pass
        finally:
            os.close(fd)
        return self._gibps(time.perf_counter() - start)

    def read_into_new_memory(self) -> float:
        """The file read into memory the process has not touched (page-aligned, advised to huge pages), as a load
        must read what it keeps, in `hf_weights`' reads (`CHUNK` bytes each, by the process's reading threads at
        once). Each new page is faulted in (and zeroed) by the read; `read` reads into one buffer, touched already."""
        fd = os.open(self.path, os.O_RDONLY | (os.O_DIRECT if self.method == "O_DIRECT" else 0))
        if self.method != "O_DIRECT":
            evict(self.path)
        target = aligned_buffer(self.blocks * _DIRECT_BLOCK)
        span = memoryview(target)
        try:
            start = time.perf_counter()
            reads = [
                reading_threads().submit(os.preadv, fd, [span[at : at + CHUNK]], at)
                for at in range(0, len(span), CHUNK)
            ]
            for read in reads:
                read.result()
            seconds = time.perf_counter() - start
        finally:
            os.close(fd)
            span.release()
            target.close()
        return self._gibps(seconds)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        self.buffer.close()


def _timed(call: Callable[[], object]) -> tuple[float, tuple[float, float]]:
    """Seconds `call` took, and the CPU seconds of all this process's threads meanwhile, in user space and in the
    kernel."""
    cpu_start, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    call()
    seconds, cpu_end = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return seconds, (cpu_end.ru_utime - cpu_start.ru_utime, cpu_end.ru_stime - cpu_start.ru_stime)


def _settle(checkpoints: CheckpointManager) -> None:
    """Wait for the deletions of old checkpoints a save started, and sync the file system, so that no deletion
    of an old checkpoint and no unwritten page of this process shares the disk with what follows."""
    checkpoints.wait_for_deletions()
    os.sync()


def _ratios(name: str, gib: float, seconds: list[float], probes: list[tuple[float, float]]) -> dict[str, Any]:
    """The median and range of the rates of `gib` in each of `seconds` over the disk's rate around each."""
    ratios = [gib / taken / _bracketed(*around) for taken, around in zip(seconds, probes, strict=True)]
    return {name: round(statistics.median(ratios), 2), f"{name}_range": [round(min(ratios), 2), round(max(ratios), 2)]}


def _bracketed(before: float, after: float) -> float:
    """The disk's rate over an operation, from probes of equal size just before and just after it: their
    bytes over their summed times (the harmonic mean of their rates)."""
    return 2 / (1 / before + 1 / after)


def _evict_newest(trainer: Trainer) -> None:
    """Drop the cached pages of the files of `trainer`'s checkpoint of its current step: a cold load reads the disk."""
    for path in (trainer.paths.checkpoints / step_dir(trainer.state.step)).iterdir():
        evict(path)


def _resumed(root: str, hyperparameters: dict[str, str], port: int, step: int) -> float:
    """Run in a new interpreter: build the Trainer on `root`, which resumes from its newest checkpoint, that of
    `step`, as a restarted job does; the seconds its load took. `port`: its process group's, free."""
    os.environ["MASTER_PORT"] = str(port)
    _single_process_env()
    from training.trainer import Trainer  # noqa: PLC0415

    trainer = Trainer(from_hyperparameters(hyperparameters), Paths(Path(root)), StopRequest())
    try:
        if trainer.start_step != step:
            raise RuntimeError(f"the new process resumed at step {trainer.start_step}, not {step}")
        return trainer.clock.totals()["checkpoint_load"]
    finally:
        trainer.close()


def _resume_in_new_process(root: Path, hyperparameters: dict[str, str], step: int) -> float:
    """`_resumed`, in a process of its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as process:
        return process.submit(_resumed, str(root), hyperparameters, _free_port(), step).result()


def _timed_resumes(
    trainer: Trainer, probe: _DiskProbe, hyperparameters: dict[str, str], count: int
) -> tuple[list[float], list[tuple[float, float]]]:
    """The seconds of `count` cold loads of `trainer`'s newest checkpoint, each the load of a new process's
    Trainer (`_resume_in_new_process`), and the disk's direct read probed just before the process starts and just
    after it ends (so the probes also span its start: its imports and building the Trainer)."""
    seconds, probes = [], []
    for _ in range(count):
        _settle(trainer.checkpoints)
        _evict_newest(trainer)
        before = probe.read()
        seconds.append(_resume_in_new_process(trainer.paths.root, hyperparameters, trainer.state.step))
        _settle(trainer.checkpoints)
        probes.append((before, probe.read()))
    return seconds, probes


@dataclass
class _CheckpointTimings:
    """`bench_checkpoint`'s timed saves and loads (seconds, CPU seconds in user space and in the kernel), and the
    disk's direct rates probed just before and just after each."""

    blocking: list[float] = field(default_factory=list)
    save_cpu: list[tuple[float, float]] = field(default_factory=list)
    staging: list[float] = field(default_factory=list)
    loading: list[float] = field(default_factory=list)
    load_cpu: list[tuple[float, float]] = field(default_factory=list)
    writes: list[tuple[float, float]] = field(default_factory=list)
    reads: list[tuple[float, float]] = field(default_factory=list)
    resuming: list[float] = field(default_factory=list)
    resume_reads: list[tuple[float, float]] = field(default_factory=list)


def bench_checkpoint(
    hyperparameters: dict[str, str], *, repeats: int, resumes: int | None = None, parent: Path | None = None
) -> dict[str, Any]:
    """Seconds the training loop is blocked by a checkpoint (a blocking save, and with
    ``checkpoint.async_save=true`` an async one's staging; without it the second save of each pair blocks too,
    and its time is not reported),
    and a save's and a cold load's bandwidth against the disk's direct write and read of as many bytes in the
    same directory, probed just before and just after each save and load: a virtual disk's bandwidth drifts
    within a run, so each ratio compares a save or load with the disk's rate over the probes around it
    (`_bracketed`), and the row gives the median of the `repeats` ratios and their range; and the median CPU
    seconds of a blocking save and of a cold load (all their threads) in user space, which the disk's drift
    moves less, and in the kernel. Then `resumes` (default: `repeats`) times, a new process builds the Trainer, which
    loads the newest checkpoint cold as a restarted job does, its first load in a process that has not saved or
    loaded before: its load's seconds, and their ratio to the disk's rate over probes just before the process starts
    and just after it ends (none with `resumes` 0).
    A first save, untimed, sizes the probes. Old checkpoints are deleted in the
    background while training goes on, and a load waits for that: the benchmark waits for it and syncs the file
    system before each probe and each timed save and load (`_settle`). A timed save starts the deletion its
    commit allows just before its timer stops, and its CPU seconds count the deleting thread's.
    `parent`: the directory to work in (a temporary one in it; the system's temporary directory if None)."""
    import torch  # noqa: PLC0415

    from training.trainer import Trainer  # noqa: PLC0415

    _single_process_env()
    with tempfile.TemporaryDirectory(prefix="bench-", dir=parent) as tmp:
        paths = Paths(Path(tmp))
        settings = {
            "max_steps": "100",
            "optim.warmup_steps": "1",
            "checkpoint.keep_last": "2",
            "eval.interval_steps": "0",
            **hyperparameters,
        }
        cfg = from_hyperparameters(settings)
        vocab = cfg.model.vocab_size or PRESETS[cfg.model.name].vocab_size
        _synthetic_shards(paths.channel("train"), tokens=4 * cfg.train.micro_batch_size * 1025, vocab=vocab)
        trainer = Trainer(cfg, paths, StopRequest())
        probe: _DiskProbe | None = None
        try:
            trainer._train_step()  # optimizer state exists only after the first step
            trainer.state.step = 1
            trainer.checkpoints.save(trainer.state, blocking=True)  # untimed: it sizes the probes
            size = sum(f.stat().st_size for f in (paths.checkpoints / step_dir(1)).iterdir())
            probe = _DiskProbe(paths.checkpoints, size)
            timings = _timed_saves_and_loads(trainer, probe, repeats)
            timings.resuming, timings.resume_reads = _timed_resumes(
                trainer, probe, settings, repeats if resumes is None else resumes
            )
        finally:
            try:
                if probe is not None:
                    method = probe.method
                    probe.close()
            finally:
                trainer.close()
    return {
        "model": cfg.model.name,
        **_checkpoint_row(size / 2**30, timings, async_save=cfg.checkpoint.async_save),
        "direct_io": method,
        "dir": str(parent or tempfile.gettempdir()),
        "torch": torch.__version__,
        "device": _device_name(torch),
    }


def _timed_saves_and_loads(trainer: Trainer, probe: _DiskProbe, repeats: int) -> _CheckpointTimings:
    """`repeats` pairs of saves (a blocking one, then one as the run's settings make it) and a cold load of the
    second, each settled first (`_settle`) and bracketed by the disk's direct write or read."""
    timings = _CheckpointTimings()
    for i in range(repeats):
        _settle(trainer.checkpoints)
        before = probe.write()
        trainer.state.step = 10 + 2 * i
        seconds, cpu = _timed(lambda: trainer.checkpoints.save(trainer.state, blocking=True))
        timings.blocking.append(seconds)
        timings.save_cpu.append(cpu)
        _settle(trainer.checkpoints)
        timings.writes.append((before, probe.write()))
        trainer.state.step = 11 + 2 * i
        timings.staging.append(_timed(lambda: trainer.checkpoints.save(trainer.state, blocking=False))[0])
        trainer.checkpoints.wait()
        _settle(trainer.checkpoints)  # a load would otherwise wait for the deletions
        _evict_newest(trainer)
        before = probe.read()
        seconds, cpu = _timed(lambda: trainer.checkpoints.load_latest(trainer.state))
        timings.loading.append(seconds)
        timings.load_cpu.append(cpu)
        _settle(trainer.checkpoints)
        timings.reads.append((before, probe.read()))
    return timings


def _checkpoint_row(gib: float, timings: _CheckpointTimings, *, async_save: bool) -> dict[str, Any]:
    """`bench_checkpoint`'s figures from its timings of a checkpoint of `gib` GiB."""
    t = timings
    return {
        "checkpoint_gib": round(gib, 3),
        "blocking_save_s": round(min(t.blocking), 3),
        "save_cpu_user_s": round(statistics.median(user for user, _ in t.save_cpu), 2),
        "save_cpu_sys_s": round(statistics.median(kernel for _, kernel in t.save_cpu), 2),
        **({"async_staging_s": round(min(t.staging), 3)} if async_save else {}),
        "cold_load_s": round(min(t.loading), 3),
        "load_cpu_user_s": round(statistics.median(user for user, _ in t.load_cpu), 2),
        "load_cpu_sys_s": round(statistics.median(kernel for _, kernel in t.load_cpu), 2),
        "save_gibps": round(gib / min(t.blocking), 2),
        "load_gibps": round(gib / min(t.loading), 2),
        "direct_write_gibps": [[round(rate, 2) for rate in probes] for probes in t.writes],
        "direct_read_gibps": [[round(rate, 2) for rate in probes] for probes in t.reads],
        **_ratios("save_over_direct_write", gib, t.blocking, t.writes),
        **_ratios("load_over_direct_read", gib, t.loading, t.reads),
        **(
            {
                "resume_load_s": round(min(t.resuming), 3),
                "resume_direct_read_gibps": [[round(rate, 2) for rate in probes] for probes in t.resume_reads],
                **_ratios("resume_load_over_direct_read", gib, t.resuming, t.resume_reads),
            }
            if t.resuming
            else {}
        ),
    }


def bench_weights(*, repeats: int, parent: Path | None) -> dict[str, Any]:
    """A cold load of a GPT-2-124M-sized model folder by the trainer's own code, against the disk's direct read."""
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    # The trainer's imports (torch._dynamo among them, which building a model on meta would import within the first
    # load) are done before any load is timed: a training process has them before it loads its weights.
    import training.trainer  # noqa: F401, PLC0415
    from training import hf_weights  # noqa: PLC0415
    from training.finetune import FineTuning  # noqa: PLC0415
    from training.models.gpt2 import GPT2  # noqa: PLC0415

    args = PRESETS["gpt2"].replace(vocab_size=50257)
    config = {"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12}
    with tempfile.TemporaryDirectory(dir=parent) as work:
        folder = Path(work) / "gpt2"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, "n_positions": 1024}))
        save_file(hf_weights.hf_state(GPT2(args).state_dict(), args, "F32"), str(folder / "model.safetensors"))
        weights = folder / "model.safetensors"
        size = weights.stat().st_size
        probe = _DiskProbe(Path(work), size)
        cfg = from_hyperparameters({"model.init_from": str(folder), "seq_len": "1024"})
        loads, probes, cpu, new_memory = [], [], [], []
        try:
            probe.write()
            for _ in range(repeats):
                evict(weights)
                new_memory.append(probe.read_into_new_memory())
                before = probe.read()

                def load() -> None:
                    finetune, model = FineTuning.build(cfg, Paths(folder), torch.device("cpu"))
                    finetune.materialize([model], torch.device("cpu"))

                seconds, used = _timed(load)
                loads.append(seconds)
                cpu.append(used)
                probes.append((before, probe.read()))
        finally:
            probe.close()
        gib = size / 2**30
        return {
            "benchmark": "weights",
            "model_gib": round(gib, 3),
            "load_s": [round(s, 3) for s in loads],
            "load_gibps": [round(gib / s, 2) for s in loads],
            # The CPU of each load (user, kernel): what a loaded machine's wall times hide.
            "load_cpu_s": [[round(user, 2), round(kernel, 2)] for user, kernel in cpu],
            "direct_read_gibps": [[round(rate, 2) for rate in pair] for pair in probes],
            **_ratios("load_over_direct_read", gib, loads, probes),
            "new_memory_read_gibps": [round(rate, 2) for rate in new_memory],
            # What a load cannot go below on this machine: its reads fault in (and zero) the memory they fill.
            **_ratios("load_over_new_memory_read", gib, loads, [(rate, rate) for rate in new_memory]),
            "direct_io": probe.method,
            "torch": torch.__version__,
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_FIRST_STEP = re.compile(r"\bstep=1 loss=")
STARTUP_JOB = {
    "model": "tiny",
    "max_steps": "2",
    "optim.warmup_steps": "1",
    "checkpoint.interval_steps": "0",
    "checkpoint.interval_minutes": "0",
    "eval.interval_steps": "0",
    "metrics.log_interval": "1",
}


def _startup_once(root: Path, hosts: tuple[str, ...], nproc: int, *, preflight: bool) -> tuple[float, str]:
    """Every host's `python -m training.launcher` started at once, as SageMaker starts the container's:
    (seconds until the first host logs its first step, that host's log)."""
    port = str(_free_port())
    started = time.perf_counter()
    procs = []
    for host in hosts:
        tree = Paths(root / host)
        tree.hyperparameters.parent.mkdir(parents=True, exist_ok=True)
        tree.hyperparameters.write_text(json.dumps({**STARTUP_JOB, "preflight": str(preflight).lower()}))
        tree.resource_config.write_text(
            json.dumps({"current_host": host, "hosts": list(hosts), "network_interface_name": "lo"})
        )
        for stale in (tree.output, tree.checkpoints, tree.model):  # each run starts afresh
            shutil.rmtree(stale, ignore_errors=True)
        if not tree.channel("train").is_dir():
            _synthetic_shards(tree.channel("train"), tokens=200_000, vocab=PRESETS["tiny"].vocab_size)
        env = {
            **os.environ,
            OPT_ML_ROOT_ENV: str(tree.root),
            MASTER_ADDR_ENV: "127.0.0.1",
            MASTER_PORT_ENV: port,
            NPROC_ENV: str(nproc),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, "-m", "training.launcher", "train"]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    first: float | None = None
    assert procs[0].stdout is not None
    lines = []
    for line in procs[0].stdout:
        lines.append(line)
        if first is None and _FIRST_STEP.search(line):
            first = time.perf_counter() - started
    logs = [proc.communicate(timeout=600)[0] for proc in procs[1:]]
    procs[0].wait(timeout=60)
    if first is None or any(proc.returncode for proc in procs):
        raise RuntimeError("the job failed:\n" + "\n".join(log[-2000:] for log in ["".join(lines), *logs]))
    return first, "".join(lines)


def bench_startup(*, hosts: int, nproc: int, repeats: int) -> dict[str, Any]:
    """Seconds from starting every host's launcher to the first training step, with the pre-flight check
    and without, alternating (median of `repeats` each), and the check's own time inside the workers."""
    import torch  # noqa: PLC0415

    names = tuple(f"algo-{i + 1}" for i in range(hosts))
    seconds: dict[bool, list[float]] = {True: [], False: []}
    inside = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for repeat in range(repeats):
            for preflight in (True, False) if repeat % 2 == 0 else (False, True):
                first, log = _startup_once(Path(tmp), names, nproc, preflight=preflight)
                seconds[preflight].append(first)
                inside += [float(m) for m in re.findall(r"pre-flight check passed in ([\d.]+) s", log)]
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    return {
        "check": "startup",
        "hosts": hosts,
        "procs_per_host": nproc,
        "first_step_s_preflight": round(on, 2),
        "first_step_s_no_preflight": round(off, 2),
        "ratio": round(on / off, 3),
        "preflight_in_workers_s": round(statistics.median(inside), 3) if inside else None,
        "repeats": repeats,
        "torch": torch.__version__,
        "device": _device_name(torch),
    }


def _straggler_rank(rank: int, spec: tuple[int, int, int, int, str]) -> None:
    """One rank of `bench_stragglers`: a matmul and an all-reduce per step (DDP's gradient sync keeps the
    ranks in step), the straggler check's calls timed on their own."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    world, port, steps, work, out = spec
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = new_group(backend="gloo")
    cfg = StragglerConfig()
    timer = StepTimer(torch, torch.device("cpu"), keep=cfg.interval_steps)
    detector = StragglerDetector([f"algo-{r + 1}" for r in range(world)], cfg.threshold, cfg.steps)
    matrix = torch.randn(work, work)
    timing = sharing = 0.0
    started = time.perf_counter()
    for step in range(1, steps + 1):
        before = time.perf_counter()
        timer.start()
        timing += time.perf_counter() - before
        matrix = torch.tanh(matrix @ matrix)
        dist.all_reduce(matrix[0], group=group)
        before = time.perf_counter()
        timer.stop()
        timer.end_step()
        timing += time.perf_counter() - before
        if step % cfg.interval_steps == 0:
            before = time.perf_counter()
            share_and_judge(torch, timer, detector, step=step, window=cfg.interval_steps, group=group)
            sharing += time.perf_counter() - before
    total = time.perf_counter() - started
    if rank == 0:
        Path(out).write_text(json.dumps({"timing_s": timing, "sharing_s": sharing, "total_s": total}))
    dist.destroy_process_group()


def bench_stragglers(*, world: int, steps: int, work: int) -> dict[str, Any]:
    """The straggler check's cost per step on rank 0 of `world` processes (gloo on this machine), against
    a step of one `work` x `work` matmul: its timer calls and, every interval, the all-gather and judgement."""
    import torch  # noqa: PLC0415
    import torch.multiprocessing as mp  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = str(Path(tmp) / "rank0.json")
        mp.spawn(_straggler_rank, args=((world, _free_port(), steps, work, out),), nprocs=world)  # type: ignore[attr-defined,no-untyped-call]
        measured = json.loads(Path(out).read_text())
    step_s = measured["total_s"] / steps
    check_s = (measured["timing_s"] + measured["sharing_s"]) / steps
    return {
        "check": "stragglers",
        "processes": world,
        "steps": steps,
        "step_ms": round(step_s * 1e3, 3),
        "timer_us_per_step": round(measured["timing_s"] / steps * 1e6, 1),
        "share_us_per_step": round(measured["sharing_s"] / steps * 1e6, 1),
        "check_us_per_step": round(check_s * 1e6, 1),
        "check_share": f"{100 * check_s / step_s:.3f}%",
        "interval_steps": StragglerConfig().interval_steps,
        "torch": torch.__version__,
        "device": _device_name(torch),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.bench", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="training throughput, MFU, memory")
    train.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter override")
    train.add_argument("--warmup", type=int, default=5)
    train.add_argument("--steps", type=int, default=20)
    train.add_argument("--tokens", type=int, default=20_000_000, help="synthetic tokens in the shards")
    loader = commands.add_parser("loader", help="data loader tokens/s on memory-mapped shards")
    loader.add_argument("--seq-len", type=int, default=1024)
    loader.add_argument("--batch", type=int, default=64)
    loader.add_argument("--tokens", type=int, default=200_000_000)
    loader.add_argument("--batches", type=int, default=2000)
    loader.add_argument("--world-size", type=int, default=8)
    checkpoint = commands.add_parser("checkpoint", help="checkpoint blocking time")
    checkpoint.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE")
    checkpoint.add_argument("--repeats", type=int, default=3)
    checkpoint.add_argument(
        "--resumes", type=int, default=None, help="resumes in a new process, each timed (default: --repeats; 0: none)"
    )
    checkpoint.add_argument(
        "--dir", type=Path, default=None, help="work in a temporary directory here (default: the system's temp dir)"
    )
    startup = commands.add_parser("startup", help="the launcher to the first step, with and without the pre-flight")
    startup.add_argument("--hosts", type=int, default=2, help="hosts, each its own launcher on this machine")
    startup.add_argument("--nproc", type=int, default=1, help="processes per host")
    startup.add_argument("--repeats", type=int, default=5, help="runs of each, alternating")
    stragglers = commands.add_parser("stragglers", help="the straggler check's cost per step")
    stragglers.add_argument("--processes", type=int, default=2)
    stragglers.add_argument("--steps", type=int, default=2000)
    stragglers.add_argument("--work", type=int, default=256, help="each step multiplies two N x N matrices")
    weights = commands.add_parser("weights", help="a model folder's cold weight load against the disk's direct read")
    weights.add_argument("--repeats", type=int, default=5)
    weights.add_argument("--dir", type=Path, default=None, help="work in a temporary directory here")
    peer = commands.add_parser("peer", help="ours against nanoGPT on tiny Shakespeare, alternating")
    peer.add_argument("--steps", type=int, default=2000)
    peer.add_argument("--lr", type=float, default=bench_peer.LR, help="both trainers' peak learning rate")
    peer.add_argument("--repeats", type=int, default=2, help="runs of each, alternating")
    peer.add_argument("--threads", type=int, default=1, help="threads of each process")
    peer.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="override one of ours")
    peer.add_argument(
        "--nanogpt", type=Path, default=bench_peer.NANOGPT_DIR, help="nanoGPT checkout (cloned if absent)"
    )
    peer.add_argument("--nanogpt-source", default=bench_peer.NANOGPT_SOURCE, help="where to clone nanoGPT from")
    peer.add_argument("--text", type=Path, default=bench_peer.TEXT, help="tiny Shakespeare, read in place")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    if args.command == "peer":
        row = bench_peer.bench_peer(
            steps=args.steps,
            lr=args.lr,
            repeats=args.repeats,
            threads=args.threads,
            overrides=parse_overrides(args.hp),
            nanogpt=args.nanogpt,
            source=args.nanogpt_source,
            text=args.text,
            port=_free_port(),
        )
    elif args.command == "weights":
        row = bench_weights(repeats=args.repeats, parent=args.dir)
    elif args.command == "stragglers":
        row = bench_stragglers(world=args.processes, steps=args.steps, work=args.work)
    elif args.command == "train":
        row = bench_train(parse_overrides(args.hp), warmup=args.warmup, steps=args.steps, tokens=args.tokens)
    elif args.command == "loader":
        row = bench_loader(
            seq_len=args.seq_len, batch=args.batch, tokens=args.tokens, batches=args.batches, world_size=args.world_size
        )
    elif args.command == "checkpoint":
        row = bench_checkpoint(parse_overrides(args.hp), repeats=args.repeats, resumes=args.resumes, parent=args.dir)
    else:
        row = bench_startup(hosts=args.hosts, nproc=args.nproc, repeats=args.repeats)
    print(_row(row))
    print(json.dumps(row), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

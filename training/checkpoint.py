"""Exact, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout (its names are training/layout.py's): ``<root>/step-<N>/`` holds DCP's files (``__<rank>_0.distcp``
shards and ``.metadata``) and, written last by rank 0 via temp file + rename + directory fsync,
``manifest.json``. A directory without a manifest is never loaded. The manifest lists every file with
its size, so a checkpoint that was truncated (a partial S3 sync, a kill mid-write) is detected and
skipped for the previous one.

A checkpoint holds the model and optimizer (resharded by DCP when the number of processes changes),
the LR schedule, the step, the data position and every rank's RNG state (restored only when the
number of processes is unchanged; the data position is world-size independent).

SageMaker uploads /opt/ml/checkpoints file by file, so old checkpoints are deleted only after a newer
one is committed, manifest first, so that a half-deleted checkpoint is never taken for a complete one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.lr_scheduler import LRScheduler

from training.config import CheckpointConfig
from training.data import DistributedTokenLoader
from training.distributed import DistEnv
from training.layout import MANIFEST, step_dir, step_of
from training.sagemaker_contract import describe

log = logging.getLogger(__name__)

DCP_METADATA = ".metadata"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a save that could not be committed."""


def committed_steps(root: Path) -> list[int]:
    """Steps that have a manifest, newest first (their files are verified separately)."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        step = step_of(entry.name)
        if step is not None and (entry / MANIFEST).is_file():
            steps.append(step)
    return sorted(steps, reverse=True)


def read_manifest(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    return data


def verify(directory: Path) -> str | None:
    """Why this checkpoint directory cannot be loaded, or None if its manifest and files are intact."""
    try:
        manifest = read_manifest(directory)
        files: dict[str, int] = manifest["files"]
        if manifest.get("format") != FORMAT_VERSION or not isinstance(files, dict) or not files:
            return f"{directory.name}: manifest has an unknown format"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{directory.name}: unreadable manifest ({describe(exc)})"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{directory.name}: {name} is missing"
        size = path.stat().st_size
        # DCP shard sizes come from its metadata (end of the last item): a longer file is still whole.
        if size < expected or (name == DCP_METADATA and size != expected):
            return f"{directory.name}: {name} is truncated ({size} bytes, expected {expected})"
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Commit a checkpoint: the manifest appears atomically and durably, after everything else."""
    tmp = directory / (MANIFEST + ".tmp")
    with tmp.open("w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / MANIFEST)
    _fsync_dir(directory)


def remove_checkpoint(directory: Path) -> None:
    """Delete the manifest first so that a partly deleted checkpoint reads as incomplete."""
    (directory / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def shard_sizes(metadata: Metadata) -> dict[str, int]:
    """Expected size of each DCP data file: the end of the last item DCP placed in it."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    return sizes


@dataclass
class TrainingState:
    """Everything a resume needs, as a DCP state dict (and back)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    loader: DistributedTokenLoader
    rank: int
    seed: int
    step: int = 0

    @property
    def tokens_consumed(self) -> int:
        return self.loader.consumed * self.loader.samples.seq_len

    def state_dict(self, *, with_rng: bool = True) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        progress = {
            "step": self.step,
            "tokens_consumed": self.tokens_consumed,
            "loader": self.loader.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "progress": json.dumps(progress)}
        if with_rng:
            # One key per rank: DCP deduplicates identical keys across ranks, these must all be kept.
            rng = {"cpu": torch.get_rng_state()}
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state()
            state["rng"] = {f"rank{self.rank}": rng}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        progress = json.loads(state["progress"])
        self.step = int(progress["step"])
        self.loader.load_state_dict(progress["loader"])
        self.scheduler.load_state_dict(progress["scheduler"])
        if "rng" in state:
            rng = state["rng"][f"rank{self.rank}"]
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng:
                torch.cuda.set_rng_state(rng["cuda"])
        else:
            # Another world size: rank r's old stream has no successor, so derive a fresh one.
            torch.manual_seed(self.seed + 1_000_003 * self.step + self.rank)


@dataclass
class _Pending:
    step: int
    future: Future[Any]
    world_size: int
    tokens_consumed: int
    started: float = field(default_factory=time.monotonic)


class CheckpointManager:
    """Saves (optionally in the background), commits, prunes and resumes checkpoints under ``root``."""

    def __init__(self, root: Path, env: DistEnv, cfg: CheckpointConfig) -> None:
        self.root, self.env, self.cfg = root, env, cfg
        self.committed: list[int] = []
        self.pending: _Pending | None = None
        self.last_save_time = time.monotonic()
        # Async saves run collectives from a background thread: they get their own group so they
        # never interleave with the main thread's collectives.
        self._async_group = dist.new_group(backend="gloo") if cfg.async_save else None
        if env.is_local_main:
            root.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- saving

    def save(self, state: TrainingState, *, blocking: bool = False) -> None:
        """Checkpoint ``state.step``; in async mode return once the state is staged (unless blocking)."""
        self.wait()
        step = state.step
        if step in self.committed:
            return
        directory = self.root / step_dir(step)
        if self.env.is_local_main and directory.exists():
            remove_checkpoint(directory)  # debris of an interrupted attempt at this same step
        dist.barrier(group=self.env.ctrl)
        started = time.monotonic()
        state_dict = state.state_dict()
        if self._async_group is not None and not blocking:
            response = dcp_async_save(state_dict, checkpoint_id=directory, process_group=self._async_group)
            # torch returns a Future, or (with some stagers) a response holding the upload's Future.
            future = response if isinstance(response, Future) else response.upload_completion
            self.pending = _Pending(step, future, self.env.world_size, state.tokens_consumed, started)
            log.info(
                "checkpoint %s: staged in %.2fs, writing in the background",
                step_dir(step),
                time.monotonic() - started,
            )
            return
        metadata = dcp_save(state_dict, checkpoint_id=directory, process_group=self.env.ctrl)
        self._commit(step, metadata, self.env.world_size, state.tokens_consumed, started)

    def pending_done(self) -> bool:
        """Whether this rank's background save (if any) has finished writing."""
        return self.pending is None or self.pending.future.done()

    def wait(self) -> None:
        """Finish and commit the background save, if any (collective)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        metadata = pending.future.result()
        self._commit(pending.step, metadata, pending.world_size, pending.tokens_consumed, pending.started)

    def _commit(self, step: int, metadata: Any, world_size: int, tokens: int, started: float) -> None:
        directory = self.root / step_dir(step)
        error: str | None = None
        if self.env.is_main:
            try:
                if not isinstance(metadata, Metadata):
                    raise CheckpointError(f"DCP returned {type(metadata).__name__}, not its Metadata")
                files = shard_sizes(metadata)
                files[DCP_METADATA] = (directory / DCP_METADATA).stat().st_size
                write_manifest(
                    directory,
                    {
                        "format": FORMAT_VERSION,
                        "step": step,
                        "world_size": world_size,
                        "tokens_consumed": tokens,
                        "files": files,
                        "torch_version": torch.__version__,
                        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    },
                )
            except Exception as exc:  # every rank must learn of the failure, not just rank 0
                error = describe(exc)
        outcome: list[str | None] = [error]
        dist.broadcast_object_list(outcome, src=0, group=self.env.ctrl)
        if outcome[0] is not None:
            raise CheckpointError(f"checkpoint {step_dir(step)} could not be committed: {outcome[0]}")
        self.committed.append(step)
        self.last_save_time = time.monotonic()
        log.info("checkpoint %s committed in %.2fs", step_dir(step), time.monotonic() - started)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; delete older ones and older debris."""
        keep = set(sorted(self.committed)[-self.cfg.keep_last :])
        newest = max(self.committed)
        self.committed = sorted(keep)
        # One process per host deletes: hosts do not share /opt/ml/checkpoints on SageMaker.
        if not self.env.is_local_main or not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            step = step_of(entry.name)
            # Never touch anything newer than the newest commit: it may be a save in progress.
            if step is not None and step < newest and step not in keep:
                remove_checkpoint(entry)
                log.info("removed old checkpoint %s", entry.name)

    # ---------------------------------------------------------------- loading

    def _agree(self, local: str | None) -> list[str]:
        gathered: list[str | None] = [None] * self.env.world_size
        dist.all_gather_object(gathered, local, group=self.env.ctrl)
        return [f"rank {rank}: {msg}" for rank, msg in enumerate(gathered) if msg is not None]

    def load_latest(self, state: TrainingState) -> int | None:
        """Restore the newest checkpoint that every rank can load; None when there is none to resume."""
        if not self.cfg.resume:
            return None
        listing: list[list[int]] = [committed_steps(self.root) if self.env.is_main else []]
        dist.broadcast_object_list(listing, src=0, group=self.env.ctrl)
        candidates = listing[0]
        problems: list[str] = []
        for step in candidates:
            directory = self.root / step_dir(step)
            errors = self._agree(verify(directory))
            if not errors:
                same_world = read_manifest(directory).get("world_size") == self.env.world_size
                template = state.state_dict(with_rng=same_world)
                try:
                    dcp_load(template, checkpoint_id=directory, process_group=self.env.ctrl)
                    error = None
                # DCP raises on every rank when any rank fails to read; its exception is a BaseException.
                except (Exception, CheckpointException) as exc:
                    # DCP wraps the cause; its last line says what was wrong with the files.
                    lines = str(exc).strip().splitlines()
                    error = f"{directory.name}: {lines[-1].strip() if lines else describe(exc)}"
                errors = self._agree(error)
            if errors:
                problems.extend(errors)
                if self.env.is_main:
                    log.warning("skipping checkpoint %s: %s", step_dir(step), "; ".join(errors))
                continue
            state.load_state_dict(template)
            if not same_world:
                log.warning(
                    "checkpoint %s was written by %d processes, resuming on %d: model and optimizer "
                    "resharded, data position kept, RNG streams reseeded",
                    step_dir(step),
                    read_manifest(directory)["world_size"],
                    self.env.world_size,
                )
            self.committed = sorted(s for s in candidates if s <= step)
            if self.env.is_main:
                for entry in sorted(self.root.iterdir()):
                    later = step_of(entry.name)
                    if later is not None and later > step and not (entry / MANIFEST).exists():
                        log.warning("ignoring incomplete checkpoint %s (no %s)", entry.name, MANIFEST)
            log.info("resumed from checkpoint %s (%d tokens consumed)", step_dir(step), state.tokens_consumed)
            return step
        if candidates:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoints in {self.root} can be loaded "
                f"({'; '.join(problems[:4])}); fix or delete them, or set checkpoint.resume=false"
            )
        return None

    def close(self) -> None:
        self.wait()

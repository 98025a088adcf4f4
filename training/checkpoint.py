"""Exact, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout (its names are training/layout.py's): ``<root>/step-<N>/`` holds DCP's files (``__<rank>_<i>.distcp``
shards and ``.metadata``) and, written last by rank 0 via temp file + rename + directory fsync,
``manifest.json``. A directory without a manifest is never loaded. The manifest lists every file with
its size and SHA-256, so a checkpoint that was truncated or changed (a partial S3 sync, a kill
mid-write, a file replaced in S3) is detected, before anything reads it, and skipped for the previous
one. Each process writes its share in several threads, one data file each, hashing every file as it
writes it. Loading never unpickles arbitrary objects: DCP's ``.metadata`` is read by an unpickler that knows
only DCP's metadata types, and the non-tensor items (optimizer settings, progress) with torch's
``weights_only`` loader, so a planted ``.metadata`` or item cannot run code.

A checkpoint holds the model and optimizer (resharded by DCP when the number of processes changes),
the LR schedule, the step, the data position and every rank's RNG state (restored only when the
number of processes is unchanged; the data position is world-size independent).

SageMaker uploads /opt/ml/checkpoints file by file, so old checkpoints are deleted only after a newer
one is committed, manifest first, so that a half-deleted checkpoint is never taken for a complete one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture
from torch.optim.lr_scheduler import LRScheduler

from training.config import CheckpointConfig
from training.data import DistributedTokenLoader
from training.distributed import DistEnv
from training.layout import MANIFEST, step_dir, step_of
from training.sagemaker_contract import describe
from training.stored_checkpoints import DCP_METADATA, FORMAT_VERSION, Manifest, ManifestError

log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 20
_MAX_IO_THREADS = 8
_WRITEBACK_CHUNK = 32 << 20


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


def read_manifest(directory: Path) -> Manifest:
    """The checkpoint's manifest, parsed by the one rule (training/stored_checkpoints.py); ManifestError if not."""
    return Manifest.parse((directory / MANIFEST).read_bytes())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(directory: Path, *, share: tuple[int, int] = (0, 1)) -> str | None:
    """Why this checkpoint directory cannot be loaded, or None if it is complete and every file is intact.

    Complete as training/stored_checkpoints.py defines it (every listed file present with its size),
    and every file's content as its SHA-256 in the manifest says. `share` (index, count): hash only
    every count-th data file from index (the processes of one host split the work); DCP's
    ``.metadata`` is hashed by every caller, as every process unpickles it.
    """
    try:
        manifest = read_manifest(directory)
    except OSError as exc:
        return f"{directory.name}: unreadable manifest ({describe(exc)})"
    except ManifestError as exc:
        return f"{directory.name}: {exc}"
    index, count = share
    data = sorted(name for name in manifest.files if name != DCP_METADATA)
    mine = {DCP_METADATA, *data[index::count]}
    for name in manifest.files:
        path = directory / name
        problem = manifest.size_problem(name, path.stat().st_size if path.is_file() else None)
        if problem is not None:
            return f"{directory.name}: {problem}"
    names = sorted(mine)
    with ThreadPoolExecutor(io_threads()) as pool:  # hashlib releases the GIL: one file per core
        digests = dict(zip(names, pool.map(lambda name: sha256_of(directory / name), names), strict=True))
    for name in names:
        if digests[name] != manifest.files[name][1]:
            return f"{directory.name}: {name} does not match the SHA-256 in its manifest"
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


def data_files(metadata: Metadata) -> list[str]:
    """The DCP data files a checkpoint's metadata refers to."""
    return sorted({info.relative_path for info in metadata.storage_data.values()})


def file_entries(
    directory: Path, names: list[str], hashed: dict[str, tuple[int, str]] | None = None
) -> dict[str, dict[str, Any]]:
    """The manifest's entries of those of `names` present in `directory`: size and SHA-256.

    `hashed`: (size, SHA-256) of files hashed as they were written; a file is read back only if it is
    not there or its size on disk differs."""
    hashed = hashed or {}
    entries = {}
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        known = hashed.get(name)
        entries[name] = {"size": size, "sha256": known[1] if known and known[0] == size else sha256_of(path)}
    return entries


def io_threads() -> int:
    """Threads (and data files) each process writes a checkpoint with, and hashes one with: this host's
    cores shared among its processes, from 2 (one serialises and hashes while another waits on the disk)
    to 8."""
    return max(2, min(_MAX_IO_THREADS, (os.cpu_count() or 1) // _local_world_size()))


class _HashingStream:
    """A file being written that hashes its bytes as they pass (DCP writes each file front to back)."""

    def __init__(self, file: io.BufferedWriter) -> None:
        self.file = file
        self.digest = hashlib.sha256()
        self.size = 0
        self.flushing = 0  # bytes before this offset have been handed to the kernel's writeback

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.file.write(view)
        self.digest.update(view)  # hashlib releases the GIL for large buffers
        self.size += len(view)
        if self.size - self.flushing >= _WRITEBACK_CHUNK and hasattr(os, "posix_fadvise"):
            # Start writing these pages to the disk now (Linux starts writeback for dirty pages it is
            # advised to drop), not all at the final fsync: the disk works while the threads serialise.
            os.posix_fadvise(self.file.fileno(), self.flushing, self.size - self.flushing, os.POSIX_FADV_DONTNEED)
            self.flushing = self.size
        return written

    def tell(self) -> int:
        return self.file.tell()

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        self.file.close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording the size and SHA-256 of every data file as it writes it, and
    every error met writing one (DCP's writer threads would otherwise swallow it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hashed: dict[str, tuple[int, str]] = {}
        self.errors: list[str] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        path = Path(path)
        if mode != "wb" or path.suffix != ".distcp":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        try:
            with path.open("wb") as file:
                hashing = _HashingStream(file)
                yield hashing
        except BaseException as exc:
            self.errors.append(f"{path.name}: {describe(exc)}")
            raise
        self.hashed[path.name] = (hashing.size, hashing.digest.hexdigest())


class _CheckedWriter(FileSystemWriter):
    """DCP's file writer, failing the save when a writer thread did not write all its items: with several
    threads, torch's writer returns the results of those that finished and drops a thread's error, and the
    checkpoint's metadata would then name only what was written."""

    fs: _HashingFileSystem

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        future = super().write_data(plan, planner)
        written = future.wait()
        if self.fs.errors or len(written) != len(plan.items):
            problem = "; ".join(self.fs.errors) or "a writer thread stopped"
            raise CheckpointError(f"wrote {len(written)} of the {len(plan.items)} items of this process: {problem}")
        return future


def _writer(directory: Path) -> tuple[_CheckedWriter, dict[str, tuple[int, str]]]:
    """DCP's file writer for one save, with `io_threads()` threads, each serialising, hashing and writing
    (and fsyncing) its own file, so that the CPU work of one overlaps the disk writes of another; and
    the (size, SHA-256) of each data file, filled in as the writer writes it."""
    fs = _HashingFileSystem()
    writer = _CheckedWriter(directory, thread_count=io_threads())
    writer.fs = fs
    return writer, fs.hashed


# What DCP's .metadata may name: its own metadata types, torch's dtypes, sizes and layouts, and paths.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "StorageMeta",
        "MetadataIndex",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata and refuses every other global (a planted one could run any code)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{DCP_METADATA} names {module}.{name}, which DCP metadata never holds")


class _SafeReader(FileSystemReader):
    """DCP's file-system reader, reading ``.metadata`` with `_MetadataUnpickler` instead of `pickle.load`,
    and the data files in parallel threads, one file each."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        read = super().read_data
        with ThreadPoolExecutor(io_threads()) as pool:  # reads and tensor copies release the GIL
            done = [pool.submit(read, replace(plan, items=items), planner) for items in per_file.values()]
            for future in done:
                future.result().wait()
        finished: TorchFuture[None] = TorchFuture()
        finished.set_result(None)
        return finished

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{DCP_METADATA} holds a {type(metadata).__name__}, not DCP's Metadata")
        storage_meta = metadata.storage_meta or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor items (optimizer settings, progress) with ``weights_only``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


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


def _local_world_size() -> int:
    """The processes on this host (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@dataclass
class _Pending:
    step: int
    future: Future[Any]
    world_size: int
    tokens_consumed: int
    hashed: dict[str, tuple[int, str]]
    started: float = field(default_factory=time.monotonic)


class CheckpointManager:
    """Saves (optionally in the background), commits, prunes and resumes checkpoints under ``root``."""

    def __init__(self, root: Path, env: DistEnv, cfg: CheckpointConfig, *, trusted: set[str] | None = None) -> None:
        """`trusted`: the manifest digests the run's ledger holds (training/ledger.py); only those checkpoints
        are loaded. None: no ledger (a run outside the pipeline), any intact checkpoint may be."""
        self.root, self.env, self.cfg, self.trusted = root, env, cfg, trusted
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
        writer, hashed = _writer(directory)
        if self._async_group is not None and not blocking:
            response = dcp_async_save(state_dict, storage_writer=writer, process_group=self._async_group)
            # torch returns a Future, or (with some stagers) a response holding the upload's Future.
            future = response if isinstance(response, Future) else response.upload_completion
            self.pending = _Pending(step, future, self.env.world_size, state.tokens_consumed, hashed, started)
            log.info(
                "checkpoint %s: staged in %.2fs, writing in the background",
                step_dir(step),
                time.monotonic() - started,
            )
            return
        metadata = dcp_save(state_dict, storage_writer=writer, process_group=self.env.ctrl)
        self._commit(
            step, metadata, world_size=self.env.world_size, tokens=state.tokens_consumed, hashed=hashed, started=started
        )

    def pending_done(self) -> bool:
        """Whether this rank's background save (if any) has finished writing."""
        return self.pending is None or self.pending.future.done()

    def wait(self) -> None:
        """Finish and commit the background save, if any (collective)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        metadata = pending.future.result()
        self._commit(
            pending.step,
            metadata,
            world_size=pending.world_size,
            tokens=pending.tokens_consumed,
            hashed=pending.hashed,
            started=pending.started,
        )

    def _commit(
        self,
        step: int,
        metadata: Any,
        *,
        world_size: int,
        tokens: int,
        hashed: dict[str, tuple[int, str]],
        started: float,
    ) -> None:
        directory = self.root / step_dir(step)
        error: str | None = None
        # Each process hashes the data files it wrote, as it wrote them (hosts do not share /opt/ml/checkpoints).
        own: dict[str, dict[str, Any]] | str
        try:
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"DCP returned {type(metadata).__name__}, not its Metadata")
            names = [n for n in data_files(metadata) if n.startswith(f"__{self.env.rank}_")]
            own = file_entries(directory, names + ([DCP_METADATA] if self.env.is_main else []), hashed)
        except Exception as exc:
            own = describe(exc)
        gathered: list[dict[str, dict[str, Any]] | str | None] = [None] * self.env.world_size
        dist.all_gather_object(gathered, own, group=self.env.ctrl)
        if self.env.is_main:
            try:
                files: dict[str, dict[str, Any]] = {}
                for rank, entries in enumerate(gathered):
                    if not isinstance(entries, dict):
                        raise CheckpointError(f"rank {rank} could not hash its files: {entries}")
                    files.update(entries)
                assert isinstance(metadata, Metadata)
                missing = sorted({*data_files(metadata), DCP_METADATA} - set(files))
                if missing:
                    raise CheckpointError(f"no process hashed {', '.join(missing)}")
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

    def _recorded(self, steps: list[int]) -> list[int]:
        """Those of `steps` whose manifest the run's ledger holds (all of them without a ledger)."""
        if self.trusted is None:
            return steps
        kept = []
        for step in steps:
            if sha256_of(self.root / step_dir(step) / MANIFEST) in self.trusted:
                kept.append(step)
            else:
                log.warning("skipping checkpoint %s: the run's ledger does not record it", step_dir(step))
        return kept

    def load_latest(self, state: TrainingState) -> int | None:
        """Restore the newest checkpoint that every rank can load; None when there is none to resume."""
        if not self.cfg.resume:
            return None
        listing: list[list[int]] = [self._recorded(committed_steps(self.root)) if self.env.is_main else []]
        dist.broadcast_object_list(listing, src=0, group=self.env.ctrl)
        candidates = listing[0]
        problems: list[str] = []
        for step in candidates:
            directory = self.root / step_dir(step)
            errors = self._agree(verify(directory, share=(self.env.local_rank, _local_world_size())))
            if not errors:
                same_world = read_manifest(directory).world_size == self.env.world_size
                template = state.state_dict(with_rng=same_world)
                try:
                    dcp_load(
                        template,
                        storage_reader=_SafeReader(directory),
                        planner=_WeightsOnlyPlanner(),
                        process_group=self.env.ctrl,
                    )
                    error = None
                # DCP raises on every rank when any rank fails to read; its exception is a BaseException.
                except (Exception, CheckpointException) as exc:
                    # DCP wraps the cause; its last line says what was wrong with the files, except for a
                    # refused weights_only load, whose reason is the line naming the global.
                    lines = [line.strip() for line in str(exc).strip().splitlines()]
                    refused = [line for line in lines if "Unsupported global" in line]
                    error = f"{directory.name}: {(refused or lines)[-1] if lines else describe(exc)}"
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
                    read_manifest(directory).world_size,
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

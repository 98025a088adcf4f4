"""Exact, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout (its names are contract/layout.py's): ``<root>/step-<N>/`` holds DCP's files (``__<rank>_<i>.distcp``
shards and ``.metadata``) and, written last by rank 0 via temp file + rename + directory fsync,
``manifest.json``. A directory without a manifest is never loaded. The manifest lists every file with
its size and the BLAKE3 digest of each of its segments (runs of whole items, from 16 MiB), so a checkpoint that was
truncated or changed (a partial S3 sync, a kill mid-write, a file replaced in S3) is detected and skipped for
the previous one. Each process writes its share in several threads, one data file each, hashing every
segment as it writes it. A load reads each file it needs once, front to back, a segment at a time into the
reader's own buffers (`direct_io.DirectReader`, which reads a few segments ahead), hashes each segment where
it was read and unpickles nothing from a window (a run of whole segments, one wherever no item straddles a
segment's end, as none of a save here does) until each of its segments matches; its tensors are then copied
from those bytes, so bytes changed after their check are never used, and a load holds a few segments of each
file in memory, not the file; a tensor is saved in pieces of at most 16 MiB (whole rows, one at least), so
that a segment is at most about 32 MiB where no row is larger. Loading never
unpickles arbitrary objects: DCP's ``.metadata`` is read by an unpickler that knows only DCP's metadata
types, a tensor item by one that knows only a plain tensor's (`tensor_archive`, which leaves any other to
torch's weights-only unpickler), and every other item with torch's weights-only unpickler, so a planted
``.metadata`` or item cannot run code.

A checkpoint holds the model and optimizer (resharded by DCP when the number of processes changes),
the LR schedule, the step, the data position and every rank's RNG state (restored only when the
number of processes is unchanged; the data position is world-size independent).

SageMaker uploads /opt/ml/checkpoints file by file, so old checkpoints are deleted only after a newer
one is committed, manifest first, so that a half-deleted checkpoint is never taken for a complete one.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib
import io
import json
import logging
import math
import os
import pickle
import shutil
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import torch
import torch.distributed as dist
from blake3 import blake3
from torch import nn
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import (
    DEFAULT_SUFFIX,
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future as TorchFuture
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.serialization import config as serialization_config

from contract.config import CheckpointConfig
from contract.layout import MANIFEST, step_dir, step_of
from contract.ledger import Recorded
from contract.stored_checkpoints import (
    DCP_METADATA,
    FORMAT_VERSION,
    SEGMENT_HASHES,
    Listed,
    Manifest,
    ManifestError,
    Segment,
    manifest_sha256,
)
from training import direct_io, tensor_archive
from training.data import DistributedTokenLoader
from training.distributed import DistEnv, new_group
from training.sagemaker_contract import describe
from training.tensor_archive import saved

log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 20
_MAX_IO_THREADS = 8
_MIN_SEGMENT = 16 << 20
"""A segment of a data file ends at the first item boundary after this many bytes, so a window of a file this
trainer wrote is at most about this plus its largest item (a load holds one window per file it is reading, and
the reader's buffers, in `io_threads()` threads; `.metadata`, and each file of a checkpoint saved before
segments, is one window), and the manifest lists at most one digest per this many bytes, or per item larger
than this."""
_MAX_ITEM = 16 << 20
"""A tensor of more bytes than this is saved as pieces of at most this many, runs of rows of its first dimension
(one row at least), each a DCP item of its own: a load holds a window of each file it reads, which is as large as
a segment and the item that ends it, so the largest item sets the memory a load maps (GPT-2's token embedding,
and each of its optimizer moments, is 154 MiB). A load takes the pieces as DCP takes any tensor saved in
chunks, whatever the world size that loads them."""
_SMALL_ITEM = 1 << 20
"""A tensor item of fewer bytes than this is saved in the first of its process's files, before that file's larger
items (`_files_for`). A load takes 0.1 ms or so of Python, with the GIL held, over each item whatever its size
(the disk's time for 0.15-0.3 MiB on the benchmark VM): GPT-2's 443 tensor items under this size, with its 27
non-tensor items, cost a load about 0.05 s. Saved last, as DCP's writer orders a file, they were loaded after
the disk had finished."""


class _Digest(Protocol):
    def update(self, data: Any, /) -> Any: ...
    def hexdigest(self) -> str: ...


_HASHES: dict[str, Any] = {"sha256": hashlib.sha256, "blake3": blake3}  # both release the GIL for large buffers
SAVED_HASH = SEGMENT_HASHES[FORMAT_VERSION]
"""The hash of the segments' digests in the manifests this trainer writes."""


def segment_digest(hashed_with: str = SAVED_HASH) -> _Digest:
    """A new digest of the hash `hashed_with` names (stored_checkpoints.SEGMENT_HASHES). A save hashes with BLAKE3:
    3.8-4.3 GiB/s per core on the benchmark VM, against SHA-256's 1.6-1.7 (docs/BENCHMARKS.md)."""
    return cast(_Digest, _HASHES[hashed_with]())


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a save that could not be committed."""


_OWN_ERROR = f"{CheckpointError.__module__}.{CheckpointError.__qualname__}: "  # how a traceback's last line names it


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


TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOMEM, errno.ETIMEDOUT, errno.ESTALE, errno.ECONNRESET}
)
"""OS errors a read of a checkpoint may get and not get again: a network file system's (FSx for Lustre's) server
failing over or timing out, memory or threads short for a moment. A load that gets only these tries the same
checkpoint again (`LOAD_RETRY_SECONDS`), where it would have gone on to an older one, or refused to start."""

LOAD_RETRY_SECONDS = (2.0, 10.0)
"""The waits before a checkpoint whose load failed with `TRANSIENT_ERRNOS` alone is loaded again: three tries."""


def transient(exc: BaseException) -> bool:
    """Whether `exc` may pass: an OS error of `TRANSIENT_ERRNOS`, or an error caused by one (its cause or context,
    where it has them: an exception DCP sent from another process has neither) and by no `CheckpointError`, since
    a file that does not match its manifest does not come to match it. DCP's `CheckpointException`, which holds
    one failure per failing rank, may pass only if each of them may."""
    if isinstance(exc, CheckpointException):
        failures = [failure for failure, _ in exc.failures.values()]
        return bool(failures) and all(map(transient, failures))
    found, pending, seen = False, [exc], set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, CheckpointError) or (isinstance(error, CheckpointException) and not transient(error)):
            return False
        found = (
            found
            or isinstance(error, CheckpointException)
            or (isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS)
        )
        pending.extend(cause for cause in (error.__cause__, error.__context__) if cause is not None)
    return found


@dataclass(frozen=True)
class _Problem:
    """Why a checkpoint cannot be loaded, and whether the error may pass (`transient`)."""

    text: str
    transient: bool = False


def manifest_of(directory: Path, trusted: Recorded | None = None) -> Manifest | str:
    """The checkpoint's manifest if the checkpoint is complete, else why it cannot be loaded.

    The manifest is read once: its digest is checked against `trusted` (the run's ledger, contract/ledger.py
    `Recorded.admits`; None: no ledger)
    and the same bytes are parsed, so a manifest replaced after the listing checked it is refused. Complete
    as contract/stored_checkpoints.py defines it: every listed file present with its size. The files'
    contents are checked against their segments' digests as they are read for the load (`_verified_windows`).
    """
    manifest = _manifest(directory, trusted)
    return manifest.text if isinstance(manifest, _Problem) else manifest


def _manifest(directory: Path, trusted: Recorded | None) -> Manifest | _Problem:
    try:
        data = (directory / MANIFEST).read_bytes()
    except OSError as exc:
        return _Problem(f"{directory.name}: unreadable manifest ({describe(exc)})", transient(exc))
    if trusted is not None and not trusted.admits(f"{directory.name}/", manifest_sha256(data)):
        return _Problem(
            f"{directory.name}: its manifest is not one the run's ledger records "
            "(it changed after it was listed, or could not be read then)"
        )
    try:
        manifest = Manifest.parse(data)
    except ManifestError as exc:
        return _Problem(f"{directory.name}: {exc}")
    for name in manifest.files:
        path = directory / name
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError as exc:
            return _Problem(f"{directory.name}: {name}: {describe(exc)}", transient(exc))
        problem = manifest.size_problem(name, size)
        if problem is not None:
            return _Problem(f"{directory.name}: {problem}")
    return manifest


def _buffer(size: int) -> torch.Tensor:
    """Memory for one window of a file a load reads."""
    return torch.empty(size, dtype=torch.uint8)


def _windows(segments: Sequence[Segment], spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """A file's windows: [start, end) of runs of whole segments, each ending at the first segment end that none
    of `spans` ((offset, length) of the items a load uses, inside the file) straddles, so that every item lies
    in one window."""
    windows: list[tuple[int, int]] = []
    pending = sorted(spans)
    start = end = reach = index = 0
    for length, _ in segments:
        end += length
        while index < len(pending) and pending[index][0] < end:  # the furthest end of the items begun before `end`
            offset, span = pending[index]
            reach = max(reach, offset + span)
            index += 1
        if reach <= end:
            windows.append((start, end))
            start = end
    return windows


def _opened(path: Path, listed: Listed) -> direct_io.DirectReader | direct_io.CachedReader:
    """The file `path`, opened to be read a segment at a time (`listed`: its size and segments)."""
    return direct_io.open_to_read(path, [length for length, _ in listed[1]])


def _verified_windows(
    path: Path,
    listed: Listed,
    windows: Sequence[tuple[int, int]],
    hashed_with: str,
    opened: direct_io.DirectReader | direct_io.CachedReader | None = None,
) -> Generator[tuple[int, torch.Tensor]]:
    """(start, bytes) of each of the file's `windows` in turn, runs of whole segments, each segment read once into
    memory (with O_DIRECT where the file system allows: `direct_io.open_to_read`) and each window yielded only
    when each of its segments matched its digest in `listed` (the file's size and segments), made with the hash
    `hashed_with` names; CheckpointError at the first that does not, or when the file is not the `size` bytes
    listed. What is used is these bytes: they are not read again, so they cannot change between their check and
    their use. A window of one segment is the memory the segment was read into; one of several, a copy of them in
    one buffer. Use a window's bytes before taking the next, which may reuse its memory. `opened`: the file,
    opened by `_opened` and not yet read from; closed here."""
    size, segments = listed
    remaining, joined = iter(segments), None
    with opened or _opened(path, listed) as file:
        for start, end in windows:
            window, position = None, start
            while position < end:
                length, expected = next(remaining)
                data = file.next_span()
                if len(data) != length:
                    raise CheckpointError(f"{path.name} is no longer the {size} bytes its manifest lists")
                digest = segment_digest(hashed_with)
                digest.update(data)
                if digest.hexdigest() != expected:
                    where = f"bytes {position}-{position + length}"
                    raise CheckpointError(
                        f"{path.name} does not match the {hashed_with} digest its manifest lists for {where}"
                    )
                if length == end - start:
                    window = torch.frombuffer(data, dtype=torch.uint8)
                else:  # a window of several segments: they are copied into one buffer, the next reusing its memory
                    if joined is None or len(joined) < end - start:
                        joined = _buffer(end - start)
                    joined[position - start : position - start + length] = torch.frombuffer(data, dtype=torch.uint8)
                    window = joined[: end - start]
                position += length
            assert window is not None
            yield start, window
        if file.beyond():
            raise CheckpointError(f"{path.name} is no longer the {size} bytes its manifest lists")


def _read_verified(path: Path, listed: Listed, hashed_with: str) -> torch.Tensor:
    """The whole file's bytes, checked as `_verified_windows` checks them, in memory of their own."""
    size = listed[0]
    whole = torch.empty(0, dtype=torch.uint8)  # an empty file has no window
    for _, data in _verified_windows(path, listed, [(0, size)] if size else [], hashed_with):
        whole = data.clone()
    return whole


def verify(directory: Path) -> str | None:
    """Why this checkpoint cannot be loaded, or None if it is complete and every segment of every file matches
    its digest: the checks a load makes of the files it reads, made of every file (without a ledger)."""
    manifest = manifest_of(directory)
    if isinstance(manifest, str):
        return manifest
    for name, listed in sorted(manifest.files.items()):
        try:
            for _ in _verified_windows(directory / name, listed, _windows(listed[1], []), manifest.hashed_with):
                pass
        except CheckpointError as exc:
            return f"{directory.name}: {exc}"
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


def _remove_old(directory: Path) -> None:
    try:
        remove_checkpoint(directory)
        if directory.exists():
            left = sorted(path.name for path in directory.iterdir())
            raise OSError(f"{', '.join(left[:4]) or 'the directory'} could not be deleted")
    except OSError as exc:  # the checkpoint is committed and newer ones are kept: log it, and train on
        log.warning("could not remove old checkpoint %s: %s", directory.name, describe(exc))
    else:
        log.info("removed old checkpoint %s", directory.name)


def data_files(metadata: Metadata) -> list[str]:
    """The DCP data files a checkpoint's metadata refers to."""
    return sorted({info.relative_path for info in metadata.storage_data.values()})


def segments_of(path: Path) -> tuple[Segment, ...]:
    """A file's segments, read back from the disk: every `_MIN_SEGMENT` bytes (its items are not known here)."""
    segments = []
    with path.open("rb") as stream:
        while chunk := stream.read(_MIN_SEGMENT):
            digest = segment_digest()
            digest.update(chunk)
            segments.append((len(chunk), digest.hexdigest()))
    return tuple(segments)


def file_entries(
    directory: Path, names: list[str], hashed: dict[str, Listed] | None = None
) -> dict[str, dict[str, Any]]:
    """The manifest's entries of those of `names` present in `directory`: size and segments.

    `hashed`: (size, segments) of files hashed as they were written; a file is read back only if it is
    not there or its size on disk differs."""
    hashed = hashed or {}
    entries = {}
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        known = hashed.get(name)
        segments = known[1] if known and known[0] == size else segments_of(path)
        entries[name] = {"size": size, "segments": [list(segment) for segment in segments]}
    return entries


def written_by(rank: int) -> str:
    """How the names of the data files the process of `rank` writes begin (DCP's file writer names them
    ``__<rank>_<i>.distcp``)."""
    return f"__{rank}_"


def io_threads() -> int:
    """Threads (and data files) each process writes a checkpoint with, and hashes one with: this host's
    cores shared among its processes, from 2 (one serialises and hashes while another waits on the disk)
    to 8."""
    return max(2, min(_MAX_IO_THREADS, (os.cpu_count() or 1) // _local_world_size()))


class _HashingStream:
    """A file being written that hashes its bytes in segments as they pass. `_CheckedWriter` writes each file
    front to back and asks the stream's position before and after each item; a segment ends at such a boundary
    once it holds `_MIN_SEGMENT` bytes, so that segments are runs of whole items."""

    def __init__(self, file: direct_io.DirectFile | direct_io.BufferedFile) -> None:
        self.file = file
        self.segments: list[Segment] = []
        self.digest = segment_digest()  # of the bytes since `started`
        self.started = 0
        self.failure: BaseException | None = None  # the file's own error, which torch.save reports as another

    @property
    def size(self) -> int:
        return self.file.size

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _HASH_CHUNK):
            # Each chunk is hashed, then written while it is still in the CPU's cache.
            chunk = view[start : start + _HASH_CHUNK]
            self.digest.update(chunk)
            try:
                self.file.write(chunk)
            except BaseException as exc:
                self.failure = exc
                raise
        return len(view)

    def tell(self) -> int:
        if self.size - self.started >= _MIN_SEGMENT:
            self.end_segment()
        return self.file.tell()

    def end_segment(self) -> tuple[Segment, ...]:
        """The segments written so far, the last one ended here."""
        if self.size > self.started:
            self.segments.append((self.size - self.started, self.digest.hexdigest()))
            self.digest, self.started = segment_digest(), self.size
        return tuple(self.segments)

    def flush(self) -> None:
        """Nothing: the file's `close` writes what is left (a file written with O_DIRECT writes whole blocks only)."""


class _HashingFileSystem(FileSystem):
    """DCP's local file system, writing every data file with O_DIRECT where the file system allows (see
    `training.direct_io`), and recording the size and segments of each as it writes it, and every error met
    writing one, by file."""

    def __init__(self) -> None:
        super().__init__()
        self.hashed: dict[str, Listed] = {}
        self.errors: list[str] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        path = Path(path)
        if mode != "wb" or path.suffix != ".distcp":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        file, hashing = None, None
        try:
            # Each item is a torch.save archive, whose zip records carry a CRC-32 that torch computes on one core
            # (about 0.4 s per GiB on the benchmark VM) and that no load here reads: a load checks each segment's
            # digest before it uses a byte. torch's settings are the calling thread's own, and each file is
            # written in the thread that opens it here (`_CheckedWriter._write_file`). (torch adds `patch` to its
            # config modules at import, where mypy cannot see it.)
            with cast(Any, serialization_config).patch({"save.compute_crc32": False}):
                file = direct_io.create(path)
                hashing = _HashingStream(file)
                yield hashing
            file.close()  # writes what is left, and fsyncs
        except BaseException as exc:
            if file is not None:
                file.abandon()
            # The disk's error (ENOSPC, say), where torch.save met it and raised its own ("unexpected pos ...").
            cause = hashing.failure if hashing is not None and hashing.failure is not None else exc
            self.errors.append(f"{path.name}: {describe(cause)}")
            if cause is not exc:
                raise cause from exc
            raise
        assert hashing is not None
        self.hashed[path.name] = (hashing.size, hashing.end_segment())


class _CheckedWriter(FileSystemWriter):
    """DCP's file writer, writing the files itself: one file per thread, each file's items shared out and ordered
    by `_files_for` rather than by DCP's own split, each tensor written by `tensor_archive.write` (what
    ``torch.save`` writes, faster), and the save failed with every file's error (torch's own threaded writer drops
    a helper thread's error, and the checkpoint's metadata would then name only what was written)."""

    fs: _HashingFileSystem

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        prefix = cast(Any, plan.storage_data).prefix
        files = _files_for(plan.items, self.thread_count)
        with ThreadPoolExecutor(len(files), thread_name_prefix="checkpoint-write") as pool:
            writing = [
                pool.submit(self._write_file, f"{prefix}{index}{DEFAULT_SUFFIX}", items, planner)
                for index, items in enumerate(files)
            ]
        written = [result for future in writing if future.exception() is None for result in future.result()]
        failures = [error for future in writing if (error := future.exception()) is not None]
        if failures or len(written) != len(plan.items):
            problem = "; ".join(self.fs.errors or map(describe, failures)) or "an item was given no file"
            raise CheckpointError(
                f"wrote {len(written)} of the {len(plan.items)} items of this process: {problem}"
            ) from next(iter(failures), None)
        future: TorchFuture[list[WriteResult]] = TorchFuture()
        future.set_result(written)
        return future

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        """Write `items` in order to the file `name` (as DCP's writer writes an item: a non-tensor's pickled
        bytes, a tensor's ``torch.save`` archive); where each lies in it."""
        written = []
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "wb") as stream:
            for item in items:
                offset = stream.tell()
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    stream.write(cast(io.BytesIO, data).getbuffer())
                else:
                    tensor = cast(torch.Tensor, data).detach().cpu()
                    if tensor.untyped_storage().nbytes() != tensor.nbytes:
                        tensor = tensor.clone()  # torch.save writes a tensor's whole storage
                    tensor_archive.write(tensor, stream)
                length = stream.tell() - offset
                written.append(
                    WriteResult(index=item.index, size_in_bytes=length, storage_data=_StorageInfo(name, offset, length))
                )
        return written


class _PieceSavePlanner(DefaultSavePlanner):
    """DCP's save planner, saving each tensor larger than `_MAX_ITEM` bytes as pieces of at most that many."""

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        self._pieces: dict[MetadataIndex, tuple[MetadataIndex, int, int]] = {}
        """A piece's index: its tensor's own item's index, and the piece's first row and rows in that item."""
        self.plan = dataclasses.replace(plan, items=[piece for item in plan.items for piece in self._split(item)])
        return self.plan

    def _split(self, item: WriteItem) -> list[WriteItem]:
        data = item.tensor_data
        if data is None or not data.chunk.sizes:
            return [item]
        rows, *row = data.chunk.sizes
        row_bytes = math.prod(row) * data.properties.dtype.itemsize
        if rows * row_bytes <= _MAX_ITEM:
            return [item]
        step = max(1, _MAX_ITEM // row_bytes)
        pieces = []
        for first in range(0, rows, step):
            count = min(step, rows - first)
            offsets = torch.Size((data.chunk.offsets[0] + first, *data.chunk.offsets[1:]))
            chunk = ChunkStorageMetadata(offsets=offsets, sizes=torch.Size((count, *row)))
            piece = WriteItem(
                index=MetadataIndex(item.index.fqn, offsets),
                type=WriteItemType.SHARD,  # DCP takes several items of one tensor only as shards
                tensor_data=TensorWriteData(chunk=chunk, properties=data.properties, size=data.size),
            )
            self._pieces[piece.index] = (item.index, first, count)
            pieces.append(piece)
        return pieces

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        if len(all_plans) == 1:
            return all_plans  # one process's items, which no other shares
        whole = {item.index: item for plan in all_plans for item in plan.items}
        deduped = super()._dedup_save_plans([_sized_by_chunk(plan) for plan in all_plans])
        return [dataclasses.replace(plan, items=[whole[item.index] for item in plan.items]) for plan in deduped]

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        piece = self._pieces.get(write_item.index)
        if piece is None:
            return super().resolve_data(write_item)
        whole, first, count = piece
        return _rows(self.lookup_object(whole), first, count)


def _rows(tensor: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """`count` rows of `tensor`'s first dimension from `first`. Of a contiguous tensor in CPU memory, a tensor
    whose storage is exactly those rows' bytes, not a copy: DCP's writer copies a tensor whose storage holds more
    than the tensor (``torch.save`` would write all of it), and these are most of a checkpoint's bytes."""
    rows = tensor.narrow(0, first, count)
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return rows  # DCP's writer copies it to the CPU, or into a storage of its own
    start = rows.storage_offset() * rows.element_size()
    storage = cast(torch.UntypedStorage, tensor.untyped_storage()[start : start + rows.nbytes])  # a view of it
    return torch.empty(0, dtype=tensor.dtype, device="cpu").set_(storage, 0, rows.size(), rows.stride())


def _sized_by_chunk(plan: SavePlan) -> SavePlan:
    """`plan` with each tensor item sized as its own chunk. DCP's dedup spreads the items every rank holds over
    the ranks by `tensor_data.size`, which is the whole tensor's size for a shard or a piece: each 16 MiB piece of
    a 154 MiB tensor would count 154 MiB, and the ranks that got one piece fewer would get all the rest. Only for
    that: the checkpoint's metadata takes the whole tensor's size from the same field. (A process's items are
    shared among its files by their own bytes: `_files_for`.)"""
    items = [
        item
        if item.tensor_data is None
        else dataclasses.replace(
            item, tensor_data=dataclasses.replace(item.tensor_data, size=item.tensor_data.chunk.sizes)
        )
        for item in plan.items
    ]
    return dataclasses.replace(plan, items=items)


def _item_bytes(item: WriteItem) -> int:
    data = cast(TensorWriteData, item.tensor_data)
    return math.prod(data.chunk.sizes) * data.properties.dtype.itemsize


def _files_for(items: Sequence[WriteItem], count: int) -> list[list[WriteItem]]:
    """`items` shared among `count` files, each file's in the order it is written. As DCP's writer shares them:
    non-tensor items (written first in any file) one to each file in turn, and each tensor, largest first, to
    the file with the fewest bytes so far; except that the tensor items under `_SMALL_ITEM` bytes go first, from
    the smallest up, to the first file, ahead of its larger items, as many as fit in an even share of the bytes.
    A load reads each file front to back, one thread a file: the thread loading the small items does so while
    the disk reads on, and the last bytes read are large items, which load faster than the disk reads them."""
    files: list[list[WriteItem]] = [[] for _ in range(count)]
    for index, item in enumerate(item for item in items if item.type == WriteItemType.BYTE_IO):
        files[index % count].append(item)
    tensors = [(_item_bytes(item), item) for item in items if item.type != WriteItemType.BYTE_IO]
    tensors.sort(key=lambda sized: sized[0], reverse=True)
    share, sizes = sum(size for size, _ in tensors) / count, [0] * count
    while tensors and tensors[-1][0] < _SMALL_ITEM and sizes[0] + tensors[-1][0] <= share:
        size, item = tensors.pop()
        files[0].append(item)
        sizes[0] += size
    for size, item in tensors:
        lightest = min(range(count), key=sizes.__getitem__)
        files[lightest].append(item)
        sizes[lightest] += size
    return files


def _writer(directory: Path) -> tuple[_CheckedWriter, dict[str, Listed]]:
    """DCP's file writer for one save, with `io_threads()` threads, each serialising, hashing and writing
    (and fsyncing) its own file, so that the CPU work of one overlaps the disk writes of another; and
    the (size, segments) of each data file, filled in as the writer writes it."""
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


_BUILT_TYPES = frozenset(
    kind
    for module, names in _METADATA_GLOBALS.items()
    for name in names
    if isinstance(kind := getattr(importlib.import_module(module), name), type) and dataclasses.is_dataclass(kind)
)
"""The metadata types whose instances .metadata sets the attributes of (pickle's BUILD): DCP's dataclasses."""


class _MetadataUnpickler(pickle._Unpickler):
    """Unpickles DCP's metadata. It refuses every other global, since a planted one could run any code. It sets
    saved attributes (BUILD) only on instances of `_BUILT_TYPES`, which the pickle made itself. A planted BUILD on
    a class, function or enum member that a global names would change it for the whole process: say,
    ``Metadata.__setstate__``, which every later load's metadata calls, so that no older checkpoint could load
    either. This is Python's own unpickler: its opcodes can be checked one at a time, and the C one's cannot. It
    took 0.02-0.035 s for a GPT-2 checkpoint's 150 KB of metadata, against 0.016-0.017 s in C; a load unpickles
    it while its data files' first reads run (docs/BENCHMARKS.md)."""

    dispatch: ClassVar[dict[int, Callable[..., None]]] = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{DCP_METADATA} names {module}.{name}, which DCP metadata never holds")

    def load_build(self) -> None:
        stack: list[Any] = cast(Any, self).stack
        target = stack[-2] if len(stack) >= 2 else None  # BUILD's state is on top, its object below
        if type(target) not in _BUILT_TYPES:
            found = target.__qualname__ if isinstance(target, type) else f"a {type(target).__qualname__}"
            raise pickle.UnpicklingError(f"{DCP_METADATA} sets attributes of {found}, which DCP metadata never does")
        cast(Any, super()).load_build()  # typeshed lists none of the opcodes' methods

    dispatch[pickle.BUILD[0]] = load_build


class _SafeReader(FileSystemReader):
    """DCP's file-system reader, loading only bytes that match the manifest: ``.metadata`` read by
    `_MetadataUnpickler` instead of `pickle.load`, and each data file this process needs read once, in
    parallel threads, a window at a time, checked against its segments' digests (`_verified_windows`), the
    window's tensors taken from those bytes without a copy (`tensor_archive.saved`) and copied into the
    state dict before the next window is taken. The state dict's tensors are the model's and the optimizer's
    own, so should a later window fail its check, these hold checked bytes of this checkpoint in part:
    `load_latest` then loads an older checkpoint over every one of them (DCP refuses a checkpoint that lacks
    one), or refuses to start. Once a file is refused, no thread loads another window of the checkpoint.

    `read_ahead` starts reading files before DCP plans the load. `close` closes those that no read took."""

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        super().__init__(directory)
        self.directory, self.manifest = directory, manifest
        self.refused = threading.Event()
        self._metadata: Metadata | None = None
        self._opened: dict[str, direct_io.DirectReader | direct_io.CachedReader] = {}

    def read_ahead(self, names: Sequence[str]) -> None:
        """Read and check ``.metadata``'s bytes, open the files `names` to read (`direct_io.open_to_read`), which
        reads their first chunks, then unpickle the metadata while those reads run and DCP plans the load; a
        file's bytes are checked as it is read for the load, as any file's are. Should the metadata be refused,
        `close` closes the files."""
        data = self._metadata_bytes()
        for name in names:
            with suppress(OSError):  # the load opens it again, and fails where DCP reports why
                self._opened[name] = _opened(self.directory / name, self._listed(name))
        self._metadata = self._unpickled(data)

    def close(self) -> None:
        while self._opened:
            self._opened.popitem()[1].close()

    def _listed(self, name: str) -> Listed:
        if name not in self.manifest.files:
            raise CheckpointError(f"{DCP_METADATA} refers to {name}, which the manifest does not list")
        return self.manifest.files[name]

    def _read_file(self, name: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        listed = self._listed(name)
        size, segments = listed
        placed = sorted(((self.storage_data[item.storage_index], item) for item in items), key=lambda p: p[0].offset)
        for info, item in placed:
            if info.transform_descriptors:
                raise CheckpointError(f"{name} holds items written with storage transforms, which no save here writes")
            if info.offset < 0 or info.length < 0 or info.offset + info.length > size:
                raise CheckpointError(f"{name}: {item.storage_index.fqn} lies outside the file's {size} bytes")
        windows = _windows(segments, [(info.offset, info.length) for info, _ in placed])
        index, opened = 0, self._opened.pop(name, None)
        try:
            verified = _verified_windows(self.directory / name, listed, windows, self.manifest.hashed_with, opened)
            with closing(verified):
                for start, data in verified:  # every item lies in one window; the items are in file order
                    if self.refused.is_set():
                        return
                    end = start + data.numel()
                    while index < len(placed) and placed[index][0].offset + placed[index][0].length <= end:
                        info, item = placed[index]
                        self._load_item(
                            item, planner, name=name, data=data, offset=info.offset - start, length=info.length
                        )
                        index += 1
        finally:
            if opened is not None:
                opened.close()  # a generator closed before its first window has not closed it
        if index != len(placed):
            info, item = placed[index]
            raise CheckpointError(f"{name}: {item.storage_index.fqn} lies in no segment of the file")

    @staticmethod
    def _load_item(
        item: ReadItem, planner: LoadPlanner, *, name: str, data: torch.Tensor, offset: int, length: int
    ) -> None:
        """Load one item from the checked bytes `data[offset : offset + length]`."""
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data[offset : offset + length].numpy().tobytes()))
            return
        loaded = saved(data, offset, length)
        if not isinstance(loaded, torch.Tensor):
            raise CheckpointError(f"{name}: {item.storage_index.fqn} holds a {type(loaded).__name__}, not a tensor")
        tensor = narrow_tensor_by_index(loaded, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            found, expected = tuple(tensor.size()), tuple(target.size())
            raise CheckpointError(f"{name}: {item.storage_index.fqn} is {found}, expected {expected}")
        target.copy_(tensor)
        planner.commit_tensor(item, target)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        files = sorted(per_file.items(), key=lambda file: file[0] not in self._opened)  # those being read first
        with ThreadPoolExecutor(io_threads()) as pool:  # reads, hashing and tensor copies release the GIL
            done = [pool.submit(self._read_file, name, items, planner) for name, items in files]
            try:
                for future in as_completed(done):  # the first to fail raises as it ends
                    future.result()
            except BaseException as first:
                self.refused.set()  # the checkpoint is refused: no thread loads another window of it
                pool.shutdown(cancel_futures=True)  # and those still loading one end
                # A file found not to match its manifest is the reason, even where another thread's read error
                # ended first: that error may pass, and would have the same bytes read again.
                failed = [f.exception() for f in done if f.done() and not f.cancelled()]
                lasting = [error for error in failed if isinstance(error, Exception) and not transient(error)]
                if isinstance(first, Exception) and transient(first) and lasting:
                    raise lasting[0] from None
                raise
        finished: TorchFuture[None] = TorchFuture()
        finished.set_result(None)
        return finished

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP asks for a rank's own metadata when the global one failed
            raise CheckpointError(f"saves here write one {DCP_METADATA} and no rank's own")
        metadata = self._metadata or self._checked_metadata()
        storage_meta = metadata.storage_meta or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata

    def _checked_metadata(self) -> Metadata:
        return self._unpickled(self._metadata_bytes())

    def _metadata_bytes(self) -> bytes:
        data = _read_verified(self.directory / DCP_METADATA, self._listed(DCP_METADATA), self.manifest.hashed_with)
        return data.numpy().tobytes()

    @staticmethod
    def _unpickled(data: bytes) -> Metadata:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{DCP_METADATA} holds a {type(metadata).__name__}, not DCP's Metadata")
        return metadata


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor items (optimizer settings, progress) with ``weights_only``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _same_memory(value: Any) -> tuple[Any, ...] | None:
    """What makes two tensors the very same one (the same storage, seen the same way), an empty one too (a rank's
    empty shard of a tied weight); None for what is not a tensor. A DTensor is its local shard."""
    local = value.to_local() if isinstance(value, DTensor) else value
    if not isinstance(local, torch.Tensor):
        return None
    storage = local.untyped_storage()._cdata  # the storage itself, which each view of it shares
    return (storage, local.storage_offset(), tuple(local.shape), local.stride(), local.dtype)


def _untied(model_sd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`model_sd` with each tensor once, and the key of each entry left out mapped to the earlier one it is the
    same tensor as: a tied weight (GPT-2's head is its token embedding, 9% of its checkpoint's bytes) is saved and
    loaded once."""
    kept: dict[str, Any] = {}
    tied: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for key, value in model_sd.items():
        memory = _same_memory(value)
        if memory is not None and memory in first:
            tied[key] = first[memory]
            continue
        kept[key] = value
        if memory is not None:
            first[memory] = key
    return kept, tied


def _unfilled_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Give an optimizer that has no state yet its state's tensors uninitialised, for a load to fill; whether it
    did. Else DCP's `get_state_dict` makes them with a step on zero gradients, which writes every byte of them and
    of the gradients (GPT-2 124M: 1.4 GiB of new memory) before the load overwrites them all; left unwritten, the
    load's copies touch that memory first, while the disk reads. Should the load fail, `load_latest` loads an older
    checkpoint over them, or refuses to start.

    The layout is the optimizer's own: a twin of the same type and options takes one step on two tensors per
    parameter, of its dtype, device and rank, one of size 1 along every dimension and one of sizes 2, 3, 4, ...
    A state tensor of each twin's shape is shaped like the parameter (`torch.empty_like`, in the state's dtype);
    one of the same shape in both is a copy of the first twin's; so is a value that is not a tensor. An optimizer
    whose state is otherwise, that has gradients already (DCP takes it to have no state), whose parameters need no
    gradient, that is not one of torch.optim's (whose steps are the process's own: no collective), or whose twin
    cannot step is left to DCP. The twin has none of the optimizer's own hooks; torch's global step hooks run for
    it, as they do for DCP's step."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if (
        optimizer.state
        or not _of_torch_optim(type(optimizer))
        or not params
        or any(p.grad is not None or (isinstance(p, DTensor) and not p.dim()) for p in params)
    ):
        return False  # a DTensor of no dimension: its state would be DTensors, the twins' plain tensors
    pairs = {p: _twins(p) for p in params}
    groups = [
        {**group, "params": [t for p in group["params"] if p.requires_grad for t in pairs[p]]}
        for group in optimizer.param_groups
    ]
    shadow = type(optimizer).__new__(type(optimizer))
    shadow.__setstate__({"defaults": dict(optimizer.defaults), "state": defaultdict(dict), "param_groups": groups})
    shadow._warned_capturable_if_run_uncaptured = True  # as `Optimizer.__init__` sets it: no warning per resume
    try:
        shadow.step()
    except Exception:  # one that cannot step on tensors this small: DCP's step is on the real ones
        return False
    made: dict[torch.Tensor, dict[str, Any]] = {}
    for p, (one, two) in pairs.items():
        entries, of_two = shadow.state[one], shadow.state[two]
        if entries.keys() != of_two.keys():
            return False
        made[p] = {key: _unfilled_entry(p, value, of_two[key], one, two) for key, value in entries.items()}
        if any(value is None for value in made[p].values()):
            return False
    optimizer.state.update((p, entries) for p, entries in made.items() if entries)
    return bool(optimizer.state)


def _of_torch_optim(kind: type) -> bool:
    """Whether `kind` is one of torch.optim's optimizers (defined in torch.optim or a module of it)."""
    return kind.__module__ == "torch.optim" or kind.__module__.startswith("torch.optim.")


def _twins(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros of `p`'s dtype, device and rank, of size 1 along every dimension and of sizes 2, 3, 4, ..., with zero
    gradients: a state of the second's shape grows with each dimension of the parameter, not with another one's."""
    shapes = ((1,) * p.dim(), tuple(range(2, 2 + p.dim())))
    pair = tuple(torch.zeros(shape, dtype=p.dtype, device=p.device, requires_grad=True) for shape in shapes)
    for twin in pair:
        twin.grad = torch.zeros_like(twin)
    return pair[0], pair[1]


def _unfilled_entry(p: torch.Tensor, value: Any, other: Any, one: torch.Tensor, two: torch.Tensor) -> Any:
    """The entry of `p`'s state whose values are `value` for the twin `one` and `other` for the twin `two`: a
    tensor shaped like `p`, a copy, or None when it is neither (and when `value` is None: either way the optimizer
    is left to DCP)."""
    if not isinstance(value, torch.Tensor):
        return value
    if p.dim() and value.shape == one.shape and other.shape == two.shape and value.device == one.device:
        return torch.empty_like(p, dtype=value.dtype)
    return value.clone() if value.shape == other.shape else None


@dataclass
class ModelState:
    """What every checkpoint of a model holds, as a DCP state dict (and back): the model, its optimizer, the LR
    schedule, the step and every rank's RNG streams; `_progress` and `_restore` add what a kind of training keeps
    besides (the trainer's data position, a script's own values). The model's part holds a tied weight once
    (`_untied`); `load_state_dict` gives it the model under each of its names."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    """None: the model alone is saved or loaded (a load takes it from a checkpoint that holds an optimizer too)."""
    scheduler: LRScheduler | None
    rank: int
    seed: int
    step: int = 0
    _tied: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def tokens_consumed(self) -> int:
        return 0

    def _progress(self) -> dict[str, Any]:
        return {}

    def _restore(self, progress: dict[str, Any]) -> None:
        pass

    def _rng(self) -> dict[str, Any]:
        """This rank's random streams."""
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng

    def _set_rng(self, rng: dict[str, Any]) -> None:
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])

    def state_dict(self, *, with_rng: bool = True) -> dict[str, Any]:
        if self.optimizer is None:
            model_sd, optim_sd = get_model_state_dict(self.model), None
        else:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        model_sd, self._tied = _untied(model_sd)
        progress = {"step": self.step, "tokens_consumed": self.tokens_consumed, **self._progress()}
        if self.scheduler is not None:
            progress["scheduler"] = self.scheduler.state_dict()
        state: dict[str, Any] = {"model": model_sd, "progress": json.dumps(progress)}
        if optim_sd is not None:
            state["optim"] = optim_sd
        if with_rng:
            # One key per rank: DCP deduplicates identical keys across ranks, these must all be kept.
            state["rng"] = {f"rank{self.rank}": self._rng()}
        return state

    def to_load_into(self, *, with_rng: bool = True) -> dict[str, Any]:
        """`state_dict`, for a load to fill: an optimizer without state gets it uninitialised
        (`_unfilled_optimizer_state`)."""
        if self.optimizer is not None:
            _unfilled_optimizer_state(self.optimizer)
        return self.state_dict(with_rng=with_rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._tied is None:
            self.state_dict(with_rng=False)  # learns which of the model's weights are tied
        model_sd = dict(state["model"])
        for key, same in (self._tied or {}).items():
            model_sd.setdefault(key, model_sd[same])
        if self.optimizer is None:
            set_model_state_dict(self.model, model_sd)
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=state["optim"])
        progress = json.loads(state["progress"])
        self.step = int(progress["step"])
        self._restore(progress)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(progress["scheduler"])
        if "rng" in state:
            self._set_rng(state["rng"][f"rank{self.rank}"])
        else:
            # Another world size: rank r's old stream has no successor, so derive a fresh one.
            torch.manual_seed(self.seed + 1_000_003 * self.step + self.rank)


@dataclass
class TrainingState(ModelState):
    """The trainer's state: a model's, and the data loader's position."""

    loader: DistributedTokenLoader | None = None

    @property
    def tokens_consumed(self) -> int:
        assert self.loader is not None
        return self.loader.consumed * self.loader.samples.seq_len

    def _progress(self) -> dict[str, Any]:
        assert self.loader is not None
        return {"loader": self.loader.state_dict()}

    def _restore(self, progress: dict[str, Any]) -> None:
        assert self.loader is not None
        self.loader.load_state_dict(progress["loader"])


_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
"""How the warning DCP gives of every save and load run with ``no_dist`` begins."""


@contextmanager
def _alone(env: DistEnv) -> Iterator[bool]:
    """Whether DCP is to save or load without its collectives (``no_dist``): in a world of one process, where they
    would pickle its plans and results and send them to itself (a GPT-2 save spent 0.03-0.05 s of 0.7 s so,
    docs/BENCHMARKS.md). DCP's warning of it is silenced meanwhile; a larger world's warnings are left alone."""
    if env.world_size != 1:
        yield False
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)
        yield True


def _local_world_size() -> int:
    """The processes on this host (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@dataclass
class _Pending:
    step: int
    future: Future[Any]
    world_size: int
    tokens_consumed: int
    hashed: dict[str, Listed]
    started: float = field(default_factory=time.monotonic)


class CheckpointManager:
    """Saves (optionally in the background), commits, prunes and resumes checkpoints under ``root``."""

    def __init__(self, root: Path, env: DistEnv, cfg: CheckpointConfig, *, trusted: Recorded | None = None) -> None:
        """`trusted`: the run's ledger (contract/ledger.py); only the checkpoints it admits are loaded. None: no
        ledger (a run outside the pipeline), any intact checkpoint may be."""
        self.root, self.env, self.cfg, self.trusted = root, env, cfg, trusted
        self.committed: list[int] = []
        self.pending: _Pending | None = None
        self.last_save_time = time.monotonic()
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-prune")
        self._deletions: dict[Path, Future[None]] = {}  # of old checkpoints, by directory
        # Async saves run collectives from a background thread: they get their own group so they
        # never interleave with the main thread's collectives.
        self._async_group = new_group(backend="gloo") if cfg.async_save else None
        if env.is_local_main:
            root.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- saving

    def save(self, state: ModelState, *, blocking: bool = False) -> None:
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
        planner = _PieceSavePlanner()
        if self._async_group is not None and not blocking:
            response = dcp_async_save(
                state_dict, storage_writer=writer, planner=planner, process_group=self._async_group
            )
            # torch returns a Future, or (with some stagers) a response holding the upload's Future.
            future = response if isinstance(response, Future) else response.upload_completion
            self.pending = _Pending(step, future, self.env.world_size, state.tokens_consumed, hashed, started)
            log.info(
                "checkpoint %s: staged in %.2fs, writing in the background",
                step_dir(step),
                time.monotonic() - started,
            )
            return
        with _alone(self.env) as alone:
            metadata = dcp_save(
                state_dict, storage_writer=writer, planner=planner, process_group=self.env.ctrl, no_dist=alone
            )
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
        hashed: dict[str, Listed],
        started: float,
    ) -> None:
        directory = self.root / step_dir(step)
        error: str | None = None
        # Each process hashes the data files it wrote, as it wrote them (hosts do not share /opt/ml/checkpoints).
        own: dict[str, dict[str, Any]] | str
        try:
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"DCP returned {type(metadata).__name__}, not its Metadata")
            names = [n for n in data_files(metadata) if n.startswith(written_by(self.env.rank))]
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
        # Never touch anything newer than the newest commit: it may be a save in progress.
        for entry in self.root.iterdir():
            step = step_of(entry.name)
            if step is not None and step < newest and step not in keep and entry not in self._deletions:
                # In the background: a deletion can take as long as writing a checkpoint (a disk mounted with
                # `discard` trims every freed block as it is freed), and training need not wait for it.
                self._deletions[entry] = self._deleter.submit(_remove_old, entry)

    def wait_for_deletions(self) -> None:
        """Wait for the deletions `_prune` started, so that nothing else touches the directories meanwhile."""
        for deletion in self._deletions.values():
            deletion.result()
        self._deletions.clear()

    # ---------------------------------------------------------------- loading

    def _agree(self, local: _Problem | None) -> list[_Problem]:
        gathered: list[_Problem | None] = [None] * self.env.world_size
        dist.all_gather_object(gathered, local, group=self.env.ctrl)
        return [
            _Problem(f"rank {rank}: {problem.text}", problem.transient)
            for rank, problem in enumerate(gathered)
            if problem is not None
        ]

    def _recorded(self, steps: list[int]) -> list[int]:
        """Those of `steps` whose manifest the run's ledger holds (all of them without a ledger)."""
        if self.trusted is None:
            return steps
        kept = []
        for step in steps:
            try:
                data = (self.root / step_dir(step) / MANIFEST).read_bytes()
            except OSError:  # its load reads the manifest again, checks it against the ledger, and says why not
                kept.append(step)
                continue
            if self.trusted.admits(f"{step_dir(step)}/", manifest_sha256(data)):
                kept.append(step)
            else:
                log.warning("skipping checkpoint %s: the run's ledger does not record it", step_dir(step))
        return kept

    def _load(
        self, directory: Path, manifest: Manifest, state: ModelState, *, same_world: bool
    ) -> tuple[dict[str, Any], _Problem | None]:
        """Load the checkpoint in `directory` into a state dict of `state`'s own tensors (with its RNG streams when
        `same_world`); that state dict, and why it could not be loaded, or None."""
        reader = _SafeReader(directory, manifest)
        try:
            if same_world:  # each process reads the files it wrote: it starts reading them now
                own = [name for name in sorted(manifest.files) if name.startswith(written_by(self.env.rank))]
                problem = None
                try:
                    reader.read_ahead(own[: io_threads()])
                except Exception as exc:
                    problem = _Problem(f"{directory.name}: {describe(exc)}", transient(exc))
                # Every rank learns of a refusal before any enters DCP's collectives, which the others would wait in.
                if others := self._agree(problem):
                    passing = all(other.transient for other in others)  # as every rank's: all try again, or none
                    return {}, problem or _Problem(
                        f"{directory.name}: another rank refused its {DCP_METADATA}", passing
                    )
            template = state.to_load_into(with_rng=same_world)  # while those reads run
            try:
                with _alone(self.env) as alone:
                    dcp_load(
                        template,
                        storage_reader=reader,
                        planner=_WeightsOnlyPlanner(),
                        process_group=self.env.ctrl,
                        no_dist=alone,
                    )
            # DCP raises on every rank when any rank fails to read; its exception is a BaseException.
            except (Exception, CheckpointException) as exc:
                # DCP wraps the cause; its last line says what was wrong with the files, except for a refused
                # weights_only load, whose reason is the line naming the global.
                lines = [line.strip().removeprefix(_OWN_ERROR) for line in str(exc).strip().splitlines()]
                refused = [line for line in lines if "Unsupported global" in line]
                text = f"{directory.name}: {(refused or lines)[-1] if lines else describe(exc)}"
                return template, _Problem(text, transient(exc))
        finally:
            reader.close()
        return template, None

    def _load_tried(self, step: int, state: ModelState) -> tuple[dict[str, Any], Manifest | None, list[_Problem]]:
        """Load checkpoint `step` into `state`'s tensors (`_load`), and again after each of `LOAD_RETRY_SECONDS`
        while every rank's errors may pass; the state dict, the manifest, and every rank's errors in the last try
        (none: it loaded)."""
        directory = self.root / step_dir(step)
        for attempt, wait in enumerate((*LOAD_RETRY_SECONDS, None), start=1):
            template: dict[str, Any] = {}
            manifest = _manifest(directory, self.trusted)
            errors = self._agree(manifest if isinstance(manifest, _Problem) else None)
            if not errors:
                assert isinstance(manifest, Manifest)
                same_world = manifest.world_size == self.env.world_size
                template, error = self._load(directory, manifest, state, same_world=same_world)
                errors = self._agree(error)
            if not errors or wait is None or not all(error.transient for error in errors):
                break
            if self.env.is_main:
                log.warning(
                    "checkpoint %s: %s; loading it again in %.0f s (try %d of %d failed with errors that may pass)",
                    step_dir(step),
                    "; ".join(error.text for error in errors),
                    wait,
                    attempt,
                    len(LOAD_RETRY_SECONDS) + 1,
                )
            time.sleep(wait)
        return template, None if isinstance(manifest, _Problem) else manifest, errors

    def load_latest(self, state: ModelState) -> int | None:
        """Restore the newest checkpoint that every rank can load; None when there is none to resume."""
        if not self.cfg.resume:
            return None
        self.wait_for_deletions()
        listing: list[list[int]] = [self._recorded(committed_steps(self.root)) if self.env.is_main else []]
        dist.broadcast_object_list(listing, src=0, group=self.env.ctrl)
        candidates = listing[0]
        problems: list[str] = []
        for step in candidates:
            template, manifest, errors = self._load_tried(step, state)
            if errors:
                problems.extend(error.text for error in errors)
                if self.env.is_main:
                    log.warning("skipping checkpoint %s: %s", step_dir(step), "; ".join(e.text for e in errors))
                continue
            assert manifest is not None
            same_world = manifest.world_size == self.env.world_size
            state.load_state_dict(template)
            if not same_world:
                log.warning(
                    "checkpoint %s was written by %d processes, resuming on %d: model and optimizer "
                    "resharded, data position kept, RNG streams reseeded",
                    step_dir(step),
                    manifest.world_size,
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

    def close(self, *, commit: bool = True) -> None:
        """Commit a background save, if any (unless not `commit`: the run is failing, and other ranks may not
        take part), and finish deleting old checkpoints."""
        try:
            if commit:
                self.wait()
        finally:
            self.wait_for_deletions()
            self._deleter.shutdown()

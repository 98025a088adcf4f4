"""A save's writer: each process's items shared among `io_threads()` files, each file written by a thread of its
own and hashed in segments (runs of whole items) as it is written; and the manifest's entries of the files."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystem, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture
from torch.utils.serialization import config as serialization_config

from contract.stored_checkpoints import Listed, Segment
from training import direct_io, tensor_archive
from training.checkpoint.integrity import CheckpointError, segment_digest
from training.checkpoint.storage import io_threads
from training.sagemaker_contract import describe

_HASH_CHUNK = 1 << 20


_MIN_SEGMENT = 16 << 20
"""A segment of a data file ends at the first item boundary after this many bytes, so a window of a file this
trainer wrote is at most about this plus its largest item (a load holds one window per file it is reading, and
the reader's buffers, in `io_threads()` threads; `.metadata`, and each file of a checkpoint saved before
segments, is one window), and the manifest lists at most one digest per this many bytes, or per item larger
than this."""


_SMALL_ITEM = 1 << 20
"""A tensor item of fewer bytes than this is saved in the first of its process's files, before that file's larger
items (`_files_for`). A load takes 0.1 ms or so of Python, with the GIL held, over each item whatever its size
(the disk's time for 0.15-0.3 MiB on the benchmark VM): GPT-2's 443 tensor items under this size, with its 27
non-tensor items, cost a load about 0.05 s. Saved last, as DCP's writer orders a file, they were loaded after
the disk had finished."""


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

"""A load's reader: DCP's ``.metadata`` unpickled knowing only DCP's metadata types, and each data file read once,
a window at a time, its items loaded from the bytes `integrity._verified_windows` checked."""

from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing, suppress
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future as TorchFuture

from contract.stored_checkpoints import DCP_METADATA, Listed, Manifest
from training import direct_io
from training.checkpoint.integrity import (
    CheckpointError,
    _opened,
    _read_verified,
    _verified_windows,
    _windows,
    transient,
)
from training.checkpoint.storage import io_threads
from training.tensor_archive import saved

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

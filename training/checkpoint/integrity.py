"""What a load checks before it uses a byte: a checkpoint's manifest, read once (against the run's ledger, if any),
and each data file read a window at a time, each window given only once each of its segments matches its digest;
the error a checkpoint that fails them raises, and which errors may pass (`transient`)."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from blake3 import blake3
from torch.distributed.checkpoint.api import CheckpointException

from contract.layout import MANIFEST
from contract.ledger import Recorded
from contract.stored_checkpoints import (
    FORMAT_VERSION,
    SEGMENT_HASHES,
    Listed,
    Manifest,
    ManifestError,
    Segment,
    manifest_sha256,
)
from training import direct_io
from training.sagemaker_contract import describe


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


TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOMEM, errno.ETIMEDOUT, errno.ESTALE, errno.ECONNRESET}
)
"""OS errors a read of a checkpoint may get and not get again: a network file system's (FSx for Lustre's) server
failing over or timing out, memory or threads short for a moment. A load that gets only these tries the same
checkpoint again (`manager.LOAD_RETRY_SECONDS`), where it would have gone on to an older one, or refused to start."""


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

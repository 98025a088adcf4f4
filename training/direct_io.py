"""Writing a new file with O_DIRECT, which skips the page cache: the disk reads each chunk from the process's
own page-aligned buffer, where a buffered write has the kernel copy every byte into cached pages first. On the
benchmark VM that copy cost more CPU than anything else in a checkpoint save (docs/BENCHMARKS.md).

Python's file objects cannot write with O_DIRECT (its writes must be whole blocks from aligned memory), and no
library does this; hence `DirectFile`. It falls back to a buffered file where the file system refuses O_DIRECT
(some overlays and FUSE file systems) and on systems without it, and goes on through the page cache where a
write is refused (a device whose blocks are larger than `ALIGNMENT`)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

ALIGNMENT = 4096
"""What O_DIRECT needs of a write's offset, length and buffer address: a multiple of the device's logical block
size (512 or 4096 bytes on the disks this is written for); anonymous maps are page-aligned."""

CHUNK = 8 << 20
"""Bytes per O_DIRECT write; a multiple of `ALIGNMENT`."""

BUFFERS = 4
"""Buffers per file: the caller fills one while the disk writes the others, up to `BUFFERS - 1` at once."""

_WRITEBACK_CHUNK = 32 << 20


def aligned_buffer(size: int) -> mmap.mmap:
    """`size` bytes of zeroed memory that O_DIRECT can write from and read into."""
    return mmap.mmap(-1, size)


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """Write `data` at `offset`; where O_DIRECT refuses the write (EINVAL: the device's blocks are larger than
    `ALIGNMENT`), turn O_DIRECT off for the file and write it through the page cache."""
    direct = True
    while data:
        try:
            written = os.pwrite(fd, data, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not direct:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            direct = False
            continue
        data, offset = data[written:], offset + written


class DirectFile:
    """A new file written with O_DIRECT from `BUFFERS` page-aligned buffers: the caller fills one while threads
    of the file's own write the others, so the disk works while the caller serialises and hashes. `close`
    writes the last, partial block padded to `ALIGNMENT`, cuts the file back to the bytes written, and fsyncs
    it; until then the file's contents are incomplete. `abandon` closes it without, and `close` then refuses.
    Not safe for concurrent callers."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self._buffers = [aligned_buffer(CHUNK) for _ in range(BUFFERS)]
        self._views = [memoryview(buffer) for buffer in self._buffers]
        self._free = deque(range(1, BUFFERS))
        self._current = 0
        self._filled = 0  # bytes of the current buffer
        self._disk = ThreadPoolExecutor(max_workers=BUFFERS - 1, thread_name_prefix="direct-write")
        self._writing: deque[tuple[int, Future[None]]] = deque()  # oldest first
        self._closed = self._abandoned = False

    def write(self, data: memoryview) -> None:
        while data:
            view = self._views[self._current]
            count = min(len(data), CHUNK - self._filled)
            view[self._filled : self._filled + count] = data[:count]
            self._filled += count
            self.size += count
            data = data[count:]
            if self._filled == CHUNK:
                self._hand_over(CHUNK)

    def _hand_over(self, length: int) -> None:
        """Start writing the current buffer's first `length` bytes (a multiple of `ALIGNMENT`), and fill a free
        buffer next, once the oldest write has ended if none is free."""
        offset = self.size - self._filled
        self._writing.append(
            (self._current, self._disk.submit(_write_all, self.fd, self._views[self._current][:length], offset))
        )
        if not self._free:
            self._wait(1)
        self._current, self._filled = self._free.popleft(), 0

    def _wait(self, count: int) -> None:
        """Wait for the `count` oldest writes; raise the first one's error."""
        for _ in range(min(count, len(self._writing))):
            index, writing = self._writing.popleft()
            writing.result()
            self._free.append(index)

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self._abandoned:
            raise ValueError("the file was abandoned: its contents are incomplete")
        if self._closed:
            return
        try:
            if self._filled:
                padded = -(-self._filled // ALIGNMENT) * ALIGNMENT
                self._views[self._current][self._filled : padded] = bytes(padded - self._filled)
                self._hand_over(padded)
            self._wait(len(self._writing))
            os.ftruncate(self.fd, self.size)
            os.fsync(self.fd)
        except BaseException:
            self.abandon()
            raise
        self._release()

    def abandon(self) -> None:
        if not self._closed:
            self._abandoned = True
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._disk.shutdown(wait=True)  # a write in flight ends before the file and its buffer go
        os.close(self.fd)
        # Unmapped once no view of them is left (a failed write's traceback may hold one a while).
        self._writing.clear()
        self._views, self._buffers = [], []


class BufferedFile:
    """A new file written through the page cache, for file systems that refuse O_DIRECT. It starts writing each
    32 MiB to the disk as soon as it is written (Linux starts writeback for dirty pages it is advised to drop),
    not all at `close`, which fsyncs the file."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("wb")
        self.size = self._flushing = 0  # bytes before `_flushing` have been handed to the kernel's writeback
        self._abandoned = False

    def write(self, data: memoryview) -> None:
        self.file.write(data)
        self.size += len(data)
        if self.size - self._flushing >= _WRITEBACK_CHUNK and hasattr(os, "posix_fadvise"):
            self.file.flush()
            os.posix_fadvise(self.file.fileno(), self._flushing, self.size - self._flushing, os.POSIX_FADV_DONTNEED)
            self._flushing = self.size

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        if self._abandoned:
            raise ValueError("the file was abandoned: its contents are incomplete")
        if self.file.closed:
            return
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
        except BaseException:
            self.abandon()
            raise
        self.file.close()

    def abandon(self) -> None:
        if not self.file.closed:
            self._abandoned = True
            with suppress(OSError):  # its error is the one being reported
                self.file.close()


def create(path: Path) -> DirectFile | BufferedFile:
    """A new, empty file at `path` (replacing one there), written with O_DIRECT where its file system allows."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return BufferedFile(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
    except OSError:  # EINVAL where the file system has no O_DIRECT
        return BufferedFile(path)
    try:
        return DirectFile(fd)
    except BaseException:
        os.close(fd)
        raise

"""Writing a new file, and reading a whole file front to back, with O_DIRECT, which skips the page cache: the
disk reads each chunk from, or writes it into, the process's own page-aligned buffer, where a buffered write or
read has the kernel copy every byte through cached pages it must first allocate. On the benchmark VM that
kernel work cost more CPU than anything else in a checkpoint save, and made a cold load's kernel time swing
from under half a second to three (docs/BENCHMARKS.md).

Python's file objects cannot write or read with O_DIRECT (its transfers must be whole blocks at aligned offsets,
in aligned memory), and no library does this; hence `DirectFile` and `DirectReader`. Both fall back to the page
cache where the file system refuses O_DIRECT (some overlays and FUSE file systems) and on systems without it,
and go on through the page cache where a transfer is refused (a device whose blocks are larger than
`ALIGNMENT`)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

ALIGNMENT = 4096
"""What O_DIRECT needs of a write's or a read's offset, length and buffer address: a multiple of the device's
logical block size (512 or 4096 bytes on the disks this is written for); anonymous maps are page-aligned."""

CHUNK = 8 << 20
"""Bytes per O_DIRECT write or read; a multiple of `ALIGNMENT`."""

BUFFERS = 4
"""Buffers per file written: the caller fills one while the disk writes the others, up to `BUFFERS - 1` at once."""

READ_BUFFERS = 8
"""Buffers per file read: the caller copies out of one while the disk reads the next `READ_BUFFERS - 1` chunks
(O_DIRECT has no kernel readahead, so the reader keeps the disk busy itself)."""

KEPT_BUFFERS = 32
"""Buffers a process keeps once a `DirectFile` or `DirectReader` is closed, for the files it writes or reads next
(32: eight files being written at once, as `training.checkpoint` writes at most, or four read). Memory a
process touches for the first time costs the kernel a page fault for each page: on the benchmark VM, 1.1-1.9 ms
per MiB of huge pages freed 3 s or more before (its balloon reports free pages to the host, which drops them),
0.06-0.13 ms per MiB freed up to 0.5 s before. Kept, they took a save's kernel CPU there from 0.06-0.10 s to
0.03-0.07 s (docs/BENCHMARKS.md). A file read takes eight buffers and a file written leaves four: a load
after a save finds half of what it needs, one after another load all of it. A process that resumes loads once,
first, into new buffers, and its first save writes from them."""

_kept: list[mmap.mmap] = []
_kept_lock = threading.Lock()

_WRITEBACK_CHUNK = 32 << 20


def aligned_buffer(size: int) -> mmap.mmap:
    """`size` bytes of zeroed memory that O_DIRECT can write from and read into: private to the process, and
    advised to be backed by transparent huge pages where the kernel offers them. The kernel sends a direct read or
    write to the disk as requests of at most the device's `max_segments` runs of memory; in 4 KiB pages, each page
    is a run (254 of them, under 1 MiB a request, on the benchmark VM), and a 2 MiB page is one. On the benchmark
    VM that took two files' direct reads from 0.86 to 2.30 GiB/s (docs/BENCHMARKS.md)."""
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with suppress(OSError):  # a kernel without transparent huge pages: 4 KiB pages
            buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def _kept_buffer() -> mmap.mmap:
    """A buffer of `CHUNK` bytes: one a closed `DirectFile` or `DirectReader` left, or new."""
    with _kept_lock:
        while _kept:
            buffer = _kept.pop()
            if len(buffer) == CHUNK:
                return buffer
    return aligned_buffer(CHUNK)


def _keep(buffers: list[mmap.mmap]) -> None:
    """Keep buffers no write or read is using any more for later files, up to `KEPT_BUFFERS`."""
    with _kept_lock:
        _kept.extend(buffers[: max(0, KEPT_BUFFERS - len(_kept))])


def _without_o_direct(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


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
            _without_o_direct(fd)
            direct = False
            continue
        data, offset = data[written:], offset + written


def _read_chunk(fd: int, buffer: memoryview, offset: int) -> int:
    """Fill `buffer` from `offset`, or as much of it as the file holds there; the bytes read. Where O_DIRECT
    refuses the read (EINVAL: the device's blocks are larger than `ALIGNMENT`, or a short read left the next
    one unaligned), turn O_DIRECT off for the file and read through the page cache."""
    done, direct = 0, True
    while done < len(buffer):
        try:
            read = os.preadv(fd, [buffer[done:]], offset + done)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not direct:
                raise
            _without_o_direct(fd)  # for the reader's other threads too
            direct = False
            continue
        if not read:
            break
        done += read
    return done


class DirectFile:
    """A new file written with O_DIRECT from `BUFFERS` page-aligned buffers: the caller fills one while threads
    of the file's own write the others, so the disk works while the caller serialises and hashes. `close`
    writes the last, partial block padded to `ALIGNMENT`, cuts the file back to the bytes written, and fsyncs
    it; until then the file's contents are incomplete. `abandon` closes it without, and `close` then refuses.
    Not safe for concurrent callers."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self._buffers = [_kept_buffer() for _ in range(BUFFERS)]
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
        self._writing.clear()
        _keep(self._buffers)
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


def evict(path: Path) -> None:
    """Write `path`'s dirty pages to the disk and ask the kernel to drop its pages from the page cache, so that
    the next read of it reads the disk (where the file system lets its pages go: tmpfs does not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class DirectReader:
    """A file read front to back with O_DIRECT: threads of the reader's own read the next `READ_BUFFERS - 1`
    chunks into page-aligned buffers (`READ_BUFFERS * CHUNK` bytes of memory per reader) while the caller
    copies the bytes of one out with `readinto`, in order. Each byte is read from the file once. After a
    failed read every `readinto` raises that error: the bytes after it never come as if they were the next.
    Not safe for concurrent callers; `close` it (or use it as a context manager)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffers = [_kept_buffer() for _ in range(READ_BUFFERS)]
        self._views = [memoryview(buffer) for buffer in self._buffers]
        self._disk = ThreadPoolExecutor(max_workers=READ_BUFFERS - 1, thread_name_prefix="direct-read")
        self._reading: deque[tuple[int, Future[int]]] = deque()  # (buffer, its read), oldest first
        self._requested = 0  # the file offset of the next chunk to read
        self._ended = False  # a chunk came back short: the file ends in it
        self._failure: BaseException | None = None
        self._current, self._available = 0, memoryview(b"")  # the buffer being copied out, and its bytes left
        try:
            for index in range(1, READ_BUFFERS):
                self._request(index)
        except BaseException:
            self._disk.shutdown(wait=True)  # no read is in flight when the caller closes the file
            _keep(self._buffers)
            raise

    def _request(self, index: int) -> None:
        self._reading.append((index, self._disk.submit(_read_chunk, self.fd, self._views[index], self._requested)))
        self._requested += CHUNK

    def readinto(self, target: Any) -> int:
        """Copy the file's next bytes into `target`, as many as it holds or the file has left; 0 at its end."""
        if not self._buffers:
            raise ValueError("the reader is closed")
        if self._failure is not None:
            raise self._failure
        view, done = memoryview(target).cast("B"), 0
        while done < len(view):
            if not self._available:
                if self._ended or not self._reading:
                    break
                if not self._reading[0][1].done() and done:
                    break  # return what is here rather than wait
                self._request(self._current)  # the buffer just emptied reads the chunk after the last requested
                self._current, reading = self._reading.popleft()
                try:
                    read = reading.result()
                except Exception as exc:
                    self._failure = exc
                    raise
                self._ended = read < CHUNK
                self._available = self._views[self._current][:read]
                continue
            count = min(len(view) - done, len(self._available))
            # numpy's copy releases the GIL (a memoryview's does not): the load's other threads hash meanwhile.
            np.copyto(np.frombuffer(view[done : done + count], np.uint8), self._available[:count])
            self._available, done = self._available[count:], done + count
        return done

    def close(self) -> None:
        if not self._buffers:
            return
        self._disk.shutdown(wait=True, cancel_futures=True)  # no read is in flight when its buffer goes
        os.close(self.fd)
        self._reading.clear()
        self._available = memoryview(b"")
        _keep(self._buffers)
        self._views, self._buffers = [], []

    def __enter__(self) -> DirectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CachedReader:
    """A file read front to back through the page cache, for file systems that refuse O_DIRECT, asking the
    kernel to read one to two `CHUNK`s ahead of the caller."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("rb", buffering=0)
        self.offset = self._ahead = 0  # bytes read; bytes the kernel was asked to read ahead
        self._advise = hasattr(os, "posix_fadvise")
        if self._advise:
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def readinto(self, target: Any) -> int:
        read = self.file.readinto(target) or 0
        self.offset += read
        if self._advise and read and self.offset + CHUNK > self._ahead:
            start = max(self.offset, self._ahead)
            os.posix_fadvise(self.file.fileno(), start, CHUNK, os.POSIX_FADV_WILLNEED)
            self._ahead = start + CHUNK
        return read

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> CachedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_to_read(path: Path) -> DirectReader | CachedReader:
    """`path`, to be read front to back, with O_DIRECT where its file system allows."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return CachedReader(path)
    try:
        fd = os.open(path, os.O_RDONLY | direct)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a missing file is reported as such
            raise
        return CachedReader(path)
    try:
        return DirectReader(fd)
    except BaseException:
        os.close(fd)
        raise


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

"""Writing a new file, and reading a whole file front to back in given spans, with O_DIRECT, which skips the page
cache: the disk reads each chunk from, or writes it into, the process's own page-aligned buffer, where a buffered
write or read has the kernel copy every byte through cached pages it must first allocate; a reader gives its
caller each span in the memory the disk read it into. On the benchmark VM that
kernel work cost more CPU than anything else in a checkpoint save, and made a cold load's kernel time swing
from under half a second to three (docs/BENCHMARKS.md).

Python's file objects cannot write or read with O_DIRECT (its transfers must be whole blocks at aligned offsets,
in aligned memory), and no library does this; hence `DirectFile` and `DirectReader`. Both fall back to the page
cache where the file system refuses O_DIRECT (some overlays and FUSE file systems) and on systems without it,
and go on through the page cache where a transfer is refused (a device whose blocks are larger than
`ALIGNMENT`)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import itertools
import mmap
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from pathlib import Path

ALIGNMENT = 4096
"""What O_DIRECT needs of a write's or a read's offset, length and buffer address: a multiple of the device's
logical block size (512 or 4096 bytes on the disks this is written for); anonymous maps are page-aligned."""

CHUNK = 8 << 20
"""Bytes per O_DIRECT write or read; a multiple of `ALIGNMENT`."""

BUFFERS = 4
"""Buffers per file written: the caller fills one while the disk writes the others, up to `BUFFERS - 1` at once."""

READ_AHEAD = 64 << 20
"""What a `DirectReader` reads ahead of the span its caller has (O_DIRECT has no kernel readahead, so the reader
keeps the disk busy itself): as many whole spans as it takes buffers for its largest span (that span with the
blocks it starts and ends in, in whole huge pages) to hold this many bytes, the next one at least. A reader's
buffers are then at most this many bytes and one buffer more, however many spans its file has; a file of many
spans smaller than its largest reads fewer bytes ahead."""

KEPT_BYTES = 256 << 20
"""Bytes of buffers a process keeps once a `DirectFile` or `DirectReader` is closed, for the files it writes or
reads next (256 MiB: eight files being written at once, as `training.checkpoint.writer` writes at most, or two read in
its 16 MiB segments, five buffers of 18 MiB each, with what a save of two files leaves). Memory a process
touches for the first time costs the kernel a page fault for each page: on the benchmark VM, 1.1-1.9 ms per MiB
of huge pages freed 3 s or more before (its balloon reports free pages to the host, which drops them),
0.06-0.13 ms per MiB freed up to 0.5 s before. Kept, they took a save's kernel CPU there from 0.06-0.10 s to
0.03-0.07 s (docs/BENCHMARKS.md). A process that resumes loads once, first, into new buffers, and its first
save writes from them."""

READ_THREADS = 16
"""Threads a process reads with, for all its `DirectReader`s: two files' `READ_AHEAD` in `CHUNK`s in flight at once
(128 MiB). A process that reads more files at once (`training.checkpoint.storage.io_threads`, up to 8) shares them;
not measured on a host with more than two cores."""

_kept: list[mmap.mmap] = []
_kept_lock = threading.Lock()

_WRITEBACK_CHUNK = 32 << 20
_HUGE_PAGE = 2 << 20


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


def advise_huge_pages(address: int, size: int) -> None:
    """Advise the whole pages of memory the process has not touched yet, at `address` for `size` bytes (a tensor's
    new storage), to be backed by transparent huge pages: one page fault per 2 MiB instead of 512 as it is first
    written (docs/BENCHMARKS.md). Memory the kernel cannot back so keeps its 4 KiB pages."""
    page = mmap.PAGESIZE
    start, end = -(-address // page) * page, (address + size) // page * page
    if end - start < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return
    _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_HUGEPAGE)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_huge_pages(size: int) -> int:
    return -(-size // _HUGE_PAGE) * _HUGE_PAGE


def _kept_buffer(size: int, at_most: int | None = None) -> mmap.mmap:
    """A buffer of at least `size` bytes: the smallest that a closed `DirectFile` or `DirectReader` left (of at
    most `at_most` bytes, where given), or a new one of `size` rounded up to whole huge pages."""
    with _kept_lock:
        fitting = [
            index
            for index, buffer in enumerate(_kept)
            if size <= len(buffer) and (at_most is None or len(buffer) <= at_most)
        ]
        if fitting:
            return _kept.pop(min(fitting, key=lambda index: len(_kept[index])))
    return aligned_buffer(_in_huge_pages(size))


def _keep(buffers: list[mmap.mmap]) -> None:
    """Keep buffers no write or read is using any more for later files, up to `KEPT_BYTES`."""
    with _kept_lock:
        held = sum(map(len, _kept))
        for buffer in buffers:
            if held + len(buffer) <= KEPT_BYTES:
                _kept.append(buffer)
                held += len(buffer)


class _ReadingThreads:
    """The process's `READ_THREADS`, every one started at its first read, before the read, and shared by its
    readers. On the benchmark VM, threads started while a first load's reads faulted in its new buffers were slow
    to start: a process's first load opened its files (and started their reads) in 0.06-0.21 s with threads of
    each reader's own, and in 0.03-0.11 s with these (docs/BENCHMARKS.md). Idle, they wait on a queue."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None

    def started(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None:
                pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="direct-read")
                together = threading.Barrier(READ_THREADS + 1)  # each waits until all are started: none is reused
                try:
                    waiting = [pool.submit(together.wait) for _ in range(READ_THREADS)]
                    together.wait()
                    wait(waiting)
                except BaseException:
                    together.abort()
                    pool.shutdown(wait=True)
                    raise
                self.pool = pool
            return self.pool

    def forget(self) -> None:
        """In a child process forked from this one, where the threads do not run."""
        self.lock, self.pool = threading.Lock(), None


_reading = _ReadingThreads()


def _reading_threads() -> ThreadPoolExecutor:
    return _reading.started()


def reading_threads() -> ThreadPoolExecutor:
    """The process's reading threads, started at the first call, for reads of a file that no `DirectReader` reads
    (a model folder's weights): threads started while other reads fault in new memory are slow to start."""
    return _reading_threads()


def _forget_reading_threads() -> None:
    _reading.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reading_threads)


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
        self._buffers = [_kept_buffer(CHUNK) for _ in range(BUFFERS)]
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


def _blocks(start: int, end: int, *, last: bool) -> int:
    """The bytes a read of the span [start, end) of a file covers, from the start of the block `start` is in to
    the end of the block `end` is in; for the file's last span, to the end of the block after its last byte, so
    that a byte past the end shows."""
    stop = end + 1 if last else end
    return -(-stop // ALIGNMENT) * ALIGNMENT - (start - start % ALIGNMENT)


class _SpanRead:
    """One span being read: its bytes [start, end) of the file, read from `first` (the start of the block that
    `start` is in) into `buffer`, in reads of up to `CHUNK` bytes: (their length, the read)."""

    def __init__(self, start: int, end: int, buffer: mmap.mmap) -> None:
        self.start, self.end, self.first, self.buffer = start, end, start - start % ALIGNMENT, buffer
        self.reads: list[tuple[int, Future[int]]] = []

    def wait(self) -> int:
        """Wait for every one of the span's reads (none is then writing into its buffer); where the file ends, or
        where the reads do when it goes on past them. The first failed read's error is raised."""
        wait([reading for _, reading in self.reads])
        extent = self.first
        for length, reading in self.reads:
            read = reading.result()
            extent += read
            if read < length:
                break
        return extent


class DirectReader:
    """A file read front to back with O_DIRECT, a span at a time: `spans` are the lengths of consecutive runs of
    its bytes from the first. Each span is read into a page-aligned buffer of the reader's own (from the start of
    the block it starts in) by the process's reading threads (`READ_THREADS`), in reads of up to `CHUNK` bytes,
    and `next_span` gives the caller its bytes where the disk put them, without a copy. The reader's buffers are
    each as large as its largest span (with the blocks it starts and ends in), and there is one more of them than
    it takes buffers of that size, in whole huge pages, to hold `READ_AHEAD` bytes (fewer for fewer spans): the
    spans after the caller's are read into the others. After a failed read, or a failure to start one, every call
    raises that error: the bytes after it never come as if they were the next. Not safe for concurrent callers;
    `close` it (or use it as a context manager). A span the caller still has when it closes the reader is not kept
    for other files."""

    def __init__(self, fd: int, spans: Sequence[int]) -> None:
        self.fd = fd
        self._spans = list(itertools.pairwise(itertools.accumulate(spans, initial=0)))  # [start, end) of each
        largest = max((_blocks(*span, last=True) for span in self._spans), default=ALIGNMENT)
        size = _in_huge_pages(largest)  # a new buffer's; a kept one is taken only up to it
        count = max(1, min(len(self._spans), 1 + -(-READ_AHEAD // size)))  # one for a file of no spans
        self._buffers: list[mmap.mmap] = []
        self._reading: deque[_SpanRead] = deque()  # oldest first
        self._held: _SpanRead | None = None  # the span whose bytes the caller has
        self._requested = 0  # spans whose reads have been asked for
        self._extent: int | None = None  # where the file ends, or its last span's reads do, once it is read
        self._failure: BaseException | None = None
        self._closed = False
        try:
            self._disk = _reading_threads()
            for _ in range(count):
                self._buffers.append(_kept_buffer(largest, at_most=size))
            self._free = deque(self._buffers)
            self._request()
        except BaseException:
            self._end_reads()  # no read is in flight when the caller closes the file
            _keep(self._buffers)
            raise

    def _request(self) -> None:
        """Start reading the spans after those asked for, into the free buffers."""
        while self._free and self._requested < len(self._spans):
            start, end = self._spans[self._requested]
            self._requested += 1
            span = _SpanRead(start, end, self._free.popleft())
            self._reading.append(span)
            view = memoryview(span.buffer)[: _blocks(start, end, last=self._requested == len(self._spans))]
            for at in range(0, len(view), CHUNK):
                piece = view[at : at + CHUNK]
                span.reads.append((len(piece), self._disk.submit(_read_chunk, self.fd, piece, span.first + at)))

    def next_span(self) -> memoryview:
        """The next span's bytes (fewer where the file ends in it), valid until the next call of this or `beyond`,
        or `close`."""
        if self._closed:
            raise ValueError("the reader is closed")
        if self._failure is not None:
            raise self._failure
        if not self._reading:
            raise ValueError("every span has been read")
        self._give_back()
        self._held = span = self._reading.popleft()
        try:
            self._request()  # into the buffer the caller gave back
            extent = span.wait()
        except BaseException as exc:
            self._failure = exc
            raise
        if not self._reading:
            self._extent = extent
        return memoryview(span.buffer)[span.start - span.first : max(span.start, min(extent, span.end)) - span.first]

    def _end_reads(self) -> None:
        """Cancel the reads not yet begun (a cancelled read never runs) and wait for the others, not for the reads
        of other files queued before them."""
        spans = [*self._reading, *([self._held] if self._held is not None else [])]
        wait([reading for span in spans for _, reading in span.reads if not reading.cancel()])

    def _give_back(self) -> None:
        """The caller is done with the span it had: its buffer is free for the next read."""
        if self._held is not None:
            self._free.append(self._held.buffer)
            self._held = None

    def beyond(self) -> bool:
        """Whether the file holds a byte past its spans' end; once every span has been taken, and the caller is
        done with the last."""
        if self._closed:
            raise ValueError("the reader is closed")
        if self._failure is not None:
            raise self._failure
        self._give_back()
        if not self._spans:
            self._extent = _read_chunk(self.fd, memoryview(self._buffers[0])[:ALIGNMENT], 0)
        elif self._reading or self._extent is None:
            raise ValueError("a span has not been read")
        return self._extent > (self._spans[-1][1] if self._spans else 0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._end_reads()  # no read is in flight when its buffer goes
        os.close(self.fd)
        held = self._held.buffer if self._held is not None else None
        self._reading.clear()
        self._free.clear()
        self._held = None
        _keep([buffer for buffer in self._buffers if buffer is not held])  # the caller may still read the held one
        self._buffers = []

    def __enter__(self) -> DirectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CachedReader:
    """A file read front to back through the page cache, a span at a time as `DirectReader` reads it, for file
    systems that refuse O_DIRECT: each span is copied into one buffer as large as the largest, while the kernel
    is asked to read the next span ahead."""

    def __init__(self, path: Path, spans: Sequence[int]) -> None:
        self.file = path.open("rb", buffering=0)
        self._spans = list(spans)
        self._buffer = memoryview(bytearray(max(self._spans, default=0)))
        self._taken = self._offset = 0  # spans taken; bytes read
        self._advise = hasattr(os, "posix_fadvise")
        if self._advise:
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self._read_ahead(0)

    def _read_ahead(self, index: int) -> None:
        if self._advise and index < len(self._spans):
            os.posix_fadvise(self.file.fileno(), self._offset, self._spans[index], os.POSIX_FADV_WILLNEED)

    def next_span(self) -> memoryview:
        """The next span's bytes (fewer where the file ends in it), valid until the next call of this or `beyond`,
        or `close`."""
        if self.file.closed:
            raise ValueError("the reader is closed")
        if self._taken == len(self._spans):
            raise ValueError("every span has been read")
        length, done = self._spans[self._taken], 0
        self._taken += 1
        while done < length and (read := self.file.readinto(self._buffer[done:length])):
            done += read
        self._offset += done
        self._read_ahead(self._taken)
        return self._buffer[:done]

    def beyond(self) -> bool:
        """Whether the file holds a byte past its spans' end; once every span has been taken."""
        if self._taken != len(self._spans):
            raise ValueError("a span has not been read")
        return bool(self.file.read(1))

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> CachedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_to_read(path: Path, spans: Sequence[int]) -> DirectReader | CachedReader:
    """`path`, to be read front to back in `spans` (the lengths of consecutive runs of its bytes from the first),
    with O_DIRECT where its file system allows."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return CachedReader(path, spans)
    try:
        fd = os.open(path, os.O_RDONLY | direct)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a missing file is reported as such
            raise
        return CachedReader(path, spans)
    try:
        return DirectReader(fd, spans)
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

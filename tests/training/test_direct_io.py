"""training/direct_io.py: a new file written with O_DIRECT holds exactly the bytes written, whatever their
sizes; where O_DIRECT is refused the file is buffered, with the same bytes; a failed disk write fails the file
and leaves no descriptor open. A file read with O_DIRECT gives exactly its bytes, in order, whatever the sizes
asked for, and leaves none of them in the page cache; where O_DIRECT is refused it is read through the page
cache; a failed disk read fails the read, and closing the reader leaves no descriptor or thread behind."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import itertools
import mmap
import os
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from training_helpers import cached_pages, o_direct_works, refuse_o_direct

from training import direct_io

_SMALL_CHUNK = 2 * direct_io.ALIGNMENT
_PIECES = [1, 7, direct_io.ALIGNMENT - 1, direct_io.ALIGNMENT, _SMALL_CHUNK + 3, 5 * _SMALL_CHUNK]
"""Sizes of the pieces tests write and read: they straddle every chunk and block."""


@pytest.fixture
def small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """O_DIRECT in `tmp_path` (or the test is skipped), in chunks of two blocks: many writes in few bytes."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "CHUNK", _SMALL_CHUNK)


@pytest.fixture(params=[True, False], ids=["o_direct", "refused"])
def o_direct(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways a file is opened: with O_DIRECT (skipped where `tmp_path`'s file system refuses it), and where
    the file system refuses it."""
    if request.param and not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    if not request.param:
        refuse_o_direct(monkeypatch)
    return bool(request.param)


def _write_in_pieces(file: direct_io.DirectFile | direct_io.BufferedFile, data: bytes, seed: int) -> None:
    rng, at = random.Random(seed), 0
    while at < len(data):
        length = rng.choice(_PIECES)
        file.write(memoryview(data[at : at + length]))
        at = min(len(data), at + length)
        assert file.tell() == at


_SIZES = [
    *(0, 1, direct_io.ALIGNMENT - 1, direct_io.ALIGNMENT),
    *(_SMALL_CHUNK - 1, _SMALL_CHUNK, _SMALL_CHUNK + 1, 3 * _SMALL_CHUNK + 17, 11 * _SMALL_CHUNK),
]


@pytest.mark.parametrize("size", _SIZES)
def test_a_new_file_holds_exactly_the_bytes_written(
    size: int, o_direct: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct_io, "CHUNK", _SMALL_CHUNK)  # many chunks, and every buffer reused, in few bytes
    data = random.Random(size).randbytes(size)
    path = tmp_path / "file"
    path.write_bytes(b"x" * (2 * size + 5))  # an older, longer file there is replaced
    file = direct_io.create(path)
    assert isinstance(file, direct_io.DirectFile if o_direct else direct_io.BufferedFile)
    _write_in_pieces(file, data, seed=size)
    file.close()
    file.close()  # a second close does nothing
    assert path.read_bytes() == data


@pytest.mark.usefixtures("small_chunks")
def test_a_failed_disk_write_fails_the_file_and_leaves_no_descriptor_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = []

    def disk_full(fd: int, data: memoryview, offset: int) -> None:
        writes.append(len(data))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io, "_write_all", disk_full)
    file = direct_io.create(tmp_path / "file")
    assert isinstance(file, direct_io.DirectFile)
    closed: list[int] = []
    close = os.close
    monkeypatch.setattr(direct_io.os, "close", lambda fd: (closed.append(fd), close(fd))[1])
    with pytest.raises(OSError, match="No space left"):  # a later write, when it waits for a buffer, or the close
        file.write(memoryview(bytes((direct_io.BUFFERS + 1) * _SMALL_CHUNK)))
        file.close()
    assert writes
    file.abandon()
    assert closed == [file.fd]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("direct-write")]
    file.abandon()  # and again does nothing
    with pytest.raises(ValueError, match="abandoned: its contents are incomplete"):
        file.close()  # never taken for a complete file


def _refusing_o_direct(transfer: Callable[[int, Any, int], int]) -> tuple[Callable[[int, Any, int], int], list[int]]:
    """`transfer(fd, data, offset)` (os.pwrite or os.preadv) on a device whose blocks are larger than ALIGNMENT: it
    refuses with EINVAL on a file open with O_DIRECT; and the offsets it refused."""
    refused: list[int] = []

    def large_blocks(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return transfer(fd, data, offset)

    return large_blocks, refused


@pytest.mark.usefixtures("small_chunks")
def test_a_write_that_o_direct_refuses_goes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device whose blocks are larger than ALIGNMENT opens files with O_DIRECT and refuses the writes."""
    large_blocks, refused = _refusing_o_direct(os.pwrite)
    monkeypatch.setattr(direct_io.os, "pwrite", large_blocks)
    data = random.Random(1).randbytes(5 * _SMALL_CHUNK + 99)
    file = direct_io.create(tmp_path / "file")
    assert isinstance(file, direct_io.DirectFile)
    file.write(memoryview(data))
    file.close()
    assert refused
    assert (tmp_path / "file").read_bytes() == data


def _first_ends_last(transfer: Callable[[int, memoryview, int], Any]) -> tuple[Callable[..., Any], list[int]]:
    """`transfer(fd, buffer, offset)` (a chunk's disk write or read), the call at offset 0 held until a later one
    has ended; and the offsets, in the order their calls ended."""
    later_ended, ended = threading.Event(), []

    def first_ends_last(fd: int, buffer: memoryview, offset: int) -> Any:
        if offset == 0:
            assert later_ended.wait(timeout=30)
        result = transfer(fd, buffer, offset)
        ended.append(offset)
        if offset:
            later_ended.set()
        return result

    return first_ends_last, ended


@pytest.mark.usefixtures("small_chunks")
def test_writes_that_end_out_of_order_still_give_the_bytes_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_write_ends_last, ended = _first_ends_last(direct_io._write_all)
    monkeypatch.setattr(direct_io, "_write_all", first_write_ends_last)
    data = random.Random(0).randbytes(7 * _SMALL_CHUNK + 5)
    file = direct_io.create(tmp_path / "file")
    file.write(memoryview(data))
    file.close()
    assert ended.index(0) > 0  # a later buffer's write ended first
    assert (tmp_path / "file").read_bytes() == data


@pytest.mark.usefixtures("small_chunks")
def test_a_file_written_after_another_writes_from_the_buffers_the_first_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed file's write buffers are kept, up to KEPT_BYTES, for the files written next: memory a process
    touches for the first time costs a page fault per page. A buffer is never in two open files."""
    monkeypatch.setattr(direct_io, "_kept", [])
    monkeypatch.setattr(direct_io, "KEPT_BYTES", (direct_io.BUFFERS + 1) * len(direct_io._kept_buffer(direct_io.CHUNK)))
    contents = [random.Random(seed).randbytes(5 * _SMALL_CHUNK + 3) for seed in range(3)]
    first = direct_io.create(tmp_path / "0")
    assert isinstance(first, direct_io.DirectFile)
    left = {id(buffer) for buffer in first._buffers}
    first.write(memoryview(contents[0]))
    first.close()
    assert {id(buffer) for buffer in direct_io._kept} == left
    second, third = direct_io.create(tmp_path / "1"), direct_io.create(tmp_path / "2")
    assert isinstance(second, direct_io.DirectFile) and isinstance(third, direct_io.DirectFile)
    assert {id(buffer) for buffer in second._buffers} == left
    assert not {id(buffer) for buffer in third._buffers} & left  # new ones, while the second file holds those
    for file, data in zip((second, third), contents[1:], strict=True):
        file.write(memoryview(data))
    second.close()
    third.abandon()
    assert len(direct_io._kept) == direct_io.BUFFERS + 1
    assert [(tmp_path / name).read_bytes() for name in "01"] == contents[:2]


@pytest.mark.usefixtures("small_chunks")
def test_write_buffers_are_kept_only_once_no_write_uses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file abandoned while a write of it is still under way keeps its buffers for later files only once that
    write has ended."""
    monkeypatch.setattr(direct_io, "_kept", [])
    write_all, keep = direct_io._write_all, direct_io._keep
    under_way, released, kept_while = threading.Event(), threading.Event(), []

    def held_write(fd: int, data: memoryview, offset: int) -> None:
        under_way.set()
        assert released.wait(timeout=30)
        write_all(fd, data, offset)
        under_way.clear()

    def keeping(buffers: list[mmap.mmap]) -> None:
        kept_while.append(under_way.is_set())
        keep(buffers)

    monkeypatch.setattr(direct_io, "_write_all", held_write)
    monkeypatch.setattr(direct_io, "_keep", keeping)
    file = direct_io.create(tmp_path / "file")
    assert isinstance(file, direct_io.DirectFile)
    file.write(memoryview(bytes(_SMALL_CHUNK)))  # one full buffer: its write starts, and is held
    assert under_way.wait(timeout=30)
    threading.Timer(0.2, released.set).start()  # abandon, below, waits for the write
    file.abandon()
    assert kept_while == [False]
    assert len(direct_io._kept) == direct_io.BUFFERS


def _spans_of(size: int, seed: int) -> list[int]:
    """Lengths of consecutive runs of a file of `size` bytes, from 1 byte to several chunks: their ends fall inside
    blocks and on them, and the first span of a file begins some at a block's end."""
    rng, spans = random.Random(seed), []
    while sum(spans) < size:
        spans.append(min(size - sum(spans), rng.choice(_PIECES)))
    return spans


def _read_in_spans(file: direct_io.DirectReader | direct_io.CachedReader, spans: list[int]) -> list[bytes]:
    """Each span's bytes, as `next_span` gives them."""
    return [bytes(file.next_span()) for _ in spans]


def _cut(data: bytes, spans: list[int]) -> list[bytes]:
    ends = list(itertools.accumulate(spans, initial=0))
    return [data[start:end] for start, end in itertools.pairwise(ends)]


@pytest.fixture
def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads in chunks of two blocks, ahead by three buffers of spans up to a huge page: every buffer reused many
    times, in few bytes."""
    monkeypatch.setattr(direct_io, "CHUNK", _SMALL_CHUNK)
    monkeypatch.setattr(direct_io, "READ_AHEAD", 3 * direct_io._HUGE_PAGE)


@pytest.fixture
def direct_reads(tmp_path: Path, small_reads: None) -> None:
    """O_DIRECT in `tmp_path` (or the test is skipped), read in small chunks (`small_reads`)."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")


@pytest.mark.usefixtures("small_reads")
@pytest.mark.parametrize("size", _SIZES)
def test_a_file_read_a_span_at_a_time_gives_exactly_its_bytes(
    size: int, o_direct: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "file"
    path.write_bytes(data)
    direct_io.evict(path)
    evicted = cached_pages(path) == 0  # not on tmpfs, which accepts O_DIRECT from Linux 6.6 but keeps every page
    spans = _spans_of(size, seed=size)
    with direct_io.open_to_read(path, spans) as file:
        assert isinstance(file, direct_io.DirectReader if o_direct else direct_io.CachedReader)
        assert _read_in_spans(file, spans) == _cut(data, spans)
        assert not file.beyond()
        with pytest.raises(ValueError, match="every span has been read"):
            file.next_span()
    with pytest.raises(ValueError, match="closed"):
        file.next_span()
    if o_direct and evicted:
        assert cached_pages(path) == 0  # read from the disk into the reader's own memory only


@pytest.mark.usefixtures("small_reads")
@pytest.mark.parametrize("size", [1, direct_io.ALIGNMENT - 1, direct_io.ALIGNMENT, 3 * _SMALL_CHUNK])
def test_a_file_longer_or_shorter_than_its_spans_shows(size: int, o_direct: bool, tmp_path: Path) -> None:
    """One byte more than the spans hold shows in `beyond`, whether the spans end inside a block or at its end;
    one byte less shows as a short last span."""
    data = random.Random(size).randbytes(size + 1)
    (tmp_path / "longer").write_bytes(data)
    (tmp_path / "shorter").write_bytes(data[: size - 1])
    spans = [size // 2, size - size // 2] if size > 1 else [1]
    with direct_io.open_to_read(tmp_path / "longer", spans) as file:
        assert _read_in_spans(file, spans) == _cut(data[:size], spans)
        assert file.beyond()
    with direct_io.open_to_read(tmp_path / "shorter", spans) as file:
        assert _read_in_spans(file, spans) == _cut(data[: size - 1], spans)


def test_a_file_of_no_spans_is_empty_or_shows_a_byte_beyond(o_direct: bool, tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "one").write_bytes(b"x")
    for name, beyond in (("empty", False), ("one", True)):
        with direct_io.open_to_read(tmp_path / name, []) as file:
            assert file.beyond() is beyond


@pytest.mark.usefixtures("direct_reads")
def test_a_span_is_the_memory_the_disk_read_it_into_and_the_reader_holds_a_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`next_span` gives the reader's own buffer, not a copy; the reader has one buffer more than its reads ahead
    need (READ_AHEAD bytes, in buffers for whole spans), each as large as its largest span in whole huge pages,
    and reads no span into a buffer whose bytes the caller still has."""
    monkeypatch.setattr(direct_io, "_kept", [])
    spans = [3 * _SMALL_CHUNK + 5, _SMALL_CHUNK - 1, *[_SMALL_CHUNK + 17] * 6, 2 * _SMALL_CHUNK]
    data = random.Random(3).randbytes(sum(spans))
    (tmp_path / "file").write_bytes(data)
    read_chunk, held, into_held = direct_io._read_chunk, [None], []

    def recording(fd: int, buffer: memoryview, offset: int) -> int:
        into_held.append(buffer.obj is held[0])
        read = read_chunk(fd, buffer, offset)
        into_held.append(buffer.obj is held[0])
        return read

    monkeypatch.setattr(direct_io, "_read_chunk", recording)
    largest = direct_io._blocks(0, spans[0], last=False) + direct_io.ALIGNMENT
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert isinstance(file, direct_io.DirectReader)
        assert len(file._buffers) == 1 + -(-direct_io.READ_AHEAD // direct_io._in_huge_pages(largest)) == 4
        assert all(len(buffer) >= largest for buffer in file._buffers)
        for expected in _cut(data, spans):
            held[0] = None
            span = file.next_span()
            held[0] = span.obj
            assert span.obj in file._buffers and bytes(span) == expected
            time.sleep(0.01)  # reads started now would go on meanwhile
        assert not file.beyond()
    assert len(into_held) >= 2 * len(spans) and not any(into_held)


@pytest.mark.usefixtures("direct_reads")
def test_a_read_that_o_direct_refuses_goes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device whose blocks are larger than ALIGNMENT opens files with O_DIRECT and refuses the reads."""
    large_blocks, refused = _refusing_o_direct(os.preadv)
    monkeypatch.setattr(direct_io.os, "preadv", large_blocks)
    data = random.Random(1).randbytes(5 * _SMALL_CHUNK + 99)
    (tmp_path / "file").write_bytes(data)
    direct_io.evict(tmp_path / "file")
    spans = _spans_of(len(data), seed=1)
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert isinstance(file, direct_io.DirectReader)
        assert _read_in_spans(file, spans) == _cut(data, spans)
        assert not file.beyond()
    assert refused
    assert cached_pages(tmp_path / "file") > 0  # read through the page cache


@pytest.mark.usefixtures("direct_reads")
def test_a_short_read_inside_the_file_reads_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that ends inside a block before the file's end (a FUSE or network file system may return one)
    is followed by reads of the rest, through the page cache where O_DIRECT refuses an unaligned read."""
    preadv, short = os.preadv, []

    def short_reads(fd: int, buffers: list[memoryview], offset: int) -> int:
        read = preadv(fd, buffers, offset)
        if offset % direct_io.ALIGNMENT == 0 and read > direct_io.ALIGNMENT + 100:  # the first read of each chunk
            short.append(offset)
            return direct_io.ALIGNMENT + 100  # and the next read, at an unaligned offset, is one O_DIRECT refuses
        return read

    monkeypatch.setattr(direct_io.os, "preadv", short_reads)
    data = random.Random(2).randbytes(6 * _SMALL_CHUNK + 5)
    (tmp_path / "file").write_bytes(data)
    spans = [2 * _SMALL_CHUNK, 4 * _SMALL_CHUNK + 5]
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert _read_in_spans(file, spans) == _cut(data, spans)
        assert not file.beyond()
    assert len(short) >= 2


@pytest.mark.usefixtures("direct_reads")
def test_a_failed_disk_read_fails_the_read_and_close_leaves_no_descriptor_or_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_bytes(bytes(9 * _SMALL_CHUNK))
    preadv, lock, running = os.preadv, threading.Lock(), [0]

    def failing_third_chunk(fd: int, buffers: list[memoryview], offset: int) -> int:
        with lock:
            running[0] += 1
        try:
            time.sleep(0.001)
            if offset == 2 * _SMALL_CHUNK:  # that chunk only: the chunks after it read well
                raise OSError(errno.EIO, "Input/output error")
            return preadv(fd, buffers, offset)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(direct_io.os, "preadv", failing_third_chunk)
    file = direct_io.open_to_read(tmp_path / "file", [_SMALL_CHUNK] * 9)
    assert isinstance(file, direct_io.DirectReader)
    closed: list[int] = []
    close = os.close
    monkeypatch.setattr(direct_io.os, "close", lambda fd: (closed.append(fd), close(fd))[1])
    assert [len(file.next_span()) for _ in range(2)] == [_SMALL_CHUNK] * 2  # the spans before the failed one
    for call in (file.next_span, file.next_span, file.beyond):  # the bytes after it never come as the next ones
        with pytest.raises(OSError, match="Input/output error"):
            call()
    file.close()
    assert closed == [file.fd]
    assert running == [0]
    file.close()  # and again does nothing
    assert closed == [file.fd]


@pytest.mark.usefixtures("direct_reads")
def test_reads_that_end_out_of_order_still_give_the_bytes_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_read_ends_last, ended = _first_ends_last(direct_io._read_chunk)
    monkeypatch.setattr(direct_io, "_read_chunk", first_read_ends_last)
    data = random.Random(0).randbytes(7 * _SMALL_CHUNK + 5)
    (tmp_path / "file").write_bytes(data)
    spans = [3 * _SMALL_CHUNK, 4 * _SMALL_CHUNK + 5]
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert _read_in_spans(file, spans) == _cut(data, spans)
    assert ended.index(0) > 0  # a later chunk's read ended first


class _Refusing:
    """The process's reading threads, refusing the `refused`-th read asked of them (as a pool shut down at the
    interpreter's exit does), after `before` returns."""

    def __init__(self, refused: int, before: Callable[[], object] = lambda: None) -> None:
        self.pool, self.refused, self.before, self.asked = direct_io._reading_threads(), refused, before, 0

    def submit(self, *args: Any) -> Any:
        self.asked += 1
        if self.asked == self.refused:
            self.before()
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        return self.pool.submit(*args)


def test_a_reader_whose_reads_cannot_start_leaves_no_read_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the reader fails, and the reads already begun end before the file's descriptor is closed (whose
    number another file may take at once)."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "_kept", [])
    (tmp_path / "file").write_bytes(bytes(4 * direct_io.CHUNK))
    read_chunk, reads = direct_io._read_chunk, []
    started, closed = threading.Event(), []

    def slow_first_read(fd: int, buffer: memoryview, offset: int) -> int:
        started.set()
        time.sleep(0.5)  # still reading when the next read is refused
        read = read_chunk(fd, buffer, offset)
        reads.append((offset, closed[:]))
        return read

    refusing = _Refusing(2, lambda: started.wait(timeout=30))
    monkeypatch.setattr(direct_io, "_reading_threads", lambda: refusing)
    monkeypatch.setattr(direct_io, "_read_chunk", slow_first_read)
    close = os.close
    monkeypatch.setattr(direct_io.os, "close", lambda fd: (closed.append(fd), close(fd))[1])
    with pytest.raises(RuntimeError, match="cannot schedule new futures"):
        direct_io.open_to_read(tmp_path / "file", [direct_io.CHUNK] * 4)
    assert len(closed) == 1
    assert reads == [(0, [])]  # the read begun ended before the descriptor was closed
    assert len(direct_io._kept) == 4  # its buffers, one a span (fewer spans than READ_AHEAD holds), for the files after


def _new_reading_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: type[ThreadPoolExecutor] = ThreadPoolExecutor
) -> list[ThreadPoolExecutor]:
    """The pools of reading threads a process not yet reading starts (of `kind`), O_DIRECT in `tmp_path` (or the
    test is skipped)."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "_reading", direct_io._ReadingThreads())
    pools: list[ThreadPoolExecutor] = []

    def recorded(*args: Any, **kwargs: Any) -> ThreadPoolExecutor:
        pools.append(kind(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(direct_io, "ThreadPoolExecutor", recorded)
    return pools


def test_reading_threads_that_cannot_all_start_leave_none_and_are_started_again_at_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoThirdThread(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            if len(self._threads) == 2 and not self._idle_semaphore.acquire(timeout=0):  # a third is needed
                raise RuntimeError("can't start new thread")
            return super().submit(*args, **kwargs)

    pools = _new_reading_threads(tmp_path, monkeypatch, NoThirdThread)
    (tmp_path / "file").write_bytes(b"bytes")
    with pytest.raises(RuntimeError, match="can't start new thread"):
        direct_io.open_to_read(tmp_path / "file", [5])
    assert direct_io._reading.pool is None
    assert not [thread for thread in pools[0]._threads if thread.is_alive()]
    monkeypatch.setattr(direct_io, "ThreadPoolExecutor", ThreadPoolExecutor)
    with direct_io.open_to_read(tmp_path / "file", [5]) as file:
        assert bytes(file.next_span()) == b"bytes"


def test_every_read_begins_once_all_the_reading_threads_have_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's reading threads start at its first read, all at once, and its readers share them: no thread
    starts while a read (faulting in new memory) runs, and a second file starts none."""
    pools = _new_reading_threads(tmp_path, monkeypatch)
    read_chunk, seen = direct_io._read_chunk, []

    def counting(fd: int, buffer: memoryview, offset: int) -> int:
        seen.append(sum(len(pool._threads) for pool in pools))
        return read_chunk(fd, buffer, offset)

    monkeypatch.setattr(direct_io, "_read_chunk", counting)
    data = random.Random(8).randbytes(3 * direct_io.CHUNK + 5)
    for name in ("one", "two"):
        (tmp_path / name).write_bytes(data)
        spans = [direct_io.CHUNK] * 3 + [5]
        with direct_io.open_to_read(tmp_path / name, spans) as file:
            assert _read_in_spans(file, spans) == _cut(data, spans)
            assert not file.beyond()
    assert len(pools) == 1 and len(seen) > 4
    assert set(seen) == {direct_io.READ_THREADS}


def test_a_forked_child_reads_with_threads_of_its_own(tmp_path: Path) -> None:
    """The reading threads of the parent do not run in a child it forks: the child starts its own."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    data = random.Random(9).randbytes(3 * _SMALL_CHUNK)
    (tmp_path / "file").write_bytes(data)
    direct_io._reading_threads()  # started in the parent
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only when it read the file
        code = 1
        try:
            with direct_io.open_to_read(tmp_path / "file", [len(data)]) as file:
                code = 0 if bytes(file.next_span()) == data else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (ended := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended == (0, 0):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child's read never ended")
    assert os.waitstatus_to_exitcode(ended[1]) == 0


@pytest.mark.usefixtures("direct_reads")
def test_a_file_read_after_a_save_reads_into_its_buffers_and_leaves_them_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader takes the buffers closed files left where they are large enough, and new ones where they are
    not, and once closed leaves its own: a process that resumes writes its first checkpoint from the buffers its
    load read into."""
    monkeypatch.setattr(direct_io, "_kept", [])
    data = random.Random(0).randbytes(5 * _SMALL_CHUNK + 3)
    written = direct_io.create(tmp_path / "file")
    assert isinstance(written, direct_io.DirectFile)
    left = {id(buffer) for buffer in written._buffers}
    written.write(memoryview(data))
    written.close()
    spans = [_SMALL_CHUNK] * 5 + [3]
    with direct_io.open_to_read(tmp_path / "file", spans) as reader:
        assert isinstance(reader, direct_io.DirectReader)
        assert {id(buffer) for buffer in reader._buffers} <= left  # as large as these spans need
        assert _read_in_spans(reader, spans) == _cut(data, spans)
        assert not reader.beyond()  # done with the last span: its buffer is free again
    assert {id(buffer) for buffer in direct_io._kept} == left
    larger = random.Random(1).randbytes(max(map(len, direct_io._kept)) + 1)
    (tmp_path / "larger").write_bytes(larger)
    with direct_io.open_to_read(tmp_path / "larger", [len(larger)]) as reader:
        assert isinstance(reader, direct_io.DirectReader)
        read_into = {id(buffer) for buffer in reader._buffers}
        assert read_into and not read_into & left  # too small for its span: new ones
        assert _read_in_spans(reader, [len(larger)]) == [larger]
        assert not reader.beyond()
    assert {id(buffer) for buffer in direct_io._kept} == left | read_into
    after = direct_io.create(tmp_path / "next")
    assert isinstance(after, direct_io.DirectFile)
    assert {id(buffer) for buffer in after._buffers} == left  # the smallest that fit
    after.abandon()


@pytest.mark.usefixtures("direct_reads")
def test_kept_buffers_are_the_smallest_that_fit_and_hold_at_most_kept_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = direct_io.aligned_buffer(2 << 20), direct_io.aligned_buffer(4 << 20)
    monkeypatch.setattr(direct_io, "_kept", [large, small])
    monkeypatch.setattr(direct_io, "KEPT_BYTES", 6 << 20)
    assert direct_io._kept_buffer(1) is small
    assert direct_io._kept_buffer(1) is large
    new = direct_io._kept_buffer((4 << 20) + 1)  # none left: a new one, in whole huge pages
    assert len(new) == 6 << 20
    direct_io._keep([small, new, large])
    assert direct_io._kept == [small, large]  # the new one would take them past KEPT_BYTES


@pytest.mark.usefixtures("direct_reads")
def test_read_buffers_are_kept_only_once_no_read_uses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader closed while its reads are under way keeps its buffers for later files only once they ended."""
    monkeypatch.setattr(direct_io, "_kept", [])
    (tmp_path / "file").write_bytes(bytes(8 * _SMALL_CHUNK))
    read_chunk, keep = direct_io._read_chunk, direct_io._keep
    under_way, released, kept_while = threading.Event(), threading.Event(), []
    lock, reading = threading.Lock(), [0]

    def held_read(fd: int, buffer: memoryview, offset: int) -> int:
        with lock:
            reading[0] += 1
        under_way.set()
        assert released.wait(timeout=30)
        try:
            return read_chunk(fd, buffer, offset)
        finally:
            with lock:
                reading[0] -= 1

    def keeping(buffers: list[mmap.mmap]) -> None:
        kept_while.append(reading[0])
        keep(buffers)

    monkeypatch.setattr(direct_io, "_read_chunk", held_read)
    monkeypatch.setattr(direct_io, "_keep", keeping)
    reader = direct_io.open_to_read(tmp_path / "file", [_SMALL_CHUNK] * 8)
    assert isinstance(reader, direct_io.DirectReader)
    buffers = len(reader._buffers)
    assert under_way.wait(timeout=30)
    threading.Timer(0.2, released.set).start()  # close, below, waits for the reads under way
    reader.close()
    assert kept_while == [0]
    assert len(direct_io._kept) == buffers


def _mapping_of(buffer: mmap.mmap) -> tuple[str, set[str]]:
    """The permissions and the VmFlags of the mapping that holds `buffer`."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        header = block.split(maxsplit=2)
        low, high = (int(bound, 16) for bound in header[0].split("-"))
        if low <= address < high:
            flags = re.search(r"^VmFlags:(.*)$", block, re.M)
            return header[1], set(flags.group(1).split()) if flags else set()
    raise AssertionError("no mapping holds the buffer")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages on this platform")
def test_buffers_for_direct_io_are_private_memory_advised_for_huge_pages() -> None:
    """A 2 MiB page is one run of memory in a request to the disk, where 4 KiB pages cap a request at the device's
    max_segments pages. The buffers are private anonymous memory (a shared mapping is shmem, whose huge pages
    the kernel's shmem setting governs), advised for huge pages. (Whether the kernel then gives huge pages
    depends on its settings and free memory; docs/BENCHMARKS.md measures what they do.)"""
    buffer = direct_io.aligned_buffer(8 << 20)
    try:
        permissions, flags = _mapping_of(buffer)
        assert permissions == "rw-p" and "hg" in flags
    finally:
        buffer.close()


@pytest.mark.parametrize(
    "spans", [[1] * 400, [3 << 20, *[1] * 400, 5]], ids=["400 one-byte spans", "one of 3 MiB and 401 small"]
)
def test_a_reader_holds_read_ahead_bytes_and_one_buffer_more_however_many_its_spans(
    spans: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest may list many small segments: the reader's buffers are bounded in bytes, each being its largest
    span's in whole huge pages, not one a span."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "_kept", [])
    data = random.Random(4).randbytes(sum(spans))
    (tmp_path / "file").write_bytes(data)
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert isinstance(file, direct_io.DirectReader)
        sizes = [len(buffer) for buffer in file._buffers]
        assert sum(sizes) <= direct_io.READ_AHEAD + max(sizes), sizes
        assert _read_in_spans(file, spans) == _cut(data, spans)
        assert not file.beyond()


@pytest.mark.usefixtures("direct_reads")
def test_a_read_that_cannot_be_started_fails_every_later_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the reads of a later span cannot start (the interpreter exiting), the span being taken fails, and so does
    every call after it: no span comes in the place of another."""
    data = random.Random(5).randbytes(8 * _SMALL_CHUNK)
    (tmp_path / "file").write_bytes(data)
    spans = [_SMALL_CHUNK] * 8
    refusing = _Refusing(5)  # the reads ahead of the second span taken
    monkeypatch.setattr(direct_io, "_reading_threads", lambda: refusing)
    with direct_io.open_to_read(tmp_path / "file", spans) as file:
        assert isinstance(file, direct_io.DirectReader)
        assert len(file._buffers) == 4
        assert bytes(file.next_span()) == data[:_SMALL_CHUNK]
        for call in (file.next_span, file.next_span, file.beyond):
            with pytest.raises(RuntimeError, match="cannot schedule new futures"):
                call()


@pytest.mark.usefixtures("direct_reads")
def test_a_span_comes_once_every_read_into_its_buffer_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span read in several reads, the first of them short (the file ends in it): the span comes only once the
    others have ended too, so that no read is still writing into the memory the caller has."""
    data = random.Random(6).randbytes(_SMALL_CHUNK // 2)
    (tmp_path / "file").write_bytes(data)
    read_chunk, events, taken = direct_io._read_chunk, [], threading.Event()

    def later_read_ends_late(fd: int, buffer: memoryview, offset: int) -> int:
        if offset:  # the span's second read, past the file's end
            taken.wait(timeout=1)
            events.append("second read ended")
        return read_chunk(fd, buffer, offset)

    monkeypatch.setattr(direct_io, "_read_chunk", later_read_ends_late)
    with direct_io.open_to_read(tmp_path / "file", [2 * _SMALL_CHUNK]) as file:
        span = file.next_span()
        events.append("span taken")
        taken.set()
        assert bytes(span) == data
    assert "second read ended" in events and events[-1] == "span taken", events


@pytest.mark.usefixtures("direct_reads")
def test_a_reader_that_cannot_take_all_its_buffers_leaves_those_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_bytes(bytes(8 * _SMALL_CHUNK))
    kept = [direct_io.aligned_buffer(2 << 20) for _ in range(2)]
    monkeypatch.setattr(direct_io, "_kept", list(kept))

    def no_memory(size: int) -> mmap.mmap:
        raise MemoryError

    monkeypatch.setattr(direct_io, "aligned_buffer", no_memory)  # a third buffer would be new memory
    with pytest.raises(MemoryError):
        direct_io.open_to_read(tmp_path / "file", [_SMALL_CHUNK] * 8)
    assert sorted(map(id, direct_io._kept)) == sorted(map(id, kept))


@pytest.mark.usefixtures("direct_reads")
def test_a_span_the_caller_has_when_the_reader_closes_is_not_kept_for_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader closed before its last span was done with (a load that failed half-way) keeps its other buffers
    for later files, and not the one whose bytes the caller may still hold: a later file would read into them."""
    monkeypatch.setattr(direct_io, "_kept", [])
    data = random.Random(7).randbytes(8 * _SMALL_CHUNK)
    (tmp_path / "file").write_bytes(data)
    with direct_io.open_to_read(tmp_path / "file", [_SMALL_CHUNK] * 8) as file:
        assert isinstance(file, direct_io.DirectReader)
        buffers = list(file._buffers)
        file.next_span()
        span = file.next_span()
    assert span.obj not in direct_io._kept
    assert sorted(map(id, direct_io._kept)) == sorted(id(buffer) for buffer in buffers if buffer is not span.obj)
    assert bytes(span) == data[_SMALL_CHUNK : 2 * _SMALL_CHUNK]


def test_a_reader_closes_without_waiting_for_reads_of_other_files_queued_before_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's reads not yet begun are cancelled at its close, which then waits only for those under way: not
    for the reads of another file ahead of them on the process's threads."""
    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "READ_THREADS", 1)
    monkeypatch.setattr(direct_io, "_reading", direct_io._ReadingThreads())
    for name in ("first", "second"):
        (tmp_path / name).write_bytes(bytes(2 * direct_io.ALIGNMENT))
    read_chunk, begun, release = direct_io._read_chunk, threading.Event(), threading.Event()

    def held(fd: int, buffer: memoryview, offset: int) -> int:
        begun.set()
        assert release.wait(timeout=30)
        return read_chunk(fd, buffer, offset)

    monkeypatch.setattr(direct_io, "_read_chunk", held)
    first = direct_io.open_to_read(tmp_path / "first", [2 * direct_io.ALIGNMENT])
    assert begun.wait(timeout=30)  # the one thread is in the first file's read
    second = direct_io.open_to_read(tmp_path / "second", [2 * direct_io.ALIGNMENT])
    closing = threading.Thread(target=second.close)
    closing.start()
    try:
        closing.join(timeout=5)
        assert not closing.is_alive()
    finally:
        release.set()
        closing.join()
        first.close()


@pytest.mark.usefixtures("direct_reads")
def test_a_reader_takes_no_kept_buffer_larger_than_a_new_one_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its buffers stay within READ_AHEAD and one buffer more, and a larger kept buffer is left for a file whose
    spans need it."""
    larger = direct_io.aligned_buffer(2 * direct_io._HUGE_PAGE)
    monkeypatch.setattr(direct_io, "_kept", [larger])
    (tmp_path / "file").write_bytes(bytes(8 * _SMALL_CHUNK))
    with direct_io.open_to_read(tmp_path / "file", [_SMALL_CHUNK] * 8) as file:
        assert isinstance(file, direct_io.DirectReader)
        assert larger not in file._buffers
        assert all(len(buffer) == direct_io._HUGE_PAGE for buffer in file._buffers)
    assert larger in direct_io._kept


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start, end = (int(bound, 16) for bound in line.split()[0].split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not _THP.exists() or "[never]" in _THP.read_text(), reason="the kernel offers no huge pages")
def test_new_memory_advised_to_huge_pages_is_only_the_whole_pages_asked_for() -> None:
    memory = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    try:
        assert "hg" not in _vm_flags(address + (4 << 20))
        direct_io.advise_huge_pages(address + 100, 6 << 20)  # a tensor's storage need not start on a page
        assert "hg" in _vm_flags(address + (4 << 20))
        assert "hg" not in _vm_flags(address)  # the page it starts in is not all its own
        direct_io.advise_huge_pages(address + (7 << 20), 1 << 20)  # under one huge page: nothing to gain
        assert "hg" not in _vm_flags(address + (7 << 20) + 8192)
    finally:
        memory.close()

"""Each handler's environment variables and standard output, visible to its own thread only.

In Lambda every function has a process of its own; here all of them share this one, and moto's
threads (the state machine's, the local training runner's) read os.environ while a handler runs:
botocore iterates it for proxy settings on every request. Setting a handler's variables in the
process environment and removing them afterwards lets such an iteration find a key gone between
listing and reading it (KeyError). So os.environ becomes a view: the process environment, plus the
variables of the handler that runs on the reading thread. The handlers never change the process
environment; what else does (a CLI runner in the tests) cannot break a reading in progress, since
listings read one snapshot.

Standard output is a handler's log in Lambda (Powertools writes its log lines and its embedded
metrics there). Where the local platform keeps handler logs apart (`make demo` writes them to a
file), sys.stdout becomes a view too: the handler's thread writes to that file, every other thread
(the demo's own progress lines) to the terminal.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_EnvironBase: Any = type(os.environ)


class _HandlerEnviron(_EnvironBase):  # type: ignore[misc]
    """os.environ (the same storage, so os.putenv stays in step) with a per-thread overlay."""

    def __init__(self, process: Any) -> None:
        super().__init__(process._data, process.encodekey, process.decodekey, process.encodevalue, process.decodevalue)
        self._threads = threading.local()

    def _overlay(self) -> dict[str, str] | None:
        overlay: dict[str, str] | None = getattr(self._threads, "values", None)
        return overlay

    def __getitem__(self, key: str) -> str:
        overlay = self._overlay()
        if overlay is not None and key in overlay:
            return overlay[key]
        value: str = super().__getitem__(key)
        return value

    def __setitem__(self, key: str, value: str) -> None:
        overlay = self._overlay()
        if overlay is not None:  # a handler's own change stays with the handler, as in its own process
            overlay[key] = value
        else:
            super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        overlay = self._overlay()
        if overlay is not None and key in overlay:
            del overlay[key]
        else:
            super().__delitem__(key)

    def _snapshot(self) -> dict[str, str]:
        """The variables this thread sees, read at once: another thread (a CLI runner under test) may add and
        remove process variables meanwhile, and listing the keys, then reading each, would find one gone."""
        process = self._data.copy()  # one atomic copy of the process environment
        overlay = self._overlay() or {}
        return {**overlay, **{self.decodekey(k): self.decodevalue(v) for k, v in process.items() if k not in overlay}}

    def __iter__(self) -> Iterator[str]:
        return iter(self._snapshot())

    def __len__(self) -> int:
        return len(self._snapshot())

    def keys(self) -> Any:
        return self._snapshot().keys()

    def items(self) -> Any:
        return self._snapshot().items()

    def values(self) -> Any:
        return self._snapshot().values()

    def copy(self) -> dict[str, str]:
        return self._snapshot()

    @contextlib.contextmanager
    def overlaid(self, values: dict[str, str]) -> Iterator[None]:
        previous = self._overlay()
        self._threads.values = dict(values)
        try:
            yield
        finally:
            self._threads.values = previous


def _installed() -> _HandlerEnviron:
    if not isinstance(os.environ, _HandlerEnviron):
        os.environ = _HandlerEnviron(os.environ)  # noqa: B003 (same storage; os.getenv reads this name)
    return os.environ


@contextlib.contextmanager
def handler_environment(values: dict[str, str]) -> Iterator[None]:
    """While inside, this thread reads `values` over the process environment; no other thread does."""
    with _installed().overlaid(values):
        yield


class _HandlerStdout(io.TextIOBase):
    """sys.stdout, except on a thread that runs a handler whose output goes elsewhere."""

    def __init__(self, process: TextIO) -> None:
        self.process = process
        self._threads = threading.local()

    def target(self) -> TextIO:
        stream: TextIO | None = getattr(self._threads, "stream", None)
        return stream if stream is not None else self.process

    def write(self, text: str) -> int:
        return self.target().write(text)

    def flush(self) -> None:
        self.target().flush()

    @contextlib.contextmanager
    def redirected(self, stream: TextIO) -> Iterator[None]:
        previous = getattr(self._threads, "stream", None)
        self._threads.stream = stream
        try:
            yield
        finally:
            self._threads.stream = previous


@contextlib.contextmanager
def handler_stdout(stream: TextIO | None) -> Iterator[None]:
    """While inside, this thread's writes to sys.stdout go to `stream` (None: where they went before)."""
    if stream is None:
        yield
        return
    if not isinstance(sys.stdout, _HandlerStdout):
        sys.stdout = _HandlerStdout(sys.stdout)
    with sys.stdout.redirected(stream):
        yield

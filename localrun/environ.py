"""Each handler's environment variables, visible to its own thread only.

In Lambda every function has a process of its own; here all of them share this one, and moto's
threads (the state machine's, the local training runner's) read os.environ while a handler runs:
botocore iterates it for proxy settings on every request. Setting a handler's variables in the
process environment and removing them afterwards lets such an iteration find a key gone between
listing and reading it (KeyError). So os.environ becomes a view: the process environment, plus the
variables of the handler that runs on the reading thread. The process environment never changes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

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

    def __iter__(self) -> Iterator[str]:
        overlay = self._overlay() or {}
        yield from overlay
        yield from (key for key in super().__iter__() if key not in overlay)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def copy(self) -> dict[str, str]:
        return dict(self)

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

"""A local host's processes as one tree: frozen and killed together, as losing the instance would.

A host's launcher starts torchrun in a session of its own, and torchrun its workers in theirs
(training/launcher.py), so signalling the launcher's process group leaves them running. The
tree is found from /proc's parent links; stopped processes cannot fork, so freezing the tree
first and re-reading it until nothing new appears catches a process started meanwhile. A process
whose parent has exited leaves the tree (init adopts it) but not the host: `end` also finds every
process whose OPT_ML_ROOT lies under the host's (or job's) directory, as a container's end takes
every process in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from contract.layout import OPT_ML_ROOT_ENV
from training.launcher import parent_pids, proc_stat


def tree(pid: int) -> list[int]:
    """`pid` and every process descended from it, parents before children."""
    children: dict[int, list[int]] = {}
    for child, parent in parent_pids().items():
        children.setdefault(parent, []).append(child)
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def under(root: Path) -> list[int]:
    """Processes whose OPT_ML_ROOT is `root` or lies under it: a local host's (or job's), orphans included."""
    marker = f"{OPT_ML_ROOT_ENV}={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v == marker or v.startswith(marker + b"/") for v in environ):
            found.append(int(entry.name))
    return found


def _freeze(members: Callable[[], list[int]]) -> list[int]:
    frozen: list[int] = []
    while True:
        new = [p for p in members() if p not in frozen]
        if not new:
            return frozen
        for p in new:
            _send(p, signal.SIGSTOP)
        frozen += new


def freeze(pid: int) -> list[int]:
    """SIGSTOP `pid`'s whole tree, including what it starts meanwhile; the frozen pids."""
    return _freeze(lambda: tree(pid))


def kill(pid: int) -> None:
    """SIGKILL `pid` and every process descended from it, as a host's loss ends its container."""
    for p in freeze(pid):
        _send(p, signal.SIGKILL)


def _host_members(launchers: Sequence[subprocess.Popen[bytes]], root: Path) -> Callable[[], list[int]]:
    """A host's (or a job's) processes: its live launchers' trees and whatever else runs under `root`.

    A launcher that has exited is not counted (its pid may be another process's by now).
    """

    def members() -> list[int]:
        found = [p for launcher in launchers if launcher.poll() is None for p in tree(launcher.pid)]
        return found + [p for p in under(root) if p not in found]

    return members


def end(launchers: Sequence[subprocess.Popen[bytes]], root: Path) -> None:
    """SIGKILL a host's (or a job's) processes, as its container's end takes every process in it."""
    for p in _freeze(_host_members(launchers, root)):
        _send(p, signal.SIGKILL)


def state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T: stopped, Z: exited, unreaped), or None once it is gone."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def _start_time(pid: int) -> str | None:
    """When the process started (its stat's starttime): with its pid, it names one process, pid reuse or not."""
    fields = proc_stat(pid)
    return fields[19] if len(fields) > 19 else None


def identify(pids: Sequence[int]) -> dict[int, str | None]:
    """The processes behind `pids`, for `resume`."""
    return {p: _start_time(p) for p in pids}


def pause(launchers: Sequence[subprocess.Popen[bytes]], root: Path) -> dict[int, str | None]:
    """SIGSTOP a host's (or a job's) processes, as `end` finds them; what was frozen, for `resume`."""
    return identify(_freeze(_host_members(launchers, root)))


def resume(frozen: Mapping[int, str | None]) -> None:
    """SIGCONT what `pause` (or `freeze`, then `identify`) stopped: a process killed since, its pid reused, is not."""
    for p, started in frozen.items():
        if started is not None and _start_time(p) == started:
            _send(p, signal.SIGCONT)

"""A local host's processes as one tree: frozen and killed together, as losing the instance would.

A host's launcher starts torchrun in a session of its own, and torchrun its workers in theirs
(training/launcher.py), so signalling the launcher's process group leaves them running. The
tree is found from /proc's parent links; stopped processes cannot fork, so freezing the tree
first and re-reading it until nothing new appears catches a process started meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal

from training.launcher import parent_pids


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


def freeze(pid: int) -> list[int]:
    """SIGSTOP `pid`'s whole tree, including what it starts meanwhile; the frozen pids."""
    frozen: list[int] = []
    while True:
        new = [p for p in tree(pid) if p not in frozen]
        if not new:
            return frozen
        for p in new:
            _send(p, signal.SIGSTOP)
        frozen += new


def kill(pid: int) -> None:
    """SIGKILL `pid` and every process descended from it, as a host's loss ends its container."""
    for p in freeze(pid):
        _send(p, signal.SIGKILL)

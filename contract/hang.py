"""Hang detection: a host whose training workers finish no step for the hang limit is stopped.

Every training worker reports its progress in a file of its own under the directory the launcher names
in TRAINING_HEARTBEAT_DIR: the last step it finished, written when its training loop starts and after
each step: one `pwrite` of a fixed-width record over the last, a few microseconds (a temp file and
`os.replace` took a millisecond on a loaded VM's disk); no collective, nothing shared between ranks. The
record holds the step twice, so that a read the write tore shows two different numbers and is skipped
(a torn record mixes a prefix of the new bytes with the rest of the old). One file per rank rather than
local rank 0's alone, because no rank then has to know which is its host's first (mpirun places the
ranks itself) and any live rank's report counts.

The launcher (`training.hang.HangWatch`) reads them about once a second and takes the newest step any of its workers
finished as the host's progress (under DDP and FSDP no rank gets more than a step ahead of the others).
The hang limit is `hang.minutes` when set; else `hang.factor` times the longest interval seen so far
between two advances of that step, which holds every checkpoint save and evaluation so far, and at
least `hang.floor_minutes`. Before the workers report their loop started (the pre-flight check, the
checkpoint load) nothing is judged; the first step is judged against the floor; after the last step
(the final evaluation and the export) nothing is judged either. Every host's launcher judges its own
workers; the first to find the hang kills its workers, which ends the collectives the other hosts'
workers wait in: workers that then fail after no step for about the limit hung too (`stalled`), and
their host's failure names the hang rather than the lost connection.

Torch-free and stdlib only: the workers write, the launcher reads, and the handlers read how long a hang
held a job (`hung_seconds`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.layout import HANG_DETECTED, HEARTBEAT_ENV

_SUFFIX = ".step"
_HUNG = re.compile(rf"\b{HANG_DETECTED}: no training step (?:and no output )?for (\d+) s\b")


def hung_seconds(reason: str) -> float:
    """How long a job's failure reason says its training made no step before the hang check stopped it (0: none)."""
    match = _HUNG.search(reason)
    return float(match.group(1)) if match else 0.0


class StepReport:
    """A worker's side: the last step it finished, in its own file for the launcher's hang check."""

    def __init__(self, path: Path | None) -> None:
        """`path`: this rank's file; None reports nothing (no launcher watches: a local run, `hang.action=off`)."""
        self.path = path
        # Open for the worker's life: each report is then a single system call.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if path is not None else None

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> StepReport:
        directory = env.get(HEARTBEAT_ENV, "").strip()
        if not directory:
            return cls(None)
        # Under mpirun the ranks on the other hosts have no launcher watching this directory: harmless.
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(Path(directory) / f"rank-{rank}{_SUFFIX}")

    def __call__(self, step: int) -> None:
        """Report `step` as finished (at the loop's start: the step training resumes from)."""
        if self._fd is not None:
            os.pwrite(self._fd, f"{step:020d} {step:020d}\n".encode(), 0)


def newest_step(directory: Path) -> int | None:
    """The newest step any worker reported in `directory`; None until some worker's training loop started."""
    steps = []
    for path in directory.glob(f"*{_SUFFIX}"):
        try:
            first, second = path.read_text().split()
        except (OSError, ValueError):
            continue  # not written yet
        if first == second:
            steps.append(int(first))  # else torn by the write: the next poll reads it
    return max(steps, default=None)


@dataclass(frozen=True)
class Hang:
    """No step finished on `host` for `seconds` after `step` (`silent`: no output either, from a script that
    reports no steps: its `step` counts its output lines)."""

    seconds: float
    step: int
    host: str
    limit: float
    silent: bool = False

    def line(self) -> str:
        """The failure file's first line."""
        if self.silent:
            return (
                f"{HANG_DETECTED}: no training step and no output for {self.seconds:.0f} s after output line "
                f"{self.step} on {self.host}"
            )
        return f"{HANG_DETECTED}: no training step for {self.seconds:.0f} s after step {self.step} on {self.host}"

    def describe(self) -> str:
        return f"{self.line()} (the hang limit is {self.limit:.0f} s, see hang.* in training/README.md)"

"""This process's side of the SDK (training/sdk): its rank, its step report, its phases and its progress record."""

from __future__ import annotations

import atexit
import logging
import os
import time
from pathlib import Path
from typing import Any

from contract import distributions, goodput, metrics
from contract.hang import StepReport
from contract.layout import CHECKPOINT_DIR_ENV
from training.signals import StopRequest

log = logging.getLogger("training.sdk")
DEFAULT_CHECKPOINT_DIR = "/opt/ml/checkpoints"


def rank() -> int:
    """This process's global rank (torchrun's RANK, mpirun's OMPI_COMM_WORLD_RANK; 0 alone)."""
    return distributions.global_rank(os.environ)


def checkpoint_dir() -> Path:
    """The checkpoint folder the platform syncs to the run's checkpoints (/opt/ml/checkpoints)."""
    return Path(os.environ.get(CHECKPOINT_DIR_ENV) or DEFAULT_CHECKPOINT_DIR)


class Run:
    """This process's side of the SDK, made at its first call: the step report, the phases, the progress record."""

    def __init__(self) -> None:
        self.rank = rank()
        self.report = StepReport.from_env(os.environ, self.rank)
        self.clock = metrics.PhaseClock(goodput.launched(os.environ, time.monotonic()))
        self.progress: goodput.ProgressWriter | None = None
        self.step = 0
        self.stepping = False
        """Whether a step was reported: the clock left start-up (and a resume's checkpoint load) for steps."""
        self.rework_until = 0
        self.stop: StopRequest | None = None
        self.stop_group: Any = None
        if self.rank == 0:
            self.progress = goodput.ProgressWriter(
                checkpoint_dir(), job=goodput.job_name(os.environ), started=self.clock.started, first_step=0
            )
            atexit.register(self.write_progress)

    def resumed(self, step: int) -> None:
        """The script resumed at `step`: steps up to the furthest an earlier start reached are rework."""
        self.step = step
        if self.progress is not None:
            self.progress.record.first_step = self.progress.record.step = step
            records = goodput.local_records(checkpoint_dir())
            self.rework_until = goodput.furthest_step(records, besides=self.progress.path)

    def write_progress(self, *, due_only: bool = False) -> None:
        if self.progress is None:
            return
        try:
            self.progress.write(self.step, self.clock.totals(), due_only=due_only)
        except OSError as exc:  # accounting only: never fails the script
            log.warning("progress record %s not written: %s", self.progress.path, exc)

    def phases_line(self) -> None:
        if self.rank == 0:
            print(metrics.format_phases_line(step=self.step, seconds=self.clock.totals()), flush=True)
        self.write_progress()


_RUN: list[Run] = []  # this process's one Run, once made


def current() -> Run:
    if not _RUN:
        _RUN.append(Run())
    return _RUN[0]

"""The launcher's hang check: judges its host's step progress against the hang limit (contract/hang.py has the
workers' step reports it reads, and the rules it applies). A run's own script that reports no steps is judged by
its output instead: its lines are its progress, and a host whose script prints nothing for the limit hangs, as
HyperPod's log rules judge a job."""

from __future__ import annotations

from pathlib import Path

from contract.hang import Hang, newest_step

POLL_SECONDS = 1.0
"""How often the launcher reads the workers' reports."""


class HangWatch:
    """Judges a host's step progress against the hang limit, on the launcher's monotonic clock."""

    def __init__(
        self,
        directory: Path | None,
        *,
        host: str,
        last_step: int,
        fixed_seconds: float,
        floor_seconds: float,
        factor: float,
    ) -> None:
        """`directory`: the workers' step reports (None: the progress is the output lines `check` is given);
        `last_step`: train.max_steps, after which nothing is judged; `fixed_seconds`: 0 derives the limit."""
        self.directory, self.host, self.last_step = directory, host, last_step
        self.fixed, self.floor, self.factor = fixed_seconds, floor_seconds, factor
        self.longest = 0.0
        """The longest interval seen between two advances of the host's step (the loop's start counts)."""
        self._step: int | None = None
        self._since = 0.0
        self._polled: float | None = None

    @property
    def limit(self) -> float:
        """Seconds without a step after which the host hangs."""
        return self.fixed or max(self.floor, self.factor * self.longest)

    def check(self, now: float, output_lines: int = 0) -> Hang | None:
        """Read the workers' reports (at most every POLL_SECONDS) and judge them; without a directory, judge the
        count of the workers' `output_lines` so far."""
        if self._polled is not None and now - self._polled < POLL_SECONDS:
            return None
        self._polled = now
        return self.observe(newest_step(self.directory) if self.directory is not None else output_lines, now)

    def stalled(self, now: float, output_lines: int = 0) -> Hang | None:
        """Whether the host hung when its workers failed on their own at `now`: no step for the limit, give or
        take the jitter between two launchers' polls. A peer host's launcher that found the same hang first
        and killed its workers ended the collectives these workers waited in."""
        self._polled = None
        self.check(now, output_lines)  # a step finished since the last poll counts
        if self._step is None or self._step >= self.last_step:
            return None
        # Two hosts see the same step up to a poll apart; a derived limit multiplies that by the factor.
        slack = POLL_SECONDS * (2 + (0 if self.fixed else self.factor))
        idle = now - self._since
        return self._hang(idle) if idle >= self.limit - slack else None

    def _hang(self, idle: float) -> Hang:
        assert self._step is not None
        return Hang(idle, self._step, self.host, self.limit, silent=self.directory is None)

    def observe(self, step: int | None, now: float) -> Hang | None:
        """Judge the host's newest reported `step` (None: training has not started) at `now`."""
        if step is None:
            return None
        if self._step is None or step > self._step:
            if self._step is not None:
                self.longest = max(self.longest, now - self._since)
            self._step, self._since = step, now
            return None
        if step >= self.last_step:
            return None
        idle = now - self._since
        return self._hang(idle) if idle > self.limit else None


class ScriptWatch:
    """A run's own script: judged by its step reports once it sends any (the SDK's `report_step`), by its output
    until then."""

    def __init__(self, steps: HangWatch, output: HangWatch) -> None:
        assert steps.directory is not None and output.directory is None
        self.steps, self.output, self.directory = steps, output, steps.directory
        self.reporting = False
        self._looked = -POLL_SECONDS

    def _reporting(self, now: float) -> bool:
        if not self.reporting and now - self._looked >= POLL_SECONDS:
            self._looked = now
            self.reporting = newest_step(self.directory) is not None
        return self.reporting

    def check(self, now: float, output_lines: int = 0) -> Hang | None:
        if self._reporting(now):
            return self.steps.check(now)
        return self.output.check(now, output_lines)

    def stalled(self, now: float, output_lines: int = 0) -> Hang | None:
        self._looked = -POLL_SECONDS
        if self._reporting(now):
            return self.steps.stalled(now)
        return self.output.stalled(now, output_lines)

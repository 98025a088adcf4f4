"""The launcher's hang check: judges its host's step progress against the hang limit (contract/hang.py has the
workers' step reports it reads, and the rules it applies)."""

from __future__ import annotations

from pathlib import Path

from contract.hang import Hang, newest_step

POLL_SECONDS = 1.0
"""How often the launcher reads the workers' reports."""


class HangWatch:
    """Judges a host's step progress against the hang limit, on the launcher's monotonic clock."""

    def __init__(
        self,
        directory: Path,
        *,
        host: str,
        last_step: int,
        fixed_seconds: float,
        floor_seconds: float,
        factor: float,
    ) -> None:
        """`last_step`: train.max_steps, after which nothing is judged; `fixed_seconds`: 0 derives the limit."""
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

    def check(self, now: float) -> Hang | None:
        """Read the workers' reports (at most every POLL_SECONDS) and judge them."""
        if self._polled is not None and now - self._polled < POLL_SECONDS:
            return None
        self._polled = now
        return self.observe(newest_step(self.directory), now)

    def stalled(self, now: float) -> Hang | None:
        """Whether the host hung when its workers failed on their own at `now`: no step for the limit, give or
        take the jitter between two launchers' polls. A peer host's launcher that found the same hang first
        and killed its workers ended the collectives these workers waited in."""
        self._polled = None
        self.check(now)  # a step finished since the last poll counts
        if self._step is None or self._step >= self.last_step:
            return None
        # Two hosts see the same step up to a poll apart; a derived limit multiplies that by the factor.
        slack = POLL_SECONDS * (2 + (0 if self.fixed else self.factor))
        idle = now - self._since
        return Hang(idle, self._step, self.host, self.limit) if idle >= self.limit - slack else None

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
        return Hang(idle, self._step, self.host, self.limit) if idle > self.limit else None

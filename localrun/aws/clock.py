"""The local platform's time: how engine waits map to wall time, and the time events carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass
class Clock:
    """How engine time maps to wall time.

    wait_scale: Wait states sleep `seconds * wait_scale` (0: not at all).
    retry_scale: Retry intervals likewise.
    approval_timeout_scale: `.waitForTaskToken` timeouts are multiplied by this (human approvals
    time out in hours; a test can make that seconds without changing the definition).
    ahead: how far the time of events (schedules, S3 objects) is ahead of wall time; `advance` moves it.
    """

    wait_scale: float = 0.0
    retry_scale: float = 0.0
    approval_timeout_scale: float = 1.0
    waits: list[float] = field(default_factory=list)
    retries: list[float] = field(default_factory=list)
    ahead: timedelta = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.ahead

    def advance(self, by: timedelta) -> None:
        """Let time pass for events (a quiet period, a schedule) without sleeping."""
        self.ahead += by

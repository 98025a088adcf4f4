"""How often a run is polled: often enough to notice, seldom enough for one execution's history.

Step Functions ends an execution at 25,000 history events. A run polls its job until it ends:
each poll adds EVENTS_PER_POLL events, everything else in a run (validation, both approval gates,
every retry's notification and creation, evaluation, registration) at most RUN_EVENTS. Both figures are
measured by executing the state machine (tests/pipeline/test_orchestration.py), and Validate
stretches a run's poll interval so that its longest possible loop fits with a margin.
"""

from __future__ import annotations

import math

HISTORY_LIMIT = 25_000
# Wait (entered, exited) + "Check progress" Lambda task (entered, scheduled, started, succeeded,
# exited) + "Job finished?" Choice (entered, exited).
EVENTS_PER_POLL = 9
# Everything but the polls, for a run with both gates and every retry on fresh instances taken.
RUN_EVENTS = 800
# Use at most this share of the limit.
MARGIN = 0.8
# SageMaker's provisioning and start-up before training counts toward no stopping condition.
STARTUP_ALLOWANCE_SECONDS = 3600


def poll_budget() -> int:
    """Polls one execution can afford."""
    return int((HISTORY_LIMIT * MARGIN - RUN_EVENTS) // EVENTS_PER_POLL)


def poll_seconds(*, floor_seconds: int, attempt_seconds: int, attempts: int) -> int:
    """The poll interval: the platform's, or longer when `attempts` jobs of up to `attempt_seconds` need it."""
    longest = attempts * (attempt_seconds + STARTUP_ALLOWANCE_SECONDS)
    return max(floor_seconds, math.ceil(longest / poll_budget()))

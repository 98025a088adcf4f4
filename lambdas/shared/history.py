"""How often a run is polled: often enough to notice, seldom enough for one execution's history.

Step Functions ends an execution at 25,000 history events. A run polls its job until it ends:
each poll adds EVENTS_PER_POLL events, everything else in a run (validation, both approval gates,
every retry's notification and creation, evaluation, registration) at most RUN_EVENTS. Both figures are
measured by executing the state machine (tests/pipeline/test_orchestration.py). One execution makes at most
`poll_budget()` polls (settings `pipeline.polls_per_execution`, at most that); the poll that makes them hands the
run over to a new execution, which follows the same job (lambdas/jobs/pacing.py, stacks/pipeline/polled_job.py).
However long a run is, its job is therefore polled at the platform's interval: no execution's history limits it.
A job that waits in a queue for capacity is polled less often the longer it waits (`waiting_poll_seconds`): a day's
wait costs dozens of polls, not hundreds.
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
# A job waiting for capacity is looked at again after this share of the time it has waited so far...
WAITING_POLL_FRACTION = 0.25
# ...but at least once an hour.
WAITING_POLL_CAP_SECONDS = 3600


def poll_budget() -> int:
    """Polls one execution can afford: the most settings `pipeline.polls_per_execution` may allow."""
    return int((HISTORY_LIMIT * MARGIN - RUN_EVENTS) // EVENTS_PER_POLL)


def waiting_poll_seconds(*, floor_seconds: int, waited_seconds: float, left_seconds: float | None) -> int:
    """The poll interval while a job waits for capacity: a share of what it has waited, between the training
    interval and an hour, and no later than just after its allowed wait (`left_seconds`) runs out."""
    interval = min(WAITING_POLL_CAP_SECONDS, max(floor_seconds, waited_seconds * WAITING_POLL_FRACTION))
    if left_seconds is not None:
        interval = min(interval, max(1.0, left_seconds + 1))
    return math.ceil(interval)

"""How long a run's state machine waits before its next poll: the request's interval while a job trains, longer
the longer a job has waited for capacity (lambdas/shared/history.py). Every progress handler passes its answer
through `paced`; the state machine's Wait reads `poll_seconds` (stacks/pipeline/polled_job.py)."""

from __future__ import annotations

from contract.execution_state import JobProgress, Poll
from lambdas.shared import history


def paced(summary: JobProgress, poll: Poll) -> JobProgress:
    """`summary` with the next poll's wait."""
    wait = poll.request.poll_seconds
    if summary.queued_seconds is not None and not summary.finished:
        limit = poll.request.max_queue_wait_seconds
        wait = history.waiting_poll_seconds(
            floor_seconds=wait,
            waited_seconds=summary.queued_seconds,
            left_seconds=None if limit is None else limit - summary.queued_seconds,
        )
    return summary.model_copy(update={"poll_seconds": wait})

"""How long a run's state machine waits before its next poll, and when its execution hands the run over.

The wait: the request's interval while a job trains, longer the longer a job has waited for capacity
(lambdas/shared/history.py). The hand-over: each poll is counted in the execution's state; the poll that makes
the execution's budget (`Poll.polls_per_execution`) answers `hand_over`, and the state machine goes on in a new
execution (stacks/pipeline/polled_job.py). Every progress handler passes its answer through `paced`; the state
machine's Wait reads `poll_seconds`.
"""

from __future__ import annotations

from contract.execution_state import JobProgress, Poll
from lambdas.shared import history


def paced(summary: JobProgress, poll: Poll) -> JobProgress:
    """`summary` with the next poll's wait, this execution's count of polls, and whether it hands the run over."""
    wait = poll.request.poll_seconds
    if summary.queued_seconds is not None and not summary.finished:
        limit = poll.request.max_queue_wait_seconds
        wait = history.waiting_poll_seconds(
            floor_seconds=wait,
            waited_seconds=summary.queued_seconds,
            left_seconds=None if limit is None else limit - summary.queued_seconds,
        )
    polls = poll.previous.polls + 1
    budget = poll.polls_per_execution
    # A stale-checkpoint warning is sent first: the poll after it hands over.
    hand_over = budget is not None and polls >= budget and not summary.finished and not summary.warn_stale
    return summary.model_copy(update={"poll_seconds": wait, "polls": polls, "hand_over": hand_over})

"""A poll's pacing: a training job polled at the request's interval, a job waiting for capacity less often the longer
it waits, and just after its allowed wait runs out."""

from __future__ import annotations

from typing import Any

from contract.execution_state import JobProgress, Poll, TrainingRequest
from lambdas.jobs.pacing import paced
from lambdas.shared import history
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:training-platform-dev:run-1"
REQUEST = TrainingRequest.parse(
    resolve(
        {
            "run_name": "paced",
            "model": "tiny",
            "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
            "instance_type": "ml.g5.2xlarge",
            "max_runtime_hours": 2,
        },
        execution_name="e",
        limits=LIMITS,
    )
)


def _poll(*, polls: int = 0, budget: int | None = None, **request: Any) -> Poll:
    return Poll.model_validate(
        {
            "request": REQUEST.model_copy(update=request).model_dump(mode="json"),
            "execution": EXECUTION,
            "previous": {"stale_warned": False, "polls": polls},
            "hourly_usd": 1.0,
            "polls_per_execution": budget,
        }
    )


def _progress(**fields: Any) -> JobProgress:
    return JobProgress.untrained("paced-1", "InProgress", "Training", **fields)


def test_a_training_job_is_polled_at_the_requests_interval() -> None:
    assert paced(_progress(), _poll()).poll_seconds == REQUEST.poll_seconds


def test_a_waiting_job_is_polled_less_often_the_longer_it_waits_and_just_after_its_wait_runs_out() -> None:
    floor = REQUEST.poll_seconds
    waits = [paced(_progress(queued_seconds=waited), _poll()).poll_seconds for waited in (0, 4 * floor, 8 * floor)]
    assert waits == [floor, floor, 2 * floor]
    assert paced(_progress(queued_seconds=24 * 3600), _poll()).poll_seconds == history.WAITING_POLL_CAP_SECONDS
    near = paced(_progress(queued_seconds=24 * 3600 - 100), _poll(max_queue_wait_seconds=24 * 3600))
    assert near.poll_seconds == 101


def test_a_days_wait_costs_dozens_of_polls_not_hundreds() -> None:
    waited, polls = 0, 0
    while waited < 24 * 3600:
        waited += paced(_progress(queued_seconds=waited), _poll()).poll_seconds or 0
        polls += 1
    assert polls <= 40 < 24 * 3600 / REQUEST.poll_seconds
    # A week's wait at that pace stays far inside one execution's history.
    assert (polls + 6 * 24) * history.EVENTS_PER_POLL < history.HISTORY_LIMIT // 4


def test_each_poll_is_counted_and_the_one_that_makes_the_budget_hands_the_run_over() -> None:
    counted = [paced(_progress(), _poll(polls=made, budget=3)) for made in range(3)]
    assert [(p.polls, p.hand_over) for p in counted] == [(1, False), (2, False), (3, True)]
    # No budget: counted, never handed over; a new execution's count starts again (TakeOver sets it to 0).
    assert paced(_progress(), _poll(polls=10_000)).hand_over is False


def test_a_finished_job_or_a_stale_warning_is_not_handed_over() -> None:
    finished = JobProgress.untrained("paced-1", "Completed", "Completed", finished=True)
    assert paced(finished, _poll(polls=2, budget=3)).hand_over is False
    assert paced(_progress(warn_stale=True), _poll(polls=2, budget=3)).hand_over is False
    assert paced(_progress(), _poll(polls=3, budget=3)).hand_over is True

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


def _poll(**request: Any) -> Poll:
    return Poll.model_validate(
        {
            "request": REQUEST.model_copy(update=request).model_dump(mode="json"),
            "execution": EXECUTION,
            "previous": {"stale_warned": False},
            "hourly_usd": 1.0,
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

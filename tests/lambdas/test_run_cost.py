"""A run's cost so far: each backend's progress answer adds its finished job's cost to the earlier attempts'."""

from __future__ import annotations

from typing import Any

import pytest

from contract.execution_state import BatchPoll, JobCost, JobProgress, Poll, QueuePoll, SageMakerPoll
from lambdas.jobs.progress import answer
from lambdas.shared.metrics import Stage, StageMetrics
from tests.lambdas.test_pacing import EXECUTION, REQUEST

EARLIER = JobCost(actual_usd=0.0008, on_demand_usd=0.0008, spot_savings_usd=0.0)
THIS = JobCost(actual_usd=0.001, on_demand_usd=0.003, spot_savings_usd=0.002)
JOB = {"job_name": "paced-2", "arn": "arn:aws:batch:us-east-1:123456789012:job/j2", "job_id": "j2"}
# Each backend's poll event, as its progress handler reads it (stacks/pipeline/polled_job.py).
POLLS: dict[str, tuple[type[Poll], dict[str, Any]]] = {
    "sagemaker": (SageMakerPoll, {"job_name": "paced-2"}),
    "batch": (BatchPoll, {"job": JOB}),
    "queue": (QueuePoll, {"job": JOB}),
    "tuning": (Poll, {}),
}


def _poll(backend: str, billed: JobCost | None) -> Poll:
    kind, job = POLLS[backend]
    return kind.model_validate(
        {
            "request": REQUEST.model_dump(mode="json"),
            "execution": EXECUTION,
            **job,
            "previous": {"stale_warned": False},
            "hourly_usd": 1.0,
            "billed": billed.model_dump() if billed else None,
        }
    )


def _answer(backend: str, summary: JobProgress, billed: JobCost | None) -> JobProgress:
    answered = answer(
        summary, _poll(backend, billed), into=StageMetrics(Stage.TRAINING), message="polled", logged={"job_name"}
    )
    return JobProgress.model_validate(answered)  # what the state machine, and Register after it, read


def _finished(cost: JobCost | None) -> JobProgress:
    return JobProgress.untrained("paced-2", "Completed", "Completed", finished=True, cost=cost)


@pytest.mark.parametrize("backend", sorted(POLLS))
def test_a_finished_jobs_run_cost_is_its_own_and_the_earlier_attempts(backend: str) -> None:
    answered = _answer(backend, _finished(THIS), EARLIER)
    assert answered.cost == THIS  # the job's own, as its metrics record it
    assert answered.run_cost == JobCost(actual_usd=0.0018, on_demand_usd=0.0038, spot_savings_usd=0.002)


def test_the_first_attempts_run_cost_is_its_job_and_an_unbilled_job_adds_nothing() -> None:
    assert _answer("sagemaker", _finished(THIS), None).run_cost == THIS
    assert _answer("batch", _finished(None), EARLIER).run_cost == EARLIER
    assert _answer("queue", _finished(None), None).run_cost is None


def test_a_running_job_has_no_run_cost_yet() -> None:
    running = JobProgress.untrained("paced-2", "InProgress", "Training")
    assert _answer("sagemaker", running, EARLIER).run_cost is None


def test_costs_sum_the_known_ones() -> None:
    assert JobCost.total(EARLIER, None, THIS) == JobCost(
        actual_usd=0.0018, on_demand_usd=0.0038, spot_savings_usd=0.002
    )
    assert JobCost.total(None, None) is None and JobCost.total() is None

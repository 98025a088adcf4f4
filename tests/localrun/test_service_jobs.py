"""AWS Batch service jobs with quota shares: the scheduler."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from localrun.service_jobs import LEND, LEND_AND_BORROW, RESERVE, Job, Share, schedule

P4D = "ml.p4d.24xlarge"


class Queue:
    """The scheduler's view of a queue, played by hand: a fake clock and a runner that does what it is told."""

    def __init__(self, capacity: dict[str, int], *shares: Share) -> None:
        self.capacity, self.shares = capacity, list(shares)
        self.jobs: dict[str, Job] = {}
        self.clock = 0.0

    def submit(self, job_id: str, share: str, count: int, priority: int = 0, instance_type: str = P4D) -> None:
        self.jobs[job_id] = Job(job_id, share, instance_type, count, priority, submitted=len(self.jobs))

    def step(self) -> Any:
        """Schedule once and apply it: started jobs hold their capacity, preempted ones start stopping."""
        self.clock += 1
        decision = schedule(self.capacity, self.shares, self.jobs.values())
        assert decision == schedule(self.capacity, self.shares, self.jobs.values())  # deterministic
        for job_id in decision.start:
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], holding=True, started=self.clock)
        for job_id in decision.preempt:
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], stopping=True)
        return decision

    def end(self, job_id: str) -> None:
        del self.jobs[job_id]

    def requeue(self, job_id: str) -> None:
        """A preempted job's training job stopped: it is RUNNABLE again."""
        self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], holding=False, stopping=False, started=None)

    def running(self) -> list[str]:
        return sorted(j.job_id for j in self.jobs.values() if j.holding)


# -- the scheduler ----------------------------------------------------------------------------------------
def test_a_full_quota_makes_jobs_wait_with_the_reason_and_their_place_until_the_first_ends() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}), Share("team-b", {P4D: 4}))
    queue.submit("a1", "team-a", 4)
    queue.submit("a2", "team-a", 4)
    queue.submit("a3", "team-a", 2)
    decision = queue.step()
    assert decision.start == ["a1"]
    assert decision.waiting == {
        "a2": f"waiting for capacity: share team-a uses 4 of 4 {P4D}",
        "a3": f"waiting for capacity: share team-a uses 4 of 4 {P4D}; 1 job ahead",
    }
    assert queue.step().start == []  # team-b's idle capacity is reserved: nothing moves
    queue.end("a1")
    decision = queue.step()
    assert decision.start == ["a2"]
    assert decision.waiting == {"a3": f"waiting for capacity: share team-a uses 4 of 4 {P4D}"}


def test_a_borrower_uses_a_lenders_idle_capacity_and_is_preempted_when_the_lender_submits() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 4)
    assert queue.step().start == ["b1", "b2"]  # b2 borrows team-a's idle four
    queue.submit("a1", "team-a", 4)
    decision = queue.step()
    assert decision.start == []
    assert decision.preempt == {"b2": "Preempted to return capacity lent by share team-a"}
    assert decision.waiting == {"a1": f"waiting for borrowed {P4D} to be returned to share team-a"}
    assert queue.step().preempt == {}  # a job already stopping is not preempted again, nor another in its place
    queue.requeue("b2")
    decision = queue.step()
    assert decision.start == ["a1"]
    assert decision.waiting == {"b2": f"waiting for capacity: share team-b uses 4 of 4 {P4D}; no idle capacity is lent"}
    assert queue.running() == ["a1", "b1"]


def test_the_borrower_preempted_is_the_lowest_priority_then_the_latest_started() -> None:
    queue = Queue({P4D: 6}, Share("team-a", {P4D: 2}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    for name, priority in (("b1", 5), ("b2", 1), ("b3", 1)):
        queue.submit(name, "team-b", 2, priority)
        queue.step()
    assert queue.running() == ["b1", "b2", "b3"]
    queue.submit("a1", "team-a", 2)
    assert queue.step().preempt == {"b3": "Preempted to return capacity lent by share team-a"}


def test_a_reserve_share_never_lends_its_idle_capacity() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, RESERVE), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 1)
    decision = queue.step()
    assert decision.start == ["b1"]
    assert decision.waiting == {"b2": f"waiting for capacity: share team-b uses 4 of 4 {P4D}; no idle capacity is lent"}


def test_capacity_no_share_covers_can_be_borrowed() -> None:
    queue = Queue({P4D: 10}, Share("team-a", {P4D: 4}, RESERVE), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 6)
    assert queue.step().start == ["b1"]


def test_the_borrow_limit_caps_borrowing_as_a_percentage_of_the_shares_own_limit() -> None:
    queue = Queue(
        {P4D: 16}, Share("team-a", {P4D: 8}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW, borrow_limit=50)
    )
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 2)  # borrows 2: 50% of 4
    queue.submit("b3", "team-b", 1)
    decision = queue.step()
    assert decision.start == ["b1", "b2"]
    assert decision.waiting == {
        "b3": f"waiting for capacity: share team-b uses 6 of 4 {P4D} and may borrow at most 2 more (borrow limit 50%)"
    }


def test_a_lend_share_does_not_borrow() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, LEND), Share("team-b", {P4D: 4}, LEND))
    queue.submit("a1", "team-a", 6)
    assert queue.step().waiting == {"a1": f"waiting for capacity: share team-a uses 0 of 4 {P4D}"}


def test_priorities_order_the_jobs_of_a_share_and_a_job_waits_behind_those_before_it() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}))
    queue.submit("low", "team-a", 2, priority=1)
    queue.submit("high", "team-a", 4, priority=9)
    decision = queue.step()
    assert decision.start == ["high"]
    queue.end("high")
    queue.submit("higher", "team-a", 4, priority=20)
    queue.submit("small", "team-a", 1, priority=0)
    assert queue.step().start == ["higher"]
    queue.end("higher")
    assert queue.step().start == ["low", "small"]


def test_a_job_of_an_instance_type_without_a_limit_waits_saying_so() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}))
    queue.submit("g5", "team-a", 1, instance_type="ml.g5.xlarge")
    assert queue.step().waiting == {"g5": "waiting: the service environment has no capacity limit for ml.g5.xlarge"}


@pytest.mark.parametrize("enabled", [False, True])
def test_in_share_preemption_only_when_the_share_enables_it(enabled: bool) -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}, in_share_preemption=enabled))
    queue.submit("low", "team-a", 4, priority=1)
    queue.step()
    queue.submit("high", "team-a", 4, priority=9)
    decision = queue.step()
    assert decision.start == []
    if not enabled:
        assert decision.preempt == {}
        assert decision.waiting == {"high": f"waiting for capacity: share team-a uses 4 of 4 {P4D}"}
        return
    assert decision.preempt == {"low": "Preempted by a higher-priority job of share team-a (high)"}
    assert decision.waiting == {"high": f"waiting for preempted jobs of share team-a to release {P4D}"}
    queue.requeue("low")
    assert queue.step().start == ["high"]


def test_in_share_preemption_never_preempts_equal_or_higher_priorities() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}, in_share_preemption=True))
    queue.submit("first", "team-a", 4, priority=5)
    queue.step()
    queue.submit("same", "team-a", 4, priority=5)
    assert queue.step().preempt == {}

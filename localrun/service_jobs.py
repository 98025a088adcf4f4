"""AWS Batch service jobs (SageMaker Training job queues with quota shares): the scheduler, pure.

`schedule` decides, given the service environment's capacity per instance type, the queue's quota
shares and its jobs, which jobs start, which wait (and why), and which are preempted.

From the AWS Batch user guide and API reference: a quota-managed service environment's capacity
limits and a share's are instances of one instance type each (capacityUnit is the type); a job
uses the instances of its payload's ResourceConfig; RESERVE keeps a share's idle capacity, LEND
lends it, LEND_AND_BORROW lends it and borrows up to borrowLimit percent of the share's own limit
(-1: no limit); cross-share preemption gives a lender back what borrowers use; in-share preemption
(if enabled) lets a higher-priority job preempt lower-priority jobs of its share.

Chosen here where the documentation is silent (Batch applies "a custom heuristic"):
- within a share, jobs go by schedulingPriority (higher first), then submission order; a job waits
  while one before it in its share, on its instance type, waits (no overtaking);
- jobs that fit in their share's own limit are placed before any job borrows;
- service-environment capacity no share's limit covers can be borrowed as lent capacity;
- victims are chosen lowest priority first, then the most recently started (least work lost), then
  the latest submitted;
- a preempting job starts once its victims have released their capacity, not at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

RESERVE, LEND, LEND_AND_BORROW = "RESERVE", "LEND", "LEND_AND_BORROW"


# -- the scheduler ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Share:
    """A quota share: its capacity limits (instances per type) and how it shares them."""

    name: str
    limits: dict[str, int]
    strategy: str = RESERVE
    borrow_limit: int = -1
    """Percent of the share's own limit it may borrow on top (LEND_AND_BORROW only); -1: unlimited."""
    in_share_preemption: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in (RESERVE, LEND, LEND_AND_BORROW):
            raise ValueError(f"share {self.name}: strategy {self.strategy!r} is not RESERVE, LEND or LEND_AND_BORROW")
        if self.borrow_limit < -1:
            raise ValueError(f"share {self.name}: borrow_limit must be -1 (unlimited) or a percentage >= 0")

    def borrow_cap(self, instance_type: str) -> float:
        """How many instances of the type the share may use beyond its own limit."""
        if self.strategy != LEND_AND_BORROW:
            return 0
        if self.borrow_limit == -1:
            return float("inf")
        return self.limits.get(instance_type, 0) * self.borrow_limit / 100


@dataclass(frozen=True)
class Job:
    """A job as the scheduler sees it. `holding`: it has capacity (SCHEDULED, STARTING, RUNNING);
    `stopping`: holding, and already being preempted or terminated."""

    job_id: str
    share: str
    instance_type: str
    count: int
    priority: int = 0
    submitted: int = 0
    """Submission order."""
    started: float | None = None
    """When it got capacity (holding jobs)."""
    holding: bool = False
    stopping: bool = False


@dataclass(frozen=True)
class Decision:
    start: list[str] = field(default_factory=list)
    preempt: dict[str, str] = field(default_factory=dict)
    """Job ID -> the reason, as its attempt's statusReason gives it."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Job ID -> why it waits."""


def _order(job: Job) -> tuple[int, int, str]:
    return (-job.priority, job.submitted, job.job_id)


def _victim_order(job: Job) -> tuple[int, float, int]:
    """Lowest priority first, then the most recently started (the least work lost), then the latest submitted."""
    return (job.priority, -(job.started or 0), -job.submitted)


def schedule(capacity: dict[str, int], shares: Iterable[Share], jobs: Iterable[Job]) -> Decision:
    """What starts, what waits and what is preempted now. Deterministic; changes nothing."""
    return _Scheduler(capacity, {s.name: s for s in shares}, list(jobs)).run()


class _Scheduler:
    """One scheduling pass over a snapshot of the queue."""

    def __init__(self, capacity: dict[str, int], shares: dict[str, Share], jobs: list[Job]) -> None:
        self.capacity, self.shares, self.jobs = capacity, shares, jobs
        self.holders = [j for j in jobs if j.holding]
        self.used: dict[tuple[str, str], int] = {}
        for job in self.holders:
            self.used[job.share, job.instance_type] = self.used.get((job.share, job.instance_type), 0) + job.count
        self.releasing: dict[tuple[str, str], int] = {}
        """(share, type) -> instances that jobs being stopped will release: no need to preempt for them again."""
        for job in self.holders:
            if job.stopping:
                key = (job.share, job.instance_type)
                self.releasing[key] = self.releasing.get(key, 0) + job.count
        self.decision = Decision()
        self.blocked: dict[tuple[str, str], int] = {}
        """(share, type) -> how many of its jobs wait: the jobs after them wait too."""

    def run(self) -> Decision:
        unplaced: list[Job] = []
        deferred: set[tuple[str, str]] = set()
        # Pass 1: every job that fits in its share's own limit, preempting borrowers to get that capacity back.
        for job in sorted((j for j in self.jobs if not j.holding), key=_order):
            key = (job.share, job.instance_type)
            if job.share not in self.shares:
                self.wait(job, f"waiting: the queue has no quota share {job.share}")
            elif job.instance_type not in self.capacity:
                self.wait(job, f"waiting: the service environment has no capacity limit for {job.instance_type}")
            elif key in self.blocked:
                self.wait(job, self.quota_reason(job))
            elif key in deferred or self.mine(job) + job.count > self.limit(job):
                deferred.add(key)  # may borrow in pass 2, where the jobs after it wait for it
                unplaced.append(job)
            else:
                self.place_in_quota(job)
        # Pass 2: jobs beyond their share's limit borrow what others lend, or preempt lower priorities in-share.
        for job in unplaced:
            if (job.share, job.instance_type) in self.blocked:
                self.wait(job, self.quota_reason(job))
            elif not self.borrow(job) and not self.preempt_in_share(job):
                self.wait(job, self.borrow_reason(job))
        return self.decision

    # -- capacity ---------------------------------------------------------------------------------------
    def mine(self, job: Job) -> int:
        return self.used.get((job.share, job.instance_type), 0)

    def limit(self, job: Job) -> int:
        return self.shares[job.share].limits.get(job.instance_type, 0)

    def free(self, instance_type: str) -> int:
        return self.capacity[instance_type] - sum(n for (_, t), n in self.used.items() if t == instance_type)

    def reserved_idle(self, instance_type: str, besides: str) -> int:
        """Idle capacity that RESERVE shares (other than `besides`) keep for themselves."""
        return sum(
            max(0, s.limits.get(instance_type, 0) - self.used.get((s.name, instance_type), 0))
            for s in self.shares.values()
            if s.strategy == RESERVE and s.name != besides
        )

    # -- decisions --------------------------------------------------------------------------------------
    def take(self, job: Job) -> None:
        self.used[job.share, job.instance_type] = self.mine(job) + job.count
        self.decision.start.append(job.job_id)

    def wait(self, job: Job, reason: str) -> None:
        key = (job.share, job.instance_type)
        ahead = self.blocked.get(key, 0)
        self.decision.waiting[job.job_id] = reason + (f"; {ahead} job{'s' * (ahead != 1)} ahead" if ahead else "")
        self.blocked[key] = ahead + 1

    def preempt(self, victims: list[Job], need: int, reason: str) -> bool:
        """Preempt from `victims` (in order) until `need` instances are freed; none if they cannot free that much."""
        if sum(v.count for v in victims) < need:
            return False
        for victim in victims:
            if need <= 0:
                break
            self.decision.preempt[victim.job_id] = reason
            need -= victim.count
        return True

    def claim_releasing(self, need: int, instance_type: str, share: str | None = None) -> int:
        """Claim what jobs being stopped will release (of one share, or of any); what is still needed."""
        for key in sorted(self.releasing):
            if key[1] == instance_type and share in (None, key[0]) and need > 0:
                claimed = min(need, self.releasing[key])
                self.releasing[key] -= claimed
                need -= claimed
        return need

    def place_in_quota(self, job: Job) -> None:
        t = job.instance_type
        free = self.free(t)
        if free >= job.count:
            self.take(job)
            return
        reason = f"Preempted to return capacity lent by share {job.share}"
        need = self.claim_releasing(job.count - free, t)
        if need <= 0 or self.preempt(self.borrowing_victims(t), need, reason):
            self.wait(job, f"waiting for borrowed {t} to be returned to share {job.share}")
        else:
            self.wait(job, f"waiting for capacity: the service environment's {self.capacity[t]} {t} are in use")

    def borrowing_victims(self, instance_type: str) -> list[Job]:
        """Jobs of shares using more of the type than their limit, while their share still would."""
        over = {
            s: n - self.releasing.get((s, t), 0) - self.shares[s].limits.get(t, 0)
            for (s, t), n in self.used.items()
            if t == instance_type
        }
        victims = []
        for job in sorted(self.holders, key=_victim_order):
            if job.instance_type != instance_type or job.stopping or job.job_id in self.decision.preempt:
                continue
            if over.get(job.share, 0) > 0:
                victims.append(job)
                over[job.share] -= job.count
        return victims

    def borrow(self, job: Job) -> bool:
        share, t = self.shares[job.share], job.instance_type
        if share.strategy != LEND_AND_BORROW or self.mine(job) + job.count - self.limit(job) > share.borrow_cap(t):
            return False
        free = self.free(t)
        lendable = free - self.reserved_idle(t, besides=job.share)
        if min(free, lendable + max(0, self.limit(job) - self.mine(job))) < job.count:
            return False
        self.take(job)
        return True

    def preempt_in_share(self, job: Job) -> bool:
        """In-share preemption (if the share enables it): lower-priority jobs of the share make room."""
        if not self.shares[job.share].in_share_preemption:
            return False
        lower = sorted(
            (
                h
                for h in self.holders
                if h.share == job.share and h.instance_type == job.instance_type and h.priority < job.priority
                if not h.stopping and h.job_id not in self.decision.preempt
            ),
            key=_victim_order,
        )
        reason = f"Preempted by a higher-priority job of share {job.share} ({job.job_id})"
        releasing = dict(self.releasing)
        need = self.claim_releasing(self.mine(job) + job.count - self.limit(job), job.instance_type, job.share)
        if need > 0 and not self.preempt(lower, need, reason):
            self.releasing = releasing
            return False
        self.wait(job, f"waiting for preempted jobs of share {job.share} to release {job.instance_type}")
        return True

    # -- reasons ----------------------------------------------------------------------------------------
    def quota_reason(self, job: Job) -> str:
        return f"waiting for capacity: share {job.share} uses {self.mine(job)} of {self.limit(job)} {job.instance_type}"

    def borrow_reason(self, job: Job) -> str:
        share, t = self.shares[job.share], job.instance_type
        if share.strategy != LEND_AND_BORROW:
            return self.quota_reason(job)
        if self.mine(job) + job.count - self.limit(job) > share.borrow_cap(t):
            cap = f"{share.borrow_cap(t):g}"
            return f"{self.quota_reason(job)} and may borrow at most {cap} more (borrow limit {share.borrow_limit}%)"
        return f"{self.quota_reason(job)}; no idle capacity is lent"

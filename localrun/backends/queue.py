"""AWS Batch service jobs (SageMaker Training job queues with quota shares), played locally.

`schedule` is the scheduler, pure: given the service environment's capacity per instance type, the
queue's quota shares and its jobs, it decides which jobs start, which wait (and why), and which are
preempted. `LocalServiceJobs` answers SubmitServiceJob, DescribeServiceJob, TerminateServiceJob and
ListServiceJobs in moto's place (moto has none of them): a started job creates a SageMaker training
job from its payload and the platform's training backend runs it; a preempted job's training job is
stopped and the job requeued, per its preemptionConfiguration, to start again later as a new
training job (which resumes from the payload's CheckpointConfig).

LocalPlatform plays the assembly's team queue (`from_assembly`) as `platform.queue`: it enters
`patches()` and calls `bind(platform)`; the callers' Batch calls are judged by localrun/aws/iam.py like any other.
Without the platform, the same by hand:

    jobs = LocalServiceJobs(queue="teams", capacity={"ml.p4d.24xlarge": 8}, shares=[Share(...), ...])
    with mock_aws(), contextlib.ExitStack() as stack:
        for patch in jobs.patches():
            stack.enter_context(patch)

From the AWS Batch user guide and API reference: a quota-managed service environment's capacity
limits and a share's are instances of one instance type each (capacityUnit is the type); a job
uses the instances of its payload's ResourceConfig; RESERVE keeps a share's idle capacity, LEND
lends it, LEND_AND_BORROW lends it and borrows up to borrowLimit percent of the share's own limit
(-1: no limit); cross-share preemption gives a lender back what borrowers use; in-share preemption
(if enabled) lets a higher-priority job preempt lower-priority jobs of its share; a preempted job
is requeued RUNNABLE, unlimited times unless preemptionRetriesBeforeTermination says otherwise
(0: FAILED at the first preemption); a job's training job is named `AWSBatch<jobName><32 hex>`; a SubmitServiceJob
that repeats an earlier one's clientToken and request is the same request, and is refused (the API reference's
clientToken), whoever submitted the first; another request under the same token is a job of its own.

Chosen here where the documentation is silent (Batch applies "a custom heuristic"):
- within a share, jobs go by schedulingPriority (higher first), then submission order; a job waits
  while one before it in its share, on its instance type, waits (no overtaking);
- jobs that fit in their share's own limit are placed before any job borrows;
- service-environment capacity no share's limit covers can be borrowed as lent capacity;
- victims are chosen lowest priority first, then the most recently started (least work lost), then
  the latest submitted;
- a preempting job starts once its victims' training jobs have stopped, not at once;
- one instance type per job (InstanceGroups of one type); retryStrategy.evaluateOnExit and
  timeoutConfig are not played; the service's own SageMaker calls are not judged by the local IAM
  (as LocalTuning's trials: SageMaker's own authority).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from moto.batch import urls as batch_urls
from moto.batch.responses import BatchResponse
from moto.core.exceptions import JsonRESTError

from localrun.aws import iam as local_iam
from localrun.aws.cfn import ACCOUNT, REGION, Assembly, Resolver
from localrun.aws.iam import _BATCH_OPERATIONS, acting_as
from localrun.aws.moto_fixes import start_training_job

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


# -- the player -----------------------------------------------------------------------------------------
OPERATIONS = {path: name for path, name in _BATCH_OPERATIONS.items() if name.endswith(("ServiceJob", "ServiceJobs"))}
"""moto's Batch routes by the URL path's last part (`/v1/submitservicejob`), which names the operation."""
HOLDING = ("SCHEDULED", "STARTING", "RUNNING")
ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", *HOLDING)
# SageMaker's secondary status -> the service job's status (the user guide's mapping table).
_SECONDARY = {"Starting": "SCHEDULED", "Pending": "SCHEDULED", "Downloading": "STARTING"}
COMPLETED = "Received status from SageMaker: Training job completed"


@dataclass
class Attempt:
    training_job: str
    started_at: int
    stopped_at: int | None = None
    status_reason: str = ""
    preempted: bool = False

    @property
    def arn(self) -> str:
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{self.training_job.lower()}"

    def described(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "serviceResourceId": {"name": "TrainingJobArn", "value": self.arn},
            "startedAt": self.started_at,
            "statusReason": self.status_reason,
        }
        if self.stopped_at is not None:
            out["stoppedAt"] = self.stopped_at
        return out


@dataclass
class ServiceJob:
    job_id: str
    name: str
    queue: str
    share: str
    instance_type: str
    count: int
    priority: int
    payload: str
    submitted: int
    created_at: int
    request: dict[str, Any]
    """The SubmitServiceJob parameters, as DescribeServiceJob gives them back."""
    status: str = "SUBMITTED"
    status_reason: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    scheduled_at: int | None = None
    stopped_at: int | None = None
    stopping: str | None = None
    """Why its training job is being stopped: "preempted: <reason>" or "terminated: <reason>"."""
    terminated: bool = False
    held_for: str = ""
    """Why the scheduler last held it for capacity ("" if it never has)."""

    @property
    def waited(self) -> bool:
        """The scheduler has held it for capacity at least once."""
        return bool(self.held_for)

    @property
    def arn(self) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:service-job/{self.job_id}"

    @property
    def preemptions(self) -> list[Attempt]:
        return [a for a in self.attempts if a.preempted]


@dataclass
class LocalServiceJobs:
    """One SageMaker Training job queue with its service environment and quota shares, played on this machine.

    `created`, `described` and `stopped` are the platform's SageMaker hooks (LocalPlatform's
    `_training_job_created`, its training backend's `described` and `stopped`): a started job's
    training job is moto's, run by the platform's training backend as any other.
    """

    queue: str
    capacity: dict[str, int]
    """The service environment's capacity limits: instances per instance type."""
    shares: list[Share]
    created: Callable[[str, dict[str, Any], Any], None] | None = None
    described: Callable[[str, Any], None] | None = None
    stopped: Callable[[str, Any], None] | None = None
    now: Callable[[], float] = time.time
    jobs: dict[str, ServiceJob] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    """What the scheduler did, one line each (for a run's report)."""
    on_line: Callable[[str], None] | None = None
    """Called with each line of `log` as it is written (the demo's terminal)."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()

    def bind(self, platform: Any) -> None:
        """Run the training jobs as the platform runs any: its CreateTrainingJob hook and its training backend."""
        self.created = self.created or platform._training_job_created
        self.described = self.described or platform.training.described
        self.stopped = self.stopped or platform.training.stopped

    @property
    def queue_arn(self) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{self.queue}"

    def _ms(self) -> int:
        return int(self.now() * 1000)

    def _note(self, line: str) -> None:
        self.log.append(line)
        if self.on_line is not None:
            self.on_line(line)

    # -- the API ----------------------------------------------------------------------------------------
    def submit(self, params: dict[str, Any]) -> dict[str, str]:
        if params.get("jobQueue") not in (self.queue, self.queue_arn):
            raise JsonRESTError("ClientException", f"Job queue {params.get('jobQueue')} does not exist")
        if params.get("serviceJobType") != "SAGEMAKER_TRAINING":
            raise JsonRESTError("ClientException", "serviceJobType must be SAGEMAKER_TRAINING for this job queue")
        share = params.get("quotaShareName")
        if share not in {s.name for s in self.shares}:
            raise JsonRESTError(
                "ClientException",
                f"quotaShareName {share!r} is not a quota share of {self.queue}: {sorted(s.name for s in self.shares)}",
            )
        instance_type, count = _instances(params["serviceRequestPayload"])
        with self._lock:
            token = params.get("clientToken")
            if token is not None and any(j.request == params for j in self.jobs.values()):
                # AWS Batch documents a clientToken as making two submissions of one token and one payload the same
                # request, whose second is rejected: it answers no job, whoever sent the first.
                raise JsonRESTError(
                    "ClientException",
                    f"a service job was already submitted with client token {token!r} and this same request",
                )
            job = ServiceJob(
                job_id=str(uuid.uuid4()),
                name=params["jobName"],
                queue=self.queue_arn,
                share=share,
                instance_type=instance_type,
                count=count,
                priority=int(params.get("schedulingPriority", 0)),
                payload=params["serviceRequestPayload"],
                submitted=len(self.jobs),
                created_at=self._ms(),
                request=params,
            )
            self.jobs[job.job_id] = job
            job.status = "RUNNABLE"
            self.advance()
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job.job_id}

    def describe(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            self.advance()
            job = self._job(job_id)
            return self._described(job)

    def list_jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        queue = params.get("jobQueue")
        names = [v for f in params.get("filters") or [] if f["name"] == "JOB_NAME" for v in f["values"]]
        status = params.get("jobStatus") or "RUNNING"
        with self._lock:
            self.advance()
            out = []
            for job in self.jobs.values():
                if queue and queue not in (self.queue, self.queue_arn):
                    continue
                if names and not any(job.name.startswith(n[:-1]) if n.endswith("*") else job.name == n for n in names):
                    continue
                if not names and job.status != status:  # as ListJobs: jobStatus is ignored when a filter is given
                    continue
                summary = {
                    k: v
                    for k, v in self._described(job).items()
                    if k not in ("attempts", "serviceRequestPayload", "tags", "retryStrategy", "timeoutConfig")
                    if k not in ("preemptionConfiguration", "preemptionSummary", "schedulingPriority", "jobQueue")
                }
                out.append(summary)
            return out

    def terminate(self, job_id: str, reason: str) -> None:
        with self._lock:
            job = self._job(job_id)
            if job.status not in ACTIVE:
                return
            job.terminated = True
            if job.status in HOLDING:
                self._stop(job, f"terminated: {reason}")
            else:
                self._end(job, "FAILED", reason)
            self.advance()

    def _job(self, job_id: str) -> ServiceJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise JsonRESTError("ClientException", f"Service job {job_id} does not exist")
        return job

    # -- scheduling ---------------------------------------------------------------------------------------
    def advance(self) -> None:
        """Bring every job up to date from its training job, then schedule and apply the decision."""
        with self._lock:
            for job in self.jobs.values():
                if job.status in HOLDING:
                    self._follow(job)
            decision = schedule(self.capacity, self.shares, [self._as_scheduled(j) for j in self._active()])
            for job_id, reason in decision.preempt.items():
                job = self.jobs[job_id]
                self._note(f"{job.name}: {reason}")
                self._stop(job, f"preempted: {reason}")
            for job_id, reason in decision.waiting.items():
                self.jobs[job_id].status_reason = self.jobs[job_id].held_for = reason
            for job_id in decision.start:
                self._start(self.jobs[job_id])

    def _active(self) -> list[ServiceJob]:
        return [j for j in self.jobs.values() if j.status in ACTIVE]

    @staticmethod
    def _as_scheduled(job: ServiceJob) -> Job:
        holding = job.status in HOLDING
        return Job(
            job_id=job.job_id,
            share=job.share,
            instance_type=job.instance_type,
            count=job.count,
            priority=job.priority,
            submitted=job.submitted,
            started=job.attempts[-1].started_at if holding else None,
            holding=holding,
            stopping=job.stopping is not None,
        )

    def _start(self, job: ServiceJob) -> None:
        """Create the job's training job (named as Batch names it) from its payload: SageMaker runs it."""
        from moto.sagemaker.models import sagemaker_backends  # noqa: PLC0415 - moto loads backends lazily

        name = f"AWSBatch{job.name}{uuid.uuid4().hex}"[:63]
        request = {**json.loads(job.payload), "TrainingJobName": name}
        backend: Any = sagemaker_backends[ACCOUNT][REGION]
        training = start_training_job(backend, name, request)
        job.attempts.append(Attempt(training_job=name, started_at=self._ms()))
        job.status, job.status_reason = "SCHEDULED", ""
        job.scheduled_at = job.scheduled_at or self._ms()
        self._note(f"{job.name}: scheduled as training job {name}")
        assert self.created is not None, "LocalServiceJobs: bind it to the platform, or give it `created`"
        # SageMaker runs it on the service's authority, not as whoever happened to call Batch.
        with acting_as(None):
            self.created(name, request, training)

    def _stop(self, job: ServiceJob, why: str) -> None:
        """StopTrainingJob on the job's training job, as Batch calls it: SIGTERM, the trainer checkpoints."""
        if job.stopping is not None:
            return
        job.stopping = why
        training = self._training(job)
        if training.training_job_status == "InProgress":
            training.training_job_status = training.secondary_status = "Stopping"
            training.secondary_status_transitions.append({"Status": "Stopping", "StartTime": datetime.now(UTC)})
            assert self.stopped is not None, "LocalServiceJobs: bind it to the platform, or give it `stopped`"
            with acting_as(None):
                self.stopped(training.training_job_name, training)

    @staticmethod
    def _training(job: ServiceJob) -> Any:
        from moto.sagemaker.models import sagemaker_backends  # noqa: PLC0415

        return sagemaker_backends[ACCOUNT][REGION].training_jobs[job.attempts[-1].training_job]

    def _follow(self, job: ServiceJob) -> None:
        """The service job's status from its training job's (DescribeTrainingJob, as Batch monitors it)."""
        training = self._training(job)
        assert self.described is not None, "LocalServiceJobs: bind it to the platform, or give it `described`"
        with acting_as(None):
            self.described(training.training_job_name, training)
        status, secondary = training.training_job_status, training.secondary_status
        attempt = job.attempts[-1]
        if status in ("InProgress", "Stopping"):
            job.status = _SECONDARY.get(secondary, "RUNNING") if job.stopping is None else job.status
            return
        attempt.stopped_at = self._ms()
        why, job.stopping = job.stopping, None
        if status == "Completed":
            attempt.status_reason = COMPLETED
            self._end(job, "SUCCEEDED", COMPLETED)
        elif why is not None and why.startswith("terminated: "):
            attempt.status_reason = "Received status from SageMaker: Training job stopped"
            self._end(job, "FAILED", why.removeprefix("terminated: "))
        elif why is not None and why.startswith("preempted: "):
            attempt.status_reason, attempt.preempted = why.removeprefix("preempted: "), True
            retries = (job.request.get("preemptionConfiguration") or {}).get("preemptionRetriesBeforeTermination")
            if retries is not None and len(job.preemptions) > retries:
                self._end(job, "FAILED", f"{attempt.status_reason}; preemption retries exhausted ({retries})")
            else:
                job.status, job.status_reason = "RUNNABLE", attempt.status_reason
                self._note(f"{job.name}: requeued after preemption {len(job.preemptions)}")
        else:
            reason = f"Received status from SageMaker: {getattr(training, 'failure_reason', None) or status}"
            attempt.status_reason = reason
            attempts = int((job.request.get("retryStrategy") or {}).get("attempts", 1))
            if len([a for a in job.attempts if not a.preempted]) < attempts:
                job.status, job.status_reason = "RUNNABLE", reason
            else:
                self._end(job, "FAILED", reason)

    def _end(self, job: ServiceJob, status: str, reason: str) -> None:
        job.status, job.status_reason, job.stopped_at = status, reason, self._ms()
        self._note(f"{job.name}: {status}: {reason}")

    def _described(self, job: ServiceJob) -> dict[str, Any]:
        params = job.request
        out: dict[str, Any] = {
            "jobArn": job.arn,
            "jobId": job.job_id,
            "jobName": job.name,
            "jobQueue": job.queue,
            "serviceJobType": "SAGEMAKER_TRAINING",
            "serviceRequestPayload": job.payload,
            "schedulingPriority": job.priority,
            "quotaShareName": job.share,
            "status": job.status,
            "statusReason": job.status_reason,
            "createdAt": job.created_at,
            "isTerminated": job.terminated,
            "attempts": [a.described() for a in job.attempts],
            "tags": params.get("tags") or {},
        }
        for key in ("retryStrategy", "preemptionConfiguration", "timeoutConfig"):
            if params.get(key) is not None:
                out[key] = params[key]
        if job.attempts:
            out["latestAttempt"] = {"serviceResourceId": out["attempts"][-1]["serviceResourceId"]}
            out["startedAt"] = job.attempts[0].started_at
        if job.scheduled_at is not None:
            out["scheduledAt"] = job.scheduled_at
        if job.status in HOLDING:
            out["capacityUsage"] = [{"capacityUnit": job.instance_type, "quantity": float(job.count)}]
        if job.preemptions:
            out["preemptionSummary"] = {
                "preemptedAttemptCount": len(job.preemptions),
                "recentPreemptedAttempts": [a.described() for a in job.preemptions[-5:]],
            }
        if job.stopped_at is not None:
            out["stoppedAt"] = job.stopped_at
        return out

    # -- moto ----------------------------------------------------------------------------------------------
    def patches(self) -> list[Any]:
        """Routes for the four operations in moto's Batch (which has none of them), answered here."""

        def params(response: Any) -> dict[str, Any]:
            return json.loads(response.body) if response.body else {}

        def submit(response: Any) -> str:
            return json.dumps(self.submit(params(response)))

        def describe(response: Any) -> str:
            return json.dumps(self.describe(params(response)["jobId"]))

        def list_jobs(response: Any) -> str:
            return json.dumps({"jobSummaryList": self.list_jobs(params(response))})

        def terminate(response: Any) -> str:
            body = params(response)
            self.terminate(body["jobId"], body.get("reason", ""))
            return "{}"

        def tags(job_id: str) -> dict[str, str]:
            job = self.jobs.get(job_id)
            return dict(job.request.get("tags") or {}) if job is not None else {}

        routes = {f"{{0}}/v1/{path}$": BatchResponse.dispatch for path in OPERATIONS}
        return [
            mock.patch.dict(batch_urls.url_paths, routes),
            # IAM judges TerminateServiceJob on the job's tags (aws:ResourceTag).
            mock.patch.object(local_iam, "service_job_tags", tags),
            *(
                mock.patch.object(BatchResponse, name, method, create=True)
                for name, method in (
                    ("submitservicejob", submit),
                    ("describeservicejob", describe),
                    ("listservicejobs", list_jobs),
                    ("terminateservicejob", terminate),
                )
            ),
        ]


def from_assembly(assembly: Assembly, resolver: Resolver) -> LocalServiceJobs | None:
    """The assembly's SageMaker Training job queue with its service environment's capacity and its quota shares
    (stacks/constructs/queue.py), under the name its ARN resolves to; None when it has no such queue."""
    queues = [
        (stack, logical, resource)
        for stack, logical, resource in assembly.resources("AWS::Batch::JobQueue")
        if resource["Properties"].get("JobQueueType") == "SAGEMAKER_TRAINING"
    ]
    if not queues:
        return None
    if len(queues) > 1:
        raise ValueError(f"the local platform plays one SageMaker Training job queue; the assembly has {len(queues)}")
    ((stack, logical, queue),) = queues
    arn = str(resolver.get_att(stack, logical, "JobQueueArn"))
    environments = {
        str(resolver.get_att(s, name, "ServiceEnvironmentArn")): resolver.resolve(s, resource["Properties"])
        for s, name, resource in assembly.resources("AWS::Batch::ServiceEnvironment")
    }
    capacity: dict[str, int] = {}
    for order in resolver.resolve(stack, queue["Properties"]["ServiceEnvironmentOrder"]):
        for limit in environments[order["ServiceEnvironment"]].get("CapacityLimits", []):
            capacity[limit["CapacityUnit"]] = capacity.get(limit["CapacityUnit"], 0) + int(limit["MaxCapacity"])
    shares = []
    for s, _, resource in assembly.resources("AWS::Batch::QuotaShare"):
        props = resolver.resolve(s, resource["Properties"])
        if props["JobQueue"] != arn:
            continue
        sharing = props.get("ResourceSharingConfiguration", {})
        preemption = props.get("PreemptionConfiguration", {})
        shares.append(
            Share(
                name=props["QuotaShareName"],
                limits={c["CapacityUnit"]: int(c["MaxCapacity"]) for c in props.get("CapacityLimits", [])},
                strategy=sharing.get("Strategy", RESERVE),
                borrow_limit=int(sharing.get("BorrowLimit", -1)),
                in_share_preemption=preemption.get("InSharePreemption") == "ENABLED",
            )
        )
    return LocalServiceJobs(queue=arn.rsplit("/", 1)[1], capacity=capacity, shares=shares)


def _instances(payload: str) -> tuple[str, int]:
    """The instance type and count a CreateTrainingJob request asks for (what the job uses of the quota)."""
    try:
        resources = json.loads(payload)["ResourceConfig"]
    except (ValueError, KeyError, TypeError) as exc:
        raise JsonRESTError("ClientException", f"serviceRequestPayload has no ResourceConfig: {exc}") from exc
    groups = resources.get("InstanceGroups") or [
        {"InstanceType": resources.get("InstanceType"), "InstanceCount": resources.get("InstanceCount", 1)}
    ]
    types = {g["InstanceType"] for g in groups}
    if len(types) != 1 or None in types:
        raise JsonRESTError(
            "ClientException", f"the local scheduler plays jobs of one instance type; this one asks for {types}"
        )
    return types.pop(), sum(int(g["InstanceCount"]) for g in groups)

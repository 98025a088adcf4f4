"""Goodput: where a job's billed time went, from the service's timestamps and the trainer's own records.

The trainer (global rank 0) keeps one progress record per start of its processes in the run's checkpoint
folder, ``progress/<job>-<started ms>.json`` (`layout.PROGRESS`): its job, when and at which step it
started, the last step it finished and its phases so far (training/metrics.PHASES). It rewrites the
record after every checkpoint, at the end, and at most every PROGRESS_SECONDS between. The folder is
uploaded to S3 as the job runs and restored on every restart (SageMaker's managed spot, the run's next
job, Batch's contract), so a resumed trainer knows the furthest step an earlier start reached
(`furthest_step`): the steps up to it are computed again, and their time is rework, not training.

When a job ends its progress handler assembles its ledger (`job_ledger`): the billed interval
(SageMaker's TrainingStartTime..TrainingEndTime, Batch's startedAt..stoppedAt) split into

    provisioning     instances starting, the image and the data downloading (secondary statuses)
    startup ... export   the trainer's phases, summed over the job's records (`PHASE_PARTS`)
    other            in the container outside any phase: the launcher before the trainer's clock,
                     the exit, and the time after a start's last record (lost with it)
    upload           the model's upload
    stalls           interrupted or restarting (billed, nothing running), and a hang until the check stopped it

goodput = productive / billed. The parts are measured, not derived, except `other`; `unaccounted` is
what the service's transitions leave of the billed interval (zero when they tile it), kept so that a
ledger whose parts do not sum to its billed time says so. A progress record is the trainer's word, which
the job's own role writes: the phases of a job's records never count for more than the container time
the service billed, and when they claim more they are scaled down to it and the ledger says by how much
(`bounded_seconds`).

Stdlib only: the trainer, the Lambda handlers, the run report and `tp` import it.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from contract.layout import JOB_NAME_ENV, LAUNCHED_ENV, PROGRESS, run_goodput, run_progress
from contract.metrics import PHASES

PROGRESS_SECONDS = 15.0
"""At most this long between two rewrites of a progress record while training (plus every checkpoint)."""

PHASE_PARTS = {
    "startup": "startup",
    "preflight": "preflight",
    "checkpoint_load": "checkpoint_load",
    "train": "productive",
    "rework": "rework",
    "checkpoint": "checkpoint",
    "eval": "eval",
    "export": "export",
}
"""The ledger part each trainer phase counts towards."""
PARTS = ("provisioning", *PHASE_PARTS.values(), "other", "upload", "stalls")
"""A ledger's parts, in the order a job goes through them."""

# SageMaker's secondary statuses, by the part of the ledger their time belongs to.
_PROVISIONING = {
    "Starting",
    "LaunchingMLInstances",
    "PreparingTrainingStack",
    "Downloading",
    "DownloadingTrainingImage",
}
_STALLED = {"Interrupted", "Restarting", "Pending"}
_UPLOADING = {"Uploading"}
_CONTAINER = {"Training", "Stopping", "Updating"}


# -- the trainer's side ------------------------------------------------------------------------------


@dataclass
class ProgressRecord:
    """One start of a job's training processes, as its global rank 0 saw it."""

    job: str
    started_at: str  # when this start's clock began (ISO 8601, UTC)
    first_step: int  # the step it resumed from (0: from scratch)
    step: int  # the last step it finished
    updated_at: str
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Its file name in the progress folder."""
        return f"{self.job}-{int(_utc(self.started_at).timestamp() * 1000)}.json"


def job_name(env: Mapping[str, str]) -> str:
    """The job the process trains for: SageMaker's TRAINING_JOB_NAME (the pipeline sets it on Batch too)."""
    return env.get(JOB_NAME_ENV) or "local"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


class ProgressWriter:
    """Keeps this start's progress record in `<checkpoints>/progress/` (written by global rank 0 only)."""

    def __init__(self, checkpoints: Path, *, job: str, started: float, first_step: int) -> None:
        """`started`: time.monotonic() when this start's clock began (the trainer's phases count from it)."""
        started_at = time.time() - (time.monotonic() - started)
        self.record = ProgressRecord(job, _iso(started_at), first_step, first_step, _iso(started_at))
        self.path = checkpoints / PROGRESS / self.record.name
        self._written = -float("inf")

    def write(self, step: int, phases: Mapping[str, float], *, due_only: bool = False) -> bool:
        """Rewrite the record (atomically); with `due_only`, only if PROGRESS_SECONDS have passed. Whether it wrote."""
        now = time.monotonic()
        if due_only and now - self._written < PROGRESS_SECONDS:
            return False
        self.record.step, self.record.phases = step, {k: round(v, 3) for k, v in phases.items()}
        self.record.updated_at = _iso(time.time())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self.record), sort_keys=True))
        os.replace(partial, self.path)
        self._written = now
        return True


def parse_record(data: bytes | str) -> ProgressRecord | None:
    """A progress record from its JSON; None for anything else: a record is the trainer's word, which any
    training role could have written, so whatever it holds must not fail the handler that reads it."""
    try:
        body = json.loads(data)
        record = ProgressRecord(
            job=str(body["job"]),
            started_at=str(body["started_at"]),
            first_step=int(body["first_step"]),
            step=int(body["step"]),
            updated_at=str(body["updated_at"]),
            phases={str(k): float(v) for k, v in body.get("phases", {}).items() if k in PHASES},
        )
        _utc(record.updated_at).timestamp()
        record.name  # noqa: B018 - its start must make a file name
        if not all(math.isfinite(v) and 0 <= v < _MAX_SECONDS for v in record.phases.values()):
            return None
        if min(record.first_step, record.step) < 0:
            return None
    except Exception:  # any malformed record is no record
        return None
    return record


_MAX_SECONDS = 366 * 86400
"""No start of a job runs for longer (SageMaker's longest runtime is 28 days)."""


def _utc(stamp: str) -> datetime:
    """An ISO 8601 time, naive ones taken as UTC."""
    parsed = datetime.fromisoformat(stamp)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def local_records(checkpoints: Path) -> list[ProgressRecord]:
    """The progress records in a local checkpoint folder."""
    found = (parse_record(p.read_bytes()) for p in sorted((checkpoints / PROGRESS).glob("*.json")))
    return [r for r in found if r is not None]


def furthest_step(records: Iterable[ProgressRecord], *, besides: Path | None = None) -> int:
    """The furthest step the records' starts finished (0 if none); `besides`: this start's own record's path."""
    return max((r.step for r in records if besides is None or r.name != besides.name), default=0)


def launched(env: Mapping[str, str], now: float) -> float:
    """When the launcher on this host started (time.monotonic(), which every process of a host shares), from
    which the trainer's phases count; `now` when the launcher did not say (a trainer started by hand)."""
    try:
        value = float(env.get(LAUNCHED_ENV, ""))
    except ValueError:
        return now
    # A value from another host (or a stale environment) is not this host's clock: ignore it.
    return value if 0 <= now - value < 86400 else now


# -- the platform's side -----------------------------------------------------------------------------


def stored_records(s3: Any, bucket: str, run: str, job: str, *, trial: bool = False) -> list[ProgressRecord]:
    """The progress records of `job` (of run `run`) in S3, oldest start first; a tuning trial's (`trial`) are
    in its own checkpoint folder under the run's."""
    prefix = f"{run_progress(run, trial=job if trial else None)}{job}-"
    records = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            # <job>-<ms>.json: a job whose name extends this one's (<job>-1 and <job>-12) is not this one.
            if not item["Key"].removeprefix(prefix).removesuffix(".json").isdigit():
                continue
            record = parse_record(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
            if record is not None and record.job == job:
                records.append(record)
    return sorted(records, key=lambda r: r.started_at)


@dataclass(frozen=True)
class Transition:
    """A secondary status and when it held (SageMaker's SecondaryStatusTransitions)."""

    status: str
    start: datetime
    end: datetime | None = None


def _seconds(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds())


def _clipped(transitions: list[Transition], start: datetime, end: datetime) -> list[tuple[str, datetime, datetime]]:
    """Each status's span within [start, end]; a transition without an end lasts until the next one starts."""
    ordered = sorted(transitions, key=lambda t: t.start)
    spans = []
    for i, transition in enumerate(ordered):
        until = transition.end or (ordered[i + 1].start if i + 1 < len(ordered) else end)
        if (since := max(transition.start, start)) < (until := min(until, end)):
            spans.append((transition.status, since, until))
    return spans


def _running(records: list[ProgressRecord]) -> list[tuple[datetime, datetime]]:
    """When each start's processes ran, as far as their phases say (from its clock's start), merged."""
    spans = sorted(
        (start, start + timedelta(seconds=sum(r.phases.values()))) for r in records if (start := _utc(r.started_at))
    )
    merged: list[tuple[datetime, datetime]] = []
    for since, until in spans:
        if merged and since <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], until))
        else:
            merged.append((since, until))
    return merged


def _overlap(since: datetime, until: datetime, spans: list[tuple[datetime, datetime]]) -> float:
    return sum(_seconds(max(since, a), min(until, b)) for a, b in spans)


@dataclass
class JobLedger:
    """Where one job's billed seconds went (each part in seconds of the whole cluster's wall time)."""

    job: str
    instances: int
    billed_seconds: float
    parts: dict[str, float]
    unaccounted_seconds: float
    starts: int  # how many times its training processes started (restarts after interruptions included)
    bounded_seconds: float = 0.0
    """Phase seconds the job's progress records claimed beyond the container time the service billed, left out
    (0: the records fit in it)."""

    @property
    def goodput(self) -> float:
        return self.parts["productive"] / self.billed_seconds if self.billed_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "goodput": round(self.goodput, 4)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> JobLedger:
        return cls(
            job=str(body["job"]),
            instances=int(body["instances"]),
            billed_seconds=float(body["billed_seconds"]),
            parts={part: float(body["parts"].get(part, 0.0)) for part in PARTS},
            unaccounted_seconds=float(body.get("unaccounted_seconds", 0.0)),
            starts=int(body.get("starts", 0)),
            bounded_seconds=float(body.get("bounded_seconds", 0.0)),
        )


def job_ledger(
    job: str,
    *,
    instances: int,
    billed_start: datetime,
    billed_end: datetime,
    transitions: list[Transition],
    records: list[ProgressRecord],
    hung_seconds: float = 0.0,
) -> JobLedger:
    """A finished job's ledger. Without transitions (Batch) the whole billed interval ran the container;
    `hung_seconds`: how long the hang check saw no step before it stopped the job (contract/hang.py), a stall
    in the container that no phase holds."""
    billed = _seconds(billed_start, billed_end)
    spans = _clipped(transitions, billed_start, billed_end) if transitions else [("Training", billed_start, billed_end)]
    running = _running(records)
    parts = dict.fromkeys(PARTS, 0.0)
    container = 0.0
    for status, since, until in spans:
        seconds = _seconds(since, until)
        if status in _STALLED:
            # Interrupted is reported when the notice comes, while the processes still save a checkpoint
            # and exit: that time is theirs (in their phases), the rest a stall.
            ran = _overlap(since, until, running)
            parts["stalls"] += seconds - ran
            container += ran
        elif status in _CONTAINER:
            container += seconds
        elif status in _PROVISIONING:
            parts["provisioning"] += seconds
        elif status in _UPLOADING:
            parts["upload"] += seconds
    for record in records:
        for phase, seconds in record.phases.items():
            parts[PHASE_PARTS[phase]] += seconds
    claimed = sum(parts[p] for p in PHASE_PARTS.values())
    # The records are the job's own word: what they claim beyond the container time the service billed is
    # left out (every phase scaled down alike), and the ledger says how much.
    bounded = max(0.0, claimed - container)
    if bounded > 0:
        for part in set(PHASE_PARTS.values()):
            parts[part] *= container / claimed
    parts["other"] = max(0.0, container - (claimed - bounded))
    hung = min(hung_seconds, parts["other"])
    parts["other"] -= hung
    parts["stalls"] += hung
    total = sum(parts.values())
    return JobLedger(
        job=job,
        instances=instances,
        billed_seconds=round(billed, 3),
        parts={p: round(s, 3) for p, s in parts.items()},
        unaccounted_seconds=round(billed - total, 3),
        starts=len(records),
        bounded_seconds=round(bounded, 3),
    )


@dataclass
class RunLedger:
    """A run's jobs' ledgers, and their sums in instance-seconds (each job's seconds times its instances)."""

    jobs: list[JobLedger]

    @property
    def billed_instance_seconds(self) -> float:
        return sum(j.billed_seconds * j.instances for j in self.jobs)

    def part_instance_seconds(self, part: str) -> float:
        return sum(j.parts[part] * j.instances for j in self.jobs)

    @property
    def goodput(self) -> float:
        billed = self.billed_instance_seconds
        return self.part_instance_seconds("productive") / billed if billed > 0 else 0.0

    def summary(self) -> str:
        """`21.0% of 68.1 billed instance-seconds (productive 14.3 s (21%), ...)`: the run's goodput in one line."""
        billed = self.billed_instance_seconds
        parts = describe_parts({p: self.part_instance_seconds(p) for p in PARTS}, billed)
        return f"{100 * self.goodput:.1f}% of {billed:.1f} billed instance-seconds ({parts})"

    def to_json(self) -> dict[str, Any]:
        return {
            "goodput": round(self.goodput, 4),
            "billed_instance_seconds": round(self.billed_instance_seconds, 3),
            "parts_instance_seconds": {p: round(self.part_instance_seconds(p), 3) for p in PARTS},
            "jobs": [j.to_json() for j in self.jobs],
        }


def stored_ledgers(s3: Any, bucket: str, run: str) -> RunLedger:
    """The run's jobs' ledgers in its lineage (artifacts bucket), in the order the jobs ended."""
    jobs = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=run_goodput(run)):
        for item in sorted(page.get("Contents", []), key=lambda i: i["LastModified"]):
            jobs.append(JobLedger.from_json(json.loads(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())))
    return RunLedger(jobs)


def describe_parts(parts: Mapping[str, float], billed: float) -> str:
    """`productive 61.2 s (72%), rework 3.1 s (4%), ...`: the parts of at least 0.05 s, largest first."""
    shown = sorted(((s, p) for p, s in parts.items() if s >= 0.05), reverse=True)
    return ", ".join(f"{p} {s:.1f} s ({100 * s / billed:.0f}%)" for s, p in shown) if billed > 0 else "nothing billed"

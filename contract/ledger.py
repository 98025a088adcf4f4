"""The checkpoint ledger: the checkpoints the platform saw a run commit, by their manifests' SHA-256.

One IAM role serves every run's training jobs, so IAM cannot keep one run's code out of another
run's checkpoint prefix; the ledger decides instead. It lives in the artifacts bucket
(`layout.run_ledger`), where training roles may read but never write (lineage is denied to them):

    runs/<run>/lineage/checkpoints/opened.json             written once, when the run is approved
    runs/<run>/lineage/checkpoints/[<trial>/]step-<N>.json  one per complete checkpoint, written once

The platform's progress handlers record each complete checkpoint (contract/stored_checkpoints.py)
of the run as they see it, with S3's `If-None-Match: *`, so a record is never replaced. Every job of
the run gets the ledger as its `ledger` input channel.

A checkpoint this run may resume from is complete and has the manifest its record holds (`Recorded.admits`,
`resumable`): a checkpoint planted in the prefix after the platform recorded the run's own is never resumed from,
and a recorded one that was changed fails its record. That one rule decides what the trainer loads, what the
Batch contract restores, which checkpoint `resume_from` carries over, which one a poll reports and which ones the
end-of-run prune keeps.

Stdlib only, like the modules it serves (Lambda assets, the Batch contract, the trainer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contract.layout import run_checkpoints, run_ledger
from contract.stored_checkpoints import StoredCheckpoint

OPENED = "opened.json"
"""The ledger's first object: the run, its execution, and the run it resumes (if any)."""
_RECORD_SUFFIX = ".json"


@dataclass(frozen=True)
class Record:
    """What the platform saw of one complete checkpoint of the run."""

    checkpoint: str
    """Its directory under the run's checkpoints prefix: ``step-<N>/``, or ``<trial>/step-<N>/``."""
    step: int
    manifest_sha256: str
    job: str
    """The job whose poll saw it, or the run it was copied from when this run resumed that one."""
    execution: str
    recorded_at: str


def record_key(run: str, checkpoint: str) -> str:
    """The ledger's key of the checkpoint directory `checkpoint` (relative to the run's checkpoints prefix)."""
    return f"{run_ledger(run)}{checkpoint.rstrip('/')}{_RECORD_SUFFIX}"


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def put_once(s3: Any, bucket: str, key: str, body: dict[str, Any]) -> bool:
    """Write `body` at `key` unless something is there; whether this call wrote it."""
    try:
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=json.dumps(body, sort_keys=True).encode(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
    except Exception as exc:
        if _error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


def open_ledger(s3: Any, bucket: str, run: str, *, execution: str, continues: dict[str, Any] | None) -> None:
    """The ledger's first object (a retried call finds it written); SageMaker refuses an empty input channel."""
    body = {"run": run, "execution": execution, "continues": continues, "opened_at": _now()}
    put_once(s3, bucket, f"{run_ledger(run)}{OPENED}", body)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _parse(data: bytes) -> Record | None:
    try:
        return Record(**json.loads(data))
    except (ValueError, TypeError):
        return None


def records(s3: Any, bucket: str, run: str) -> list[Record]:
    """The run's records, oldest step first."""
    found: list[Record] = []
    prefix = run_ledger(run)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"] == f"{prefix}{OPENED}" or not obj["Key"].endswith(_RECORD_SUFFIX):
                continue
            parsed = _parse(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
            if parsed is not None:
                found.append(parsed)
    return sorted(found, key=lambda r: (r.step, r.checkpoint))


def record(
    s3: Any, bucket: str, run: str, *, checkpoint: str, step: int, manifest_sha256: str, job: str, execution: str
) -> Record:
    """Record a checkpoint once; the record that stands (this one, or the one written before)."""
    new = Record(
        checkpoint=checkpoint,
        step=step,
        manifest_sha256=manifest_sha256,
        job=job,
        execution=execution,
        recorded_at=_now(),
    )
    key = record_key(run, checkpoint)
    if put_once(s3, bucket, key, asdict(new)):
        return new
    standing = _parse(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    if standing is None:
        raise ValueError(f"s3://{bucket}/{key} is not a ledger record")
    return standing


@dataclass(frozen=True)
class Recorded:
    """What a run's ledger records of its checkpoints: each recorded directory's manifest digest."""

    digests: Mapping[str, str]
    """Checkpoint directory (`step-<N>/`, or `<trial>/step-<N>/`, relative to the run's checkpoints, or to a job's own
    copy of them) -> the manifest SHA-256 recorded of it."""

    def admits(self, checkpoint: str, manifest_sha256: str) -> bool:
        """Whether the complete checkpoint in directory `checkpoint`, whose manifest has this digest, is one the run may
        resume from: the one its record holds."""
        return self.digests.get(checkpoint) == manifest_sha256


@dataclass(frozen=True)
class Seen:
    """One look at the run's checkpoints against its ledger."""

    recorded: list[Record]
    """Newly recorded by this look."""
    not_as_recorded: list[str]
    """Checkpoints whose manifest is not the one recorded of them: changed after the platform saw them."""
    ledger: Recorded
    """The run's ledger after this look."""


def record_seen(s3: Any, bucket: str, run: str, stored: list[StoredCheckpoint], *, job: str, execution: str) -> Seen:
    """Record each of the run's complete checkpoints `stored` that the ledger lacks; report those whose
    manifest differs from their record (they stay unloadable: the record is never replaced)."""
    base = run_checkpoints(run)
    standing = {r.checkpoint: r for r in records(s3, bucket, run)}
    recorded, changed = [], []
    for checkpoint in stored:
        relative = checkpoint.prefix.removeprefix(base)
        entry = standing.get(relative)
        if entry is None:
            entry = record(
                s3,
                bucket,
                run,
                checkpoint=relative,
                step=checkpoint.step,
                manifest_sha256=checkpoint.manifest_sha256,
                job=job,
                execution=execution,
            )
            if entry.manifest_sha256 == checkpoint.manifest_sha256:
                recorded.append(entry)
        if entry.manifest_sha256 != checkpoint.manifest_sha256:
            changed.append(checkpoint.uri)
        standing[relative] = entry
    return Seen(
        recorded=recorded,
        not_as_recorded=changed,
        ledger=Recorded({r.checkpoint: r.manifest_sha256 for r in standing.values()}),
    )


def recorded(s3: Any, bucket: str, run: str) -> Recorded:
    """The run's ledger, as `Recorded`."""
    return Recorded({r.checkpoint: r.manifest_sha256 for r in records(s3, bucket, run)})


def resumable(stored: list[StoredCheckpoint], recorded: Recorded, run: str) -> list[StoredCheckpoint]:
    """Those of the run's complete checkpoints `stored` it may resume from, in their order (newest first)."""
    base = run_checkpoints(run)
    return [c for c in stored if recorded.admits(c.prefix.removeprefix(base), c.manifest_sha256)]


def delivered(directory: Path, *, job: str) -> Recorded | None:
    """The ledger the job's ledger channel delivered in `directory`, as the job's own checkpoints are laid out: the
    run's (a single job's) and `job`'s own folder's (a tuning trial's, where SageMaker puts its checkpoints). None when
    the job has no ledger channel (a run outside the pipeline): any intact checkpoint may be loaded."""
    if not directory.is_dir():
        return None
    digests = {}
    for path in directory.rglob(f"*{_RECORD_SUFFIX}"):
        if path.name == OPENED:
            continue
        parsed = _parse(path.read_bytes())
        if parsed is None:
            continue
        location, _, name = parsed.checkpoint.rstrip("/").rpartition("/")
        if location in ("", job):
            digests[f"{name}/"] = parsed.manifest_sha256
    return Recorded(digests)

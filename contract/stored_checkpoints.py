"""What makes a checkpoint complete, on disk or in S3: one rule for the trainer, the handlers and the local platform.

A checkpoint directory ``step-<N>/`` (contract/layout.py) is complete when its manifest is there,
parses, has a known format and names DCP's metadata, and every file the manifest lists is present
with the size it lists. On disk the trainer also checks the digest of each segment of a file before it
unpickles or loads anything from that segment (training/checkpoint/integrity.py); in S3 the sizes come from the
listing, and the manifest's own SHA-256 is what the platform records of the checkpoint (contract/ledger.py).

Stdlib only: the Lambda assets hold this module, and the Batch contract imports it before torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contract.layout import MANIFEST

FORMAT_VERSION = 4
"""4: every file with its size and the BLAKE3 digest of each of its segments, consecutive runs of its bytes that a
load checks and uses one at a time. Still loaded: 3, the same with SHA-256; 2, one SHA-256 per file, its only
segment. 1 had sizes only and is no longer loaded."""
SEGMENT_HASHES = {2: "sha256", 3: "sha256", 4: "blake3"}
"""The hash each loaded format's segment digests are made with: the names training/checkpoint/integrity.py hashes by."""
_ONE_DIGEST_FORMAT = 2
_DIGEST = re.compile(r"[0-9a-f]{64}")  # 32 bytes, in both hashes

Segment = tuple[int, str]
"""(length in bytes, digest) of one segment of a checkpoint file."""
Listed = tuple[int, tuple[Segment, ...]]
"""(size, segments) of one file of a checkpoint."""
DCP_METADATA = ".metadata"
"""DCP's metadata file, which every checkpoint has and every process reads."""
_IN_CHECKPOINT = re.compile(r"^(?P<location>(?:.*/)?)step-(?P<step>\d+)/(?P<name>[^/]+)$")


class ManifestError(ValueError):
    """A manifest that does not describe a checkpoint this trainer wrote; the message says how."""


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint's manifest promises: each file's size and its segments' digests (the segments cover the
    file in order), the hash those digests are made with, and the processes that wrote it."""

    files: dict[str, Listed]
    world_size: int | None
    hashed_with: str
    """The name, in SEGMENT_HASHES, of the hash of the segments' digests."""

    @classmethod
    def parse(cls, data: bytes | str) -> Manifest:
        try:
            manifest = json.loads(data)
            files = manifest["files"]
            version = manifest.get("format")
            if type(version) is not int or version not in SEGMENT_HASHES:
                raise ManifestError("manifest has an unknown format")
            if not isinstance(files, dict) or DCP_METADATA not in files:
                raise ManifestError("manifest has an unknown format")
            listed = {str(name): _file_entry(entry, version) for name, entry in files.items()}
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"unreadable manifest ({type(exc).__name__}: {exc})") from None
        if any("/" in name or name in ("", ".", "..", MANIFEST) for name in listed):
            raise ManifestError("manifest lists a file outside its checkpoint's directory")
        wrong = sorted(name for name, (size, segments) in listed.items() if sum(n for n, _ in segments) != size)
        if wrong:
            raise ManifestError(f"manifest's segments of {', '.join(wrong)} do not add up to the file's size")
        world_size = manifest.get("world_size")
        processes = world_size if isinstance(world_size, int) else None
        return cls(files=listed, world_size=processes, hashed_with=SEGMENT_HASHES[version])

    def size_problem(self, name: str, actual: int | None) -> str | None:
        """What is wrong with the size of one listed file (`actual` None: it is missing)."""
        size = self.files[name][0]
        if actual is None:
            return f"{name} is missing"
        if actual < size:
            return f"{name} is truncated ({actual} bytes, expected {size})"
        if actual != size:
            return f"{name} has {actual} bytes, its manifest {size}"
        return None

    def incomplete(self, sizes: Mapping[str, int]) -> str | None:
        """The first listed file that `sizes` (name -> bytes present) lacks or holds at another size; None if none."""
        for name in sorted(self.files):
            problem = self.size_problem(name, sizes.get(name))
            if problem is not None:
                return problem
        return None


def _file_entry(entry: dict[str, Any], version: int) -> Listed:
    """(size, segments) of one file's manifest entry; format 2's one digest is the file's only segment (an
    empty file has none)."""
    size = entry["size"]
    if version == _ONE_DIGEST_FORMAT:
        pairs = [(size, entry["sha256"])]
    else:
        pairs = [(length, digest) for length, digest in entry["segments"]]
        if any(length == 0 for length, _ in pairs):
            raise ValueError("an empty segment")
    if not _whole(size) or not all(_whole(n) and isinstance(d, str) and _DIGEST.fullmatch(d) for n, d in pairs):
        raise ValueError("a size or segment that is not a whole number of bytes with a digest")
    return size, tuple((n, d) for n, d in pairs if n)


def _whole(value: Any) -> bool:
    """A whole number of bytes: an int (not a bool, a float or a string), not negative."""
    return type(value) is int and value >= 0


def manifest_sha256(data: bytes) -> str:
    """The digest by which the platform knows a checkpoint: its manifest's bytes, hashed."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class StoredCheckpoint:
    """A complete checkpoint in S3."""

    bucket: str
    prefix: str
    """The checkpoint's directory, ``<location>step-<N>/``."""
    location: str
    """The prefix its ``step-<N>/`` directories live under: the run's, or a tuning trial's under the run's."""
    step: int
    manifest_sha256: str
    files: dict[str, int]
    """Every object of the checkpoint, the manifest included, by name, with its size."""
    written_at: datetime
    """When its manifest was written."""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def summary(self) -> dict[str, Any]:
        """What a poll reports of it (JobProgress.checkpoint)."""
        return {
            "step": self.step,
            "uri": self.uri,
            "written_at": self.written_at.astimezone(UTC).isoformat(),
            "manifest_sha256": self.manifest_sha256,
        }


@dataclass(frozen=True)
class Listing:
    """The checkpoint directories under a prefix, judged: the complete ones and why the others are not."""

    complete: list[StoredCheckpoint]
    """Newest first (by step; ties by location)."""
    incomplete: dict[str, str]
    """Directory prefix -> why it is not a complete checkpoint."""
    directories: dict[str, list[str]]
    """Directory prefix -> the keys of every object in it."""


def list_checkpoints(s3: Any, bucket: str, prefix: str) -> Listing:
    """Every checkpoint directory under `prefix` (at any depth), judged by the manifest rule above."""
    directories: dict[str, dict[str, dict[str, Any]]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            match = _IN_CHECKPOINT.match(obj["Key"][len(prefix) :])
            if match is not None:
                directory = f"{prefix}{match['location']}step-{match['step']}/"
                directories.setdefault(directory, {})[match["name"]] = obj
    complete: list[StoredCheckpoint] = []
    incomplete: dict[str, str] = {}
    for directory, objects in directories.items():
        judged = _judge(s3, bucket, directory, objects)
        if isinstance(judged, str):
            incomplete[directory] = judged
        else:
            complete.append(judged)
    complete.sort(key=lambda c: (c.step, c.location), reverse=True)
    keys = {directory: sorted(obj["Key"] for obj in objects.values()) for directory, objects in directories.items()}
    return Listing(complete=complete, incomplete=incomplete, directories=keys)


def complete_checkpoints(s3: Any, bucket: str, prefix: str) -> list[StoredCheckpoint]:
    """The complete checkpoints under `prefix`, newest first."""
    return list_checkpoints(s3, bucket, prefix).complete


def _judge(s3: Any, bucket: str, directory: str, objects: dict[str, dict[str, Any]]) -> StoredCheckpoint | str:
    """The complete checkpoint in `directory`, or why it is not one."""
    if MANIFEST not in objects:
        return f"no {MANIFEST}"
    try:
        data = s3.get_object(Bucket=bucket, Key=f"{directory}{MANIFEST}")["Body"].read()
    except s3.exceptions.NoSuchKey:  # deleted since the listing
        return f"no {MANIFEST}"
    try:
        manifest = Manifest.parse(data)
    except ManifestError as exc:
        return str(exc)
    sizes = {name: int(obj["Size"]) for name, obj in objects.items()}
    problem = manifest.incomplete(sizes)
    if problem is not None:
        return problem
    match = _IN_CHECKPOINT.match(f"{directory}{MANIFEST}")
    assert match is not None
    return StoredCheckpoint(
        bucket=bucket,
        prefix=directory,
        location=match["location"],
        step=int(match["step"]),
        manifest_sha256=manifest_sha256(data),
        files={name: sizes[name] for name in (*manifest.files, MANIFEST)},
        written_at=objects[MANIFEST]["LastModified"],
    )


def newest_per_location(checkpoints: list[StoredCheckpoint]) -> dict[str, StoredCheckpoint]:
    """The newest complete checkpoint of each location (the run's own, or each tuning trial's)."""
    newest: dict[str, StoredCheckpoint] = {}
    for checkpoint in checkpoints:  # newest first
        newest.setdefault(checkpoint.location, checkpoint)
    return newest

"""Checkpoints in S3 as the trainer and SageMaker's upload leave them, for tests of what reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from blake3 import blake3
from moto import mock_aws

from contract.layout import MANIFEST, run_checkpoints
from contract.stored_checkpoints import DCP_METADATA, FORMAT_VERSION, manifest_sha256

FILES = {DCP_METADATA: b"metadata", "__0_0.distcp": b"shard of rank 0"}
CHECKPOINTS, ARTIFACTS = "checkpoints", "artifacts"
RUN = run_checkpoints("r-1")
"""A run's checkpoint prefix, for tests of one run."""


@contextmanager
def buckets(*names: str) -> Iterator[Any]:
    """An S3 client of moto's, with these buckets created (the checkpoints bucket by default)."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        for name in names or (CHECKPOINTS,):
            client.create_bucket(Bucket=name)
        yield client


def manifest_of(files: dict[str, bytes], *, step: int, world_size: int = 1) -> bytes:
    """A manifest listing `files` with their sizes and segments (one per file here), as training/checkpoint/writer.py
    writes it."""
    listed = {
        name: {"size": len(body), "segments": [[len(body), blake3(body).hexdigest()]] if body else []}
        for name, body in files.items()
    }
    return json.dumps({"format": FORMAT_VERSION, "step": step, "world_size": world_size, "files": listed}).encode()


def put_checkpoint(
    s3: Any,
    bucket: str,
    location: str,
    step: int,
    *,
    files: dict[str, bytes] | None = None,
    manifest: bytes | None = None,
    omit: tuple[str, ...] = (),
) -> str:
    """Upload checkpoint `step` under `location` (a prefix ending in "/"), its files first; its manifest's digest.

    `manifest` replaces the one that lists `files`; `omit` names listed files left out (a partial upload).
    """
    files = dict(FILES if files is None else files)
    body = manifest if manifest is not None else manifest_of(files, step=step)
    for name, data in files.items():
        if name not in omit:
            s3.put_object(Bucket=bucket, Key=f"{location}step-{step}/{name}", Body=data)
    s3.put_object(Bucket=bucket, Key=f"{location}step-{step}/{MANIFEST}", Body=body)
    return manifest_sha256(body)

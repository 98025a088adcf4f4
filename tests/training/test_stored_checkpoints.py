"""One rule for a complete checkpoint in S3: manifest present and parsed, every listed file there at its size."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from contract.layout import MANIFEST
from contract.stored_checkpoints import DCP_METADATA, Manifest, ManifestError, list_checkpoints
from tests.stored import CHECKPOINTS as BUCKET
from tests.stored import FILES, RUN, buckets, manifest_of, put_checkpoint


@pytest.fixture
def s3() -> Iterator[Any]:
    with buckets() as client:
        yield client


def test_complete_checkpoints_are_newest_first_with_their_manifest_digest(s3: Any) -> None:
    digests = {step: put_checkpoint(s3, BUCKET, RUN, step) for step in (10, 30, 20)}
    listing = list_checkpoints(s3, BUCKET, RUN)
    assert [(c.step, c.manifest_sha256) for c in listing.complete] == [(s, digests[s]) for s in (30, 20, 10)]
    newest = listing.complete[0]
    assert (newest.prefix, newest.location) == (f"{RUN}step-30/", RUN)
    assert newest.files == {**{n: len(b) for n, b in FILES.items()}, MANIFEST: len(manifest_of(FILES, step=30))}
    assert listing.incomplete == {}


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        ({"omit": ("__0_0.distcp",)}, "__0_0.distcp is missing"),
        ({"omit": (DCP_METADATA,)}, ".metadata is missing"),
        ({"manifest": manifest_of({**FILES, "__0_0.distcp": b"longer than what arrived"}, step=20)}, "truncated"),
        ({"manifest": manifest_of({**FILES, "__0_0.distcp": b"x"}, step=20)}, "has 15 bytes, its manifest 1"),
        ({"manifest": b"{not json"}, "unreadable manifest"),
        ({"manifest": json.dumps({"format": 1, "files": {}}).encode()}, "unknown format"),
        ({"manifest": manifest_of({"__0_0.distcp": b"shard of rank 0"}, step=20)}, "unknown format"),
        ({"manifest": manifest_of({**FILES, "../step-10/.metadata": b"metadata"}, step=20)}, "outside"),
    ],
    ids=[
        "file-missing",
        "metadata-missing",
        "truncated",
        "wrong-size",
        "unparseable",
        "old-format",
        "no-metadata",
        "escapes-directory",
    ],
)
def test_a_checkpoint_short_of_its_manifest_is_not_complete(s3: Any, plant: dict[str, Any], why: str) -> None:
    put_checkpoint(s3, BUCKET, RUN, 10)
    put_checkpoint(s3, BUCKET, RUN, 20, **plant)
    listing = list_checkpoints(s3, BUCKET, RUN)
    assert [c.step for c in listing.complete] == [10]
    assert why in listing.incomplete[f"{RUN}step-20/"]


def test_a_directory_without_its_manifest_is_listed_as_incomplete(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{RUN}step-5/__0_0.distcp", Body=b"x")
    listing = list_checkpoints(s3, BUCKET, RUN)
    assert (listing.complete, listing.incomplete) == ([], {f"{RUN}step-5/": f"no {MANIFEST}"})
    assert listing.directories == {f"{RUN}step-5/": [f"{RUN}step-5/__0_0.distcp"]}


def test_tuning_trials_are_locations_of_their_own(s3: Any) -> None:
    put_checkpoint(s3, BUCKET, f"{RUN}tune-001-aa/", 40)
    put_checkpoint(s3, BUCKET, f"{RUN}tune-002-bb/", 10)
    listing = list_checkpoints(s3, BUCKET, RUN)
    assert [(c.location, c.step) for c in listing.complete] == [(f"{RUN}tune-001-aa/", 40), (f"{RUN}tune-002-bb/", 10)]


def test_the_manifest_rule_names_what_is_wrong() -> None:
    manifest = Manifest.parse(manifest_of(FILES, step=1))
    assert manifest.incomplete({n: len(b) for n, b in FILES.items()}) is None
    assert manifest.incomplete({DCP_METADATA: 8}) == "__0_0.distcp is missing"
    with pytest.raises(ManifestError, match="unknown format"):
        Manifest.parse(b'{"format": 2, "files": []}')
    with pytest.raises(ManifestError, match="unknown format"):
        Manifest.parse(json.dumps({"format": 5, "files": {DCP_METADATA: {"size": 0, "segments": []}}}))


def test_a_manifest_with_one_sha256_per_file_lists_it_as_the_files_only_segment() -> None:
    """Format 2, written before segments, is still read."""
    old = {
        "format": 2,
        "files": {DCP_METADATA: {"size": 8, "sha256": "a" * 64}, "__0_0.distcp": {"size": 0, "sha256": "b" * 64}},
    }
    manifest = Manifest.parse(json.dumps(old))
    assert manifest.files == {DCP_METADATA: (8, ((8, "a" * 64),)), "__0_0.distcp": (0, ())}
    assert manifest.hashed_with == "sha256"


@pytest.mark.parametrize(("version", "hashed_with"), [(3, "sha256"), (4, "blake3")])
def test_a_manifest_names_the_hash_of_its_segments_by_its_format(version: int, hashed_with: str) -> None:
    """Format 4 lists BLAKE3 digests; format 3, the same segments with SHA-256, is still read."""
    listed = {"format": version, "files": {DCP_METADATA: {"size": 8, "segments": [[5, "a" * 64], [3, "b" * 64]]}}}
    manifest = Manifest.parse(json.dumps(listed))
    assert manifest.files == {DCP_METADATA: (8, ((5, "a" * 64), (3, "b" * 64)))}
    assert manifest.hashed_with == hashed_with


@pytest.mark.parametrize(
    ("segments", "why"),
    [
        ([[4, "a" * 64]], "segments of .metadata do not add up to the file's size"),
        ([[4, "a" * 64], [4, "a" * 64], [1, "a" * 64]], "do not add up"),
        ([[8, "not a digest"]], "unreadable manifest"),
        ([[0, "a" * 64], [8, "a" * 64]], "unreadable manifest"),
        ([8, "a" * 64], "unreadable manifest"),
        ([[8, "a" * 64 + "\n"]], "unreadable manifest"),
        ([[True, "a" * 64], [7, "a" * 64]], "unreadable manifest"),
        ([[8.0, "a" * 64]], "unreadable manifest"),
        ([["8", "a" * 64]], "unreadable manifest"),
    ],
    ids=["short", "long", "not-a-digest", "empty-segment", "not-pairs", "digest-and-newline", "bool", "float", "text"],
)
def test_a_manifest_whose_segments_do_not_describe_the_file_is_refused(segments: Any, why: str) -> None:
    manifest = {"format": 3, "files": {DCP_METADATA: {"size": 8, "segments": segments}}}
    with pytest.raises(ManifestError, match=why):
        Manifest.parse(json.dumps(manifest))


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ({"format": 2.0, "files": {DCP_METADATA: {"size": 8, "sha256": "a" * 64}}}, "unknown format"),
        ({"format": True, "files": {DCP_METADATA: {"size": 8, "sha256": "a" * 64}}}, "unknown format"),
        ({"format": 2, "files": {DCP_METADATA: {"size": 8, "sha256": "a" * 64}, "x": {"size": 0}}}, "unreadable"),
        ({"format": 2, "files": {DCP_METADATA: {"size": "8", "sha256": "a" * 64}}}, "unreadable"),
        ({"format": 3, "files": {DCP_METADATA: {"size": -1, "segments": []}}}, "unreadable"),
    ],
    ids=["format-float", "format-bool", "empty-file-no-digest", "size-text", "size-negative"],
)
def test_a_manifest_entry_that_is_not_a_size_with_digests_is_refused(manifest: dict[str, Any], why: str) -> None:
    with pytest.raises(ManifestError, match=why):
        Manifest.parse(json.dumps(manifest))

"""Every location a request names is read once, in its normal form (contract/layout.py `location`), and a team's run
can never be resolved into a mount or an S3 prefix outside its own dataset prefixes, on any backend.

The attacks are generated: folders of empty, `.`, `..`, percent-encoded, blank and wildcard segments around the teams'
own, in both forms (s3:// and fsx://), with and without a last '/'. Each is either refused, or every channel of the
request it resolves to (what every backend's job receives: SageMaker's InputDataConfig, the queued payload, the
tuning job's definition, the Batch nodes' channels) reads under the run's team's prefixes, and a run of no team
reads no team's data.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from contract.layout import FSX_DATASETS, Location, LocationError, dataset_prefix, location, normal_key
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import resolve
from tests.lambdas.test_teams import BUCKET, LIMITS, P4D, VISION_SCIENTIST

SEGMENTS = ["", ".", "..", "vision", "language", "%2e%2e", "%2F", "vision%2F..", " ", "*", "?x", "#", "\\", "..."]
ATTACKS = sorted(
    {
        f"{root}{'/'.join(parts)}{end}"
        for root in (f"s3://{BUCKET}/", f"fsx://{FSX_DATASETS}")
        for size in (1, 2, 3)
        for parts in itertools.product(SEGMENTS, repeat=size)
        if size < 3 or parts[0] == "vision"
        for end in ("", "/")
    }
)
TEAM_PREFIXES = {"vision": ("vision/",), "language": ("language/",)}
MOUNT = f"/{LIMITS.fsx_mount_name}{FSX_DATASETS}"


@pytest.mark.parametrize(
    ("uri", "normal"),
    [
        ("s3://bucket-a/x/y/", Location("bucket-a", "x/y/")),
        ("s3://bucket-a/x/y", Location("bucket-a", "x/y/")),
        ("fsx:///datasets/x", Location("", "/datasets/x/")),
        ("s3://bucket-a/k=v/(1)/it's!/", Location("bucket-a", "k=v/(1)/it's!/")),
    ],
)
def test_a_location_in_its_normal_form_is_read_as_written(uri: str, normal: Location) -> None:
    assert location(uri) == normal
    assert normal.uri == uri if uri.endswith("/") else normal.uri == f"{uri}/"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket-a",
        "s3://bucket-a/",
        "s3://bucket-a//",
        "s3://bucket-a//x/",
        "s3://bucket-a/x//y/",
        "s3://bucket-a/x/./",
        "s3://bucket-a/x/../",
        "s3://bucket-a/x/%2e%2e/",
        "s3://bucket-a/x%2Fy/",
        "s3://bucket-a/x/ ",
        "s3://bucket-a/x\t/",
        "s3://bucket-a/x\\y/",
        "s3://bucket-a/x?/",
        "s3://bucket-a/x#/",
        "s3://bucket-a/x*/",
        "s3://bucket-a/x/\u00a0/",
        "s3://bucket-a/x/\u2215y/",
        "s3://Bucket-A/x/",
        "S3://bucket-a/x/",
        "fsx://",
        "fsx:///",
        "fsx:////",
        "fsx://host/x/",
        "fsx:///x/./",
        "fsx:///x/../y/",
        "http://bucket-a/x/",
    ],
)
def test_a_location_written_otherwise_than_it_reads_or_naming_a_root_is_refused(uri: str) -> None:
    with pytest.raises(LocationError, match=r"write|give|names a root|use letters"):
        location(uri)


def test_an_object_is_told_from_a_folder() -> None:
    assert location("s3://bucket-a/code/run.tar.gz", folder=False) == Location("bucket-a", "code/run.tar.gz")
    with pytest.raises(LocationError, match="names a folder"):
        location("s3://bucket-a/code/", folder=False)
    assert normal_key("a/b") == "a/b/" and normal_key("a/b", folder=False) == "a/b"


def test_a_dataset_is_a_folder_of_the_datasets_bucket_in_either_form() -> None:
    assert dataset_prefix(f"s3://{BUCKET}/vision/frames", datasets_bucket=BUCKET) == "vision/frames/"
    assert dataset_prefix("fsx:///datasets/vision/frames/", datasets_bucket=BUCKET) == "vision/frames/"
    for uri in ("fsx:///datasets/", "fsx:///home/vision/", "s3://another-bucket/vision/"):
        with pytest.raises(LocationError):
            dataset_prefix(uri, datasets_bucket=BUCKET)


def _reads(channel: dict[str, Any]) -> str:
    """The datasets-bucket key prefix a channel reads, from what the job receives."""
    source = channel["DataSource"]
    if "FileSystemDataSource" in source:
        path = source["FileSystemDataSource"]["DirectoryPath"]
        assert path.startswith(MOUNT), path
        return path.removeprefix(MOUNT) + "/"
    uri = source["S3DataSource"]["S3Uri"]
    assert uri.startswith(f"s3://{BUCKET}/"), uri
    return uri.removeprefix(f"s3://{BUCKET}/")


BACKENDS = {
    "sagemaker": {"instance_type": P4D, "instance_count": 2},
    "queue": {"instance_type": P4D, "instance_count": 2, "backend": "queue"},
    "batch": {"instance_type": "ml.p5.48xlarge", "instance_count": 2, "backend": "batch"},
    "tuning": {
        "instance_type": P4D,
        "instance_count": 1,
        "tuning": {
            "ranges": {"lr": {"type": "continuous", "min": 0.0001, "max": 0.01}},
            "objective": {"metric": "validation:loss", "type": "Minimize"},
            "max_jobs": 2,
            "max_parallel_jobs": 1,
        },
    },
}


@pytest.mark.parametrize(
    ("backend", "team"),
    [(backend, team) for backend in sorted(BACKENDS) for team in ("vision", None) if team or backend != "queue"],
)
def test_no_run_reads_outside_its_teams_prefixes_on_any_backend(backend: str, team: str | None) -> None:
    accepted = 0
    for uri, field in itertools.product(ATTACKS, ("dataset", "validation_dataset")):
        event = {
            "run_name": "attack-run",
            "dataset": f"s3://{BUCKET}/vision/frames/" if team else f"s3://{BUCKET}/corpus/",
            field: uri,
            "max_runtime_hours": 2,
            **({"team": team} if team else {}),
            **BACKENDS[backend],
        }
        try:
            request = resolve(event, execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST)
        except InvalidRequest:
            continue
        accepted += 1
        channels = [c for c in request["channels"] if c["ChannelName"] in ("train", "validation")]
        assert len(channels) == 2 if field == "validation_dataset" else len(channels) == 1, (uri, channels)
        for read in map(_reads, channels):
            if team:
                assert read.startswith(TEAM_PREFIXES[team]), (uri, read)
            else:
                owned = [p for prefixes in TEAM_PREFIXES.values() for p in prefixes]
                assert not any(read.startswith(p) or p.startswith(read) for p in owned), (uri, read)
    assert accepted > 0, "no attack location was a folder written as it reads: the property held for nothing"

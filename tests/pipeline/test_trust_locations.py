"""A team's run never reads outside its own dataset prefixes, on any backend: a location that reduces to a root or
to another folder than it names is refused before anything is created (tests/lambdas/test_locations.py generates
the attacks against Validate's resolution; here the deployed pipeline, IAM enforced, acts some of them out).

The platform is examples/teams.json's: team-a (TeamAScientist, listed) reads team-a/, team-b reads team-b/.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from botocore.client import BaseClient

from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED
from tests.pipeline.test_queue import (
    TEAM_A,
    team_input,
    teams,  # noqa: F401 (the fixture's definition)
)

CREATES = {"CreateTrainingJob", "CreateHyperParameterTuningJob", "SubmitJob", "SubmitServiceJob"}
BACKENDS = {
    "sagemaker": {"backend": "sagemaker", "priority": None},
    "batch": {"backend": "batch", "priority": None, "instance_type": "ml.p5.48xlarge"},
    "queue": {},
    "tuning": {
        "backend": "sagemaker",
        "priority": None,
        "tuning": {
            "ranges": {"lr": {"type": "continuous", "min": 0.0001, "max": 0.01}},
            "objective": {"metric": "validation:loss", "type": "Minimize"},
            "max_jobs": 2,
            "max_parallel_jobs": 1,
        },
    },
}


@contextmanager
def creates() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every call that would create or queue a job, as the state machine sent it."""
    sent: list[tuple[str, dict[str, Any]]] = []
    original = BaseClient._make_api_call

    def record(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if operation in CREATES:
            sent.append((operation, copy.deepcopy(params)))
        return original(client, operation, params)

    with mock.patch.object(BaseClient, "_make_api_call", record):
        yield sent


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("field", "where"),
    [
        ("dataset", "fsx:///datasets/./"),
        ("validation_dataset", "s3://{bucket}/team-a/../team-b/held-out/"),
    ],
)
def test_a_location_that_escapes_the_teams_prefixes_creates_nothing_on_any_backend(
    teams: Any,  # noqa: F811
    backend: str,
    field: str,
    where: str,
) -> None:
    pipeline = teams([[Poll(), COMPLETED]])
    uri = where.format(bucket=pipeline.datasets_bucket)
    execution_input = {k: v for k, v in team_input(pipeline, "team-a", "escape", **BACKENDS[backend]).items() if v}
    execution_input[field] = uri
    with creates() as sent:
        described = pipeline.finish(pipeline.start(execution_input, requester=TEAM_A))
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "InvalidRequest"), cause
    assert f"{field} {uri!r}" in cause and "written as it is read" in cause, cause
    assert sent == [] and pipeline.jobs() == []


def test_a_teams_run_mounts_its_own_folder_and_nothing_above_it(teams: Any) -> None:  # noqa: F811
    pipeline = teams([[Poll(), COMPLETED]])
    execution_input = team_input(pipeline, "team-a", "own-data", backend="sagemaker", priority=None)
    execution_input = {
        **{k: v for k, v in execution_input.items() if v is not None},
        "dataset": "fsx:///datasets/team-a/corpus",
        "validation_dataset": f"s3://{pipeline.datasets_bucket}/team-a/held-out/",
    }
    with creates() as sent:
        arn = pipeline.start(execution_input, requester=TEAM_A)
        pipeline.run_until(arn, "Wait for training")
    ((operation, params),) = sent
    assert operation == "CreateTrainingJob"
    sources = {c["ChannelName"]: c["DataSource"] for c in params["InputDataConfig"]}
    mount = sources["train"]["FileSystemDataSource"]["DirectoryPath"]
    assert mount.endswith("/datasets/team-a/corpus") and mount.count("/") == 4, mount
    assert sources["validation"]["S3DataSource"]["S3Uri"] == f"s3://{pipeline.datasets_bucket}/team-a/held-out/"

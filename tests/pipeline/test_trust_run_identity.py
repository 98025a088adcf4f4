"""A run's identity is its own: another execution's job is never adopted, its lineage never rewritten.

Executed in the local platform with IAM enforced. Two executions whose names hash alike under the
name-only identity (forced here, as a birthday search finds in minutes) must still get different
jobs and prefixes; a job of the attempt's name that another execution owns fails the run, naming it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from unittest import mock

import boto3
import pytest
from moto.sagemaker.exceptions import SagemakerClientError
from moto.sagemaker.responses import SageMakerResponse

from contract.service_requests import EXECUTION_TAG
from lambdas.validate import request as request_module
from localrun.aws.cfn import REGION
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_batch import batch_factory  # noqa: F401 (the fixture's definition)

VICTIM, ATTACKER = "approved-run", "cheap-run"


class _CollidingSha256:
    """hashlib with the two execution names' digests made equal (what a found collision gives)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(hashlib, name)

    @staticmethod
    def sha256(data: bytes = b"") -> Any:
        return hashlib.sha256(VICTIM.encode() if data == ATTACKER.encode() else data)


@pytest.fixture
def colliding_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_module, "hashlib", _CollidingSha256())
    assert _CollidingSha256.sha256(ATTACKER.encode()).hexdigest() == hashlib.sha256(VICTIM.encode()).hexdigest()


def _lineages(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    keys = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket=bucket, Prefix="runs/").get("Contents", [])
        if o["Key"].endswith("lineage/lineage.json")
    ]
    return {key: json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in keys}


def _checkpoints(pipeline: Pipeline) -> list[str]:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="runs/").get("Contents", []))


def _checkpointed(name: str, _request: dict[str, Any], _job: Any) -> None:
    """Each job writes one complete checkpoint under its run's prefix."""
    s3 = boto3.client("s3", region_name=REGION)
    bucket = _checkpointed.bucket  # type: ignore[attr-defined]
    prefix = f"runs/{name.rsplit('-', 1)[0]}/checkpoints/step-10"
    for file in ("model.distcp", "manifest.json"):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{file}", Body=name.encode())


def test_colliding_execution_names_neither_adopt_nor_rewrite_nor_prune(
    pipeline_factory: Any, colliding_names: None
) -> None:
    pipeline = pipeline_factory(scripts=[[Poll(), COMPLETED], [Poll(), COMPLETED]])
    _checkpointed.bucket = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]  # type: ignore[attr-defined]
    pipeline.training.on_create.append(_checkpointed)
    # The approved run finishes and registers its model.
    victim = pipeline.start(pipeline.input(), name=VICTIM)
    pipeline.run_until(victim, "Approval gate (promotion)")
    (victim_job,) = pipeline.jobs()
    (victim_lineage,) = _lineages(pipeline).items()
    victim_checkpoints = _checkpoints(pipeline)
    assert victim_lineage[1]["execution"] == victim and victim_checkpoints

    # A cheap run whose name-only identity collides runs the same run name.
    attacker = pipeline.start(pipeline.input(hyperparameters={"max_steps": 100, "lr": 0.001}), name=ATTACKER)
    pipeline.run_until(attacker, "Approval gate (promotion)")
    lineages = _lineages(pipeline)
    # The first run's lineage is as it was written; the second's is under its own prefix.
    assert lineages[victim_lineage[0]] == victim_lineage[1], "the first run's lineage was rewritten"
    # Its cleanup pruned its own prefix only: every checkpoint of the first run is still there.
    assert set(victim_checkpoints) <= set(_checkpoints(pipeline))
    states = pipeline.local.states_entered(attacker)
    assert "Adopt the created job" not in states, "the second execution adopted the first one's job"
    jobs = pipeline.jobs()
    assert len(jobs) == 2 and jobs[0] == victim_job and jobs[1].rsplit("-", 2)[1] != victim_job.rsplit("-", 2)[1]
    (attacker_lineage,) = [v for k, v in lineages.items() if k != victim_lineage[0]]
    assert attacker_lineage["execution"] == attacker and attacker_lineage["training_job"] == jobs[1]


def _foreign_then_in_use(other: str) -> Any:
    """The create happened but its answer was lost, and the job of that name is tagged with `other`."""
    calls = {"n": 0}

    def hook(_name: str, _request: dict[str, Any], job: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 1:
            return
        job.tags = [t for t in job.tags if t["Key"] != EXECUTION_TAG] + [{"Key": EXECUTION_TAG, "Value": other}]
        raise SagemakerClientError("ThrottlingException", "Rate exceeded")

    return hook


def test_a_job_of_another_execution_is_not_adopted(pipeline: Pipeline) -> None:
    other = "arn:aws:states:us-east-1:123456789012:execution:elsewhere:someone-else"
    pipeline.training.on_create.append(_foreign_then_in_use(other))
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    states = pipeline.local.states_entered(arn)
    assert "Adopt the created job" not in states
    assert "Existing training job is not the one asked for" in states
    (job,) = pipeline.jobs()
    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert f"A training job named {job} already exists" in cause, (error, cause)
    assert f"tag {EXECUTION_TAG} is {other!r}, asked {arn!r}" in cause
    assert not _lineages(pipeline)


def test_a_batch_job_of_another_execution_is_not_adopted(batch_factory: Any) -> None:  # noqa: F811
    other = "arn:aws:states:us-east-1:123456789012:execution:elsewhere:someone-else"
    # The submit creates its job (which waits for capacity) and loses the answer; the job found by this
    # attempt's name on the queue is another execution's.
    pipeline = batch_factory(lose_submit_responses=1, no_capacity_for=1)
    submit = pipeline.batch.submit

    def submit_foreign(params: dict[str, Any]) -> dict[str, str]:
        try:
            return submit(params)  # type: ignore[no-any-return]
        finally:
            for job in pipeline.batch.jobs.values():
                job.tags = {**job.tags, EXECUTION_TAG: other}

    pipeline.batch.submit = submit_foreign
    arn = pipeline.start(pipeline.batch_input())
    described = pipeline.finish(arn, timeout=60)
    states = pipeline.local.states_entered(arn)
    assert "Find submitted Batch job" in states and "Adopt the submitted Batch job" not in states, states
    assert "Existing Batch job is not the one asked for" in states
    (job,) = pipeline.batch.jobs.values()
    assert described["status"] == "FAILED"
    assert f"A batch job named {job.name} already exists" in pipeline.error(described)[1]
    assert job.terminating is None  # the run's cleanup leaves the other execution's job alone


def test_a_tuning_job_of_another_execution_is_not_adopted(pipeline: Pipeline) -> None:
    other = "arn:aws:states:us-east-1:123456789012:execution:elsewhere:someone-else"
    create = SageMakerResponse.create_hyper_parameter_tuning_job  # the local platform's
    calls = {"n": 0}

    def foreign_then_lost(response: Any) -> Any:
        result = create(response)
        calls["n"] += 1
        if calls["n"] == 1:  # created, tagged with another execution, and the answer lost
            for record in response.sagemaker_backend.hyper_parameter_tuning_jobs.values():
                record.tags = [t for t in record.tags if t["Key"] != EXECUTION_TAG]
                record.tags.append({"Key": EXECUTION_TAG, "Value": other})
            raise SagemakerClientError("ThrottlingException", "Rate exceeded")
        return result

    tuning = {
        "ranges": {"lr": {"type": "continuous", "min": 0.0001, "max": 0.01}},
        "objective": {"metric": "validation:loss", "type": "Minimize"},
        "max_jobs": 2,
        "max_parallel_jobs": 1,
    }
    with mock.patch.object(SageMakerResponse, "create_hyper_parameter_tuning_job", foreign_then_lost):
        arn = pipeline.start(pipeline.input(hyperparameters={"max_steps": 100}, tuning=tuning))
        described = pipeline.finish(arn)
    states = pipeline.local.states_entered(arn)
    assert "Adopt the created tuning job" not in states, states
    assert "Existing tuning job is not the one asked for" in states
    assert described["status"] == "FAILED"
    (name,) = pipeline.local.tuning.jobs
    assert f"A tuning job named {name} already exists" in pipeline.error(described)[1]

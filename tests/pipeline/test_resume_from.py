"""`resume_from`: a run that ended resumes in a new execution from its newest checkpoint the platform recorded.

Acted out in the local platform with IAM enforced: the first run's job uploads checkpoints as SageMaker
does and fails for good; the second run names it and starts from its newest complete, recorded
checkpoint, which is copied into the new run's prefix and recorded in its ledger; lineage keeps the chain.
"""

from __future__ import annotations

from typing import Any

import boto3

from contract import ledger
from contract.layout import run_checkpoints, split_s3_uri
from contract.stored_checkpoints import complete_checkpoints
from localrun.aws.iam import SAGEMAKER
from localrun.backends.scripted import Poll
from tests.conftest import APPROVER
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_trust_storage import _s3_as
from tests.stored import put_checkpoint

CRASH = Poll("Failed", "Failed", failure_reason="AlgorithmError: loss became NaN")


class Uploads:
    """The first run's job, uploading checkpoints through SageMaker's session of the training role."""

    def __init__(self) -> None:
        self.s3: Any = None
        self.digests: dict[int, str] = {}

    def __call__(self, step: int, **partial: Any) -> Any:
        def effect(_name: str, request: dict[str, Any]) -> None:
            bucket, prefix = split_s3_uri(request["CheckpointConfig"]["S3Uri"])
            self.digests[step] = put_checkpoint(self.s3, bucket, prefix, step, **partial)

        return effect


def _first_run(pipeline_factory: Any, *, later: list[list[Poll]]) -> tuple[Pipeline, Uploads, str]:
    """A run whose job recorded step-10 and step-20, then uploaded a partial step-30 and crashed."""
    uploads = Uploads()
    pipeline: Pipeline = pipeline_factory(
        scripts=[
            [
                Poll(effect=uploads(10)),
                Poll(effect=uploads(20)),
                Poll(effect=uploads(30, omit=("__0_0.distcp",))),
                CRASH,
            ],
            *later,
        ]
    )
    uploads.s3 = _s3_as(pipeline, SAGEMAKER)
    first = pipeline.start(pipeline.input(), name="first")
    assert pipeline.finish(first)["status"] == "FAILED"
    return pipeline, uploads, first


def test_a_failed_run_resumes_from_its_newest_recorded_checkpoint(pipeline_factory: Any) -> None:
    pipeline, uploads, first = _first_run(pipeline_factory, later=[[Poll(), COMPLETED]])
    second = pipeline.start(pipeline.input(resume_from=first), name="second")
    pipeline.run_until(second, "Approval gate (promotion)")
    old_job, new_job = pipeline.jobs()
    old_run, new_run = old_job.rsplit("-", 1)[0], new_job.rsplit("-", 1)[0]
    assert old_run != new_run

    s3 = boto3.client("s3", region_name="us-east-1")
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    artifacts = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    (carried,) = complete_checkpoints(s3, checkpoints, run_checkpoints(new_run))
    assert (carried.step, carried.manifest_sha256) == (20, uploads.digests[20])
    (record,) = ledger.records(s3, artifacts, new_run)
    assert (record.step, record.manifest_sha256, record.job) == (
        20,
        uploads.digests[20],
        f"copied from {old_run}",
    )

    pipeline.decide("promotion", "approve")
    assert pipeline.finish(second)["status"] == "SUCCEEDED"
    continued = pipeline.lineage()["continued_from"]
    assert continued == {
        "execution": first,
        "run": old_run,
        "step": 20,
        "manifest_sha256": uploads.digests[20],
        "earlier": [],
    }


def test_what_cannot_be_resumed_is_refused_at_validate_all_at_once(pipeline_factory: Any) -> None:
    pipeline, _uploads, first = _first_run(pipeline_factory, later=[[Poll()]])
    refused = pipeline.start(
        pipeline.input(resume_from=first, model="small", hyperparameters={"max_steps": 100, "lr": 0.0006}),
        name="other-model",
        requester=APPROVER,
    )
    described = pipeline.finish(refused)
    error, cause = pipeline.error(described)
    assert error == "InvalidRequest"
    assert "only the same requester may resume a run" in cause
    assert "model" in cause
    assert len(pipeline.jobs()) == 1  # nothing was created for the refused run

    unknown = pipeline.start(pipeline.input(resume_from="gpt2-small-0123456789abcdef"), name="unknown-run")
    assert "no run of that id has a checkpoint the platform recorded" in pipeline.error(pipeline.finish(unknown))[1]


def test_a_running_run_cannot_be_resumed(pipeline_factory: Any) -> None:
    pipeline: Pipeline = pipeline_factory(scripts=[[Poll()]])
    running = pipeline.start(pipeline.input(), name="running")
    pipeline.run_until(running, "Check progress")
    refused = pipeline.start(pipeline.input(resume_from=running), name="too-early")
    assert "the run is still RUNNING; stop it first" in pipeline.error(pipeline.finish(refused))[1]

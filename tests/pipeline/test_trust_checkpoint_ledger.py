"""A job loads only checkpoints the platform recorded of its run: the ledger, as the pipeline keeps and hands it on.

Acted out in the local platform with IAM enforced: the run's job uploads checkpoints as SageMaker does,
the Monitor records them, another run's code (the Batch job role, which can write any run's checkpoint
prefix) changes a recorded one, and the next attempt receives a ledger that still names only the original.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from contract import ledger
from contract.layout import LEDGER_CHANNEL, run_ledger, split_s3_uri
from contract.stored_checkpoints import complete_checkpoints
from localrun.aws.iam import SAGEMAKER
from localrun.backends.batch import ECS_TASKS
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_trust_storage import _s3_as
from tests.stored import put_checkpoint

CAPACITY = Poll("Failed", "Failed", failure_reason="CapacityError: Unable to provision requested ML compute capacity.")


class Run:
    """What the tests watch of one run: its job uploads, its ledger, the digests written."""

    def __init__(self) -> None:
        self.digests: dict[int, str] = {}
        self.uploader: Any = None
        """SageMaker's S3 client for the job: the training role's session."""

    @property
    def s3(self) -> Any:
        return boto3.client("s3", region_name="us-east-1")  # the operator's, once the platform is up

    def upload(self, step: int) -> Any:
        """A poll's effect: the job's checkpoint `step` reaches the run's prefix (SageMaker's upload)."""

        def effect(_name: str, request: dict[str, Any]) -> None:
            bucket, prefix = split_s3_uri(request["CheckpointConfig"]["S3Uri"])
            self.digests[step] = put_checkpoint(self.uploader, bucket, prefix, step)

        return effect


def test_a_recorded_checkpoint_changed_by_another_runs_code_stays_unloadable(pipeline_factory: Any) -> None:
    run = Run()
    attacker: dict[str, Any] = {}

    def tamper(_name: str, request: dict[str, Any]) -> None:
        """Another run's training code rewrites step-10 with a checkpoint whose own manifest checks out."""
        bucket, prefix = split_s3_uri(request["CheckpointConfig"]["S3Uri"])
        s3 = attacker["s3"]
        attacker["digest"] = put_checkpoint(s3, bucket, prefix, 10, files={".metadata": b"m", "__0_0.distcp": b"p"})

    pipeline: Pipeline = pipeline_factory(
        scripts=[
            [Poll(effect=run.upload(10)), Poll(effect=tamper), CAPACITY],
            [Poll(), COMPLETED],
        ]
    )
    attacker["s3"] = _s3_as(pipeline, ECS_TASKS)
    run.uploader = _s3_as(pipeline, SAGEMAKER)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    first, second = pipeline.jobs()
    artifacts = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    base = first.rsplit("-", 1)[0]

    (record,) = ledger.records(run.s3, artifacts, base)
    assert (record.checkpoint, record.manifest_sha256, record.job) == ("step-10/", run.digests[10], first)
    assert attacker["digest"] != run.digests[10]
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    (stored,) = complete_checkpoints(run.s3, checkpoints, f"runs/{base}/checkpoints/")
    assert stored.manifest_sha256 == attacker["digest"]  # what the next job would find in its prefix...
    # ...and the ledger its channel brings, which names only the original.
    channels = {c["ChannelName"]: c for c in pipeline.local.training_requests[second]["InputDataConfig"]}
    assert channels[LEDGER_CHANNEL]["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{artifacts}/{run_ledger(base)}"
    keys = [o["Key"] for o in run.s3.list_objects_v2(Bucket=artifacts, Prefix=run_ledger(base))["Contents"]]
    assert sorted(keys) == [f"{run_ledger(base)}opened.json", f"{run_ledger(base)}step-10.json"]


def test_the_end_of_run_prune_keeps_the_intact_checkpoint_a_changed_one_would_have_cost(pipeline_factory: Any) -> None:
    """Another run's code rewrites recorded step-10: the run can resume only from step-5, which the prune keeps (it
    used to keep the newest complete checkpoint, step-10 as changed, and delete step-5)."""
    run = Run()
    attacker: dict[str, Any] = {}

    def tamper(_name: str, request: dict[str, Any]) -> None:
        bucket, prefix = split_s3_uri(request["CheckpointConfig"]["S3Uri"])
        put_checkpoint(attacker["s3"], bucket, prefix, 10, files={".metadata": b"m", "__0_0.distcp": b"p"})

    failed = Poll("Failed", "Failed", failure_reason="AlgorithmError: the trainer exited 1")
    pipeline: Pipeline = pipeline_factory(
        scripts=[[Poll(effect=run.upload(5)), Poll(effect=run.upload(10)), Poll(effect=tamper), failed]]
    )
    attacker["s3"] = _s3_as(pipeline, ECS_TASKS)
    run.uploader = _s3_as(pipeline, SAGEMAKER)
    arn = pipeline.start(pipeline.input())
    assert pipeline.finish(arn)["status"] == "FAILED"
    (job,) = pipeline.jobs()
    base = job.rsplit("-", 1)[0]
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    prefix = f"runs/{base}/checkpoints/"
    keys = [o["Key"] for o in run.s3.list_objects_v2(Bucket=checkpoints, Prefix=prefix)["Contents"]]
    assert sorted({key.removeprefix(prefix).split("/")[0] for key in keys}) == ["step-10", "step-5"]
    artifacts = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    stored = complete_checkpoints(run.s3, checkpoints, prefix)
    resumable = ledger.resumable(stored, ledger.recorded(run.s3, artifacts, base), base)
    assert [(c.step, c.manifest_sha256) for c in resumable] == [(5, run.digests[5])]


@pytest.mark.parametrize("service", [SAGEMAKER, ECS_TASKS])
def test_training_roles_read_the_ledger_and_cannot_write_it(pipeline: Pipeline, service: str) -> None:
    artifacts = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    platform = boto3.client("s3", region_name="us-east-1")
    ledger.open_ledger(platform, artifacts, "victim-run", execution="arn:execution", continues=None)
    s3 = _s3_as(pipeline, service)
    listed = s3.list_objects_v2(Bucket=artifacts, Prefix=run_ledger("victim-run"))["Contents"]
    assert [o["Key"] for o in listed] == [f"{run_ledger('victim-run')}opened.json"]
    with pytest.raises(ClientError, match="not authorized to perform: s3:PutObject"):
        ledger.record(
            s3,
            artifacts,
            "victim-run",
            checkpoint="step-99/",
            step=99,
            manifest_sha256="0" * 64,
            job="victim-run-1",
            execution="arn:forged",
        )

"""The AWS Batch backend, executed: submit + poll, nodes that really train on localhost, IAM enforced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from localrun.batch_local import LocalBatch
from localrun.cfn import REGION
from localrun.corpus import build_shards
from localrun.engine import Clock, LocalPlatform
from localrun.scripted import ScriptedTraining
from tests.pipeline.conftest import Pipeline

CLUSTER_TYPE = "ml.p5.48xlarge"  # cdk.json's network.largest_cluster: the compute environment's type
LOCAL = {"model": "tiny", "batch_size": "4", "seq_len": "64", "optim.warmup_steps": "2"}


class BatchPipeline(Pipeline):
    def __init__(self, local: LocalPlatform, batch: LocalBatch) -> None:
        super().__init__(local, ScriptedTraining(scripts=[]))
        self.batch = batch

    def batch_input(self, **overrides: Any) -> dict[str, Any]:
        return self.input(
            **{
                "backend": "batch",
                "instance_type": CLUSTER_TYPE,
                "instance_count": 2,
                "hyperparameters": {
                    "max_steps": 12,
                    "optim.warmup_steps": 2,
                    "checkpoint.interval_steps": 4,
                    "eval.interval_steps": 6,
                    "eval.max_sequences": 8,
                    "metrics.log_interval": 2,
                },
                "quality": {"metric": "validation:loss", "max": 20.0},
                **overrides,
            }
        )

    def approve_launch(self, arn: str) -> None:
        self.decide("launch", "approve")

    def s3_keys(self, bucket_env: str, prefix: str) -> list[str]:
        bucket = self.local.environment("BatchMonitor")[bucket_env]
        listed = boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]


@pytest.fixture
def batch_factory(platform: Any, tmp_path: Path) -> Iterator[Any]:
    opened: list[LocalPlatform] = []
    shards = build_shards(tmp_path / "corpus")

    def make(**scenario: Any) -> BatchPipeline:
        batch = LocalBatch(root=tmp_path / "batch", datasets_bucket="", local_hyperparameters=LOCAL, **scenario)
        local = LocalPlatform(
            Path(platform.assembly.directory), training=ScriptedTraining(scripts=[]), batch=batch, clock=Clock()
        )
        opened.append(local.__enter__())
        pipeline = BatchPipeline(local, batch)
        batch.datasets_bucket = pipeline.datasets_bucket
        s3 = boto3.client("s3", region_name=REGION)
        for shard in shards:
            s3.upload_file(str(shard), pipeline.datasets_bucket, f"corpus/{shard.name}")
        return pipeline

    yield make
    for local in opened:
        local.__exit__(None, None, None)


def test_happy_path_trains_on_batch_nodes_and_registers(batch_factory: Any) -> None:
    pipeline = batch_factory()
    arn = pipeline.start(pipeline.batch_input())
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    states = pipeline.local.states_entered(arn)
    assert described["status"] == "SUCCEEDED", (pipeline.error(described), states, pipeline.local.iam.denials())
    assert "Submit Batch job" in states and "Check Batch progress" in states
    assert "Create training job" not in states  # the SageMaker path was not taken
    (job,) = pipeline.batch.jobs.values()
    assert job.name.endswith("-1") and job.num_nodes == 2 and len(job.attempts) == 1
    # Two launchers, one torchrun job: node 1 joined node 0's rendezvous.
    assert any("node 1 of 2" in line for line in job.log), "".join(job.log[-20:])
    output = json.loads(described["output"])
    assert output["job"]["status"] == "Completed"
    assert "validation:loss" in output["job"]["final_metrics"]
    assert output["job"]["model_artifacts"] == f"s3://{pipeline.local.environment('BatchMonitor')['ARTIFACTS_BUCKET']}/runs/{job.name}/output/model.tar.gz"
    assert output["job"]["cost"]["spot_savings_usd"] == 0.0
    base = job.name.rsplit("-", 1)[0]
    assert any(k.endswith("manifest.json") for k in pipeline.s3_keys("CHECKPOINTS_BUCKET", f"runs/{base}/checkpoints/"))
    (package,) = pipeline.model_packages()
    assert package["InferenceSpecification"]["Containers"][0]["ModelDataUrl"] == output["job"]["model_artifacts"]
    assert pipeline.local.iam.denials() == []

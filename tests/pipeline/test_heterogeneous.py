"""Heterogeneous clusters, executed: the request's groups reach CreateTrainingJob, IAM enforced, and the lineage."""

from __future__ import annotations

import json
from typing import Any

from contract.catalog import INSTANCE_TYPES
from tests.pipeline.conftest import Pipeline

GPU = {"name": "gpu", "instance_type": "ml.p4d.24xlarge", "instance_count": 2}
CPU = {"name": "cpu", "instance_type": "ml.c5.4xlarge", "instance_count": 1, "role": "auxiliary"}


def _created(pipeline: Pipeline) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = []
    pipeline.training.on_create.append(lambda _name, request, _job: requests.append(request))
    return requests


def _hetero(pipeline: Pipeline, groups: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    return (
        pipeline.input(instance_type=None, instance_count=None, instance_groups=groups, max_runtime_hours=1) | overrides
    )


def test_a_gpu_group_and_an_auxiliary_cpu_group_train_and_register(pipeline: Pipeline) -> None:
    created = _created(pipeline)
    dataset = f"s3://{pipeline.datasets_bucket}/corpus/"
    arn = pipeline.start(_hetero(pipeline, [GPU, CPU | {"channels": []}], dataset=dataset))
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)

    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    # p4d has instance-store NVMe: the job takes no volume key, under the mixed-cluster IAM statement.
    assert "Create training job (instance groups, instance storage)" in pipeline.local.states_entered(arn)
    (request,) = created
    assert request["ResourceConfig"]["InstanceGroups"] == [
        {"InstanceGroupName": "gpu", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "cpu", "InstanceType": "ml.c5.4xlarge", "InstanceCount": 1},
    ]
    assert "InstanceType" not in request["ResourceConfig"] and "VolumeKmsKeyId" not in request["ResourceConfig"]
    assert request["Environment"]["TRAINING_GROUPS"] == "gpu"
    assert request["Environment"]["TRAINING_EXPECTED_GPUS"] == "8"
    train, ledger = request["InputDataConfig"]
    assert "InstanceGroupNames" not in ledger["DataSource"]["S3DataSource"]  # every host gets the few records
    assert train["DataSource"]["S3DataSource"]["InstanceGroupNames"] == ["gpu"]

    output = json.loads(described["output"])
    hourly = 2 * INSTANCE_TYPES["ml.p4d.24xlarge"].price_per_hour + INSTANCE_TYPES["ml.c5.4xlarge"].price_per_hour
    assert output["estimate"]["hourly_usd"] == round(hourly, 4)
    cluster = pipeline.lineage()["cluster"]
    assert cluster["instance_count"] == 3 and [g["role"] for g in cluster["groups"]] == ["train", "auxiliary"]


def test_an_all_ebs_cluster_encrypts_its_volumes_with_the_platform_key(pipeline: Pipeline) -> None:
    created = _created(pipeline)
    groups = [GPU | {"instance_type": "ml.m5.xlarge"}, CPU]
    arn = pipeline.start(_hetero(pipeline, groups))
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)

    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert "Create training job (instance groups)" in pipeline.local.states_entered(arn)
    (request,) = created
    assert request["ResourceConfig"]["VolumeKmsKeyId"] == pipeline.local.training_key_arn()
    assert request["Environment"]["TRAINING_EXPECTED_GPUS"] == "0"


def test_bad_groups_end_the_run_before_anything_is_created(pipeline: Pipeline) -> None:
    groups = [GPU | {"role": "auxiliary"}, CPU | {"channels": ["labels"]}]
    described = pipeline.finish(pipeline.start(_hetero(pipeline, groups)))

    assert described["status"] == "FAILED"
    cause = json.loads(described["cause"]) if described["cause"].startswith("{") else described["cause"]
    assert "no group has role 'train'" in str(cause) and "channel 'labels' is not one of train, validation" in str(
        cause
    )
    assert pipeline.jobs() == []


def test_the_launch_approval_shows_every_group_and_the_summed_cost(pipeline: Pipeline) -> None:
    groups = [GPU | {"instance_type": "ml.p5.48xlarge"}, CPU]
    arn = pipeline.start(_hetero(pipeline, groups, max_runtime_hours=10))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    summary = json.loads(pipeline.pending("launch")["summary"])
    assert summary["instances"] == "2 x ml.p5.48xlarge (gpu) + 1 x ml.c5.4xlarge (cpu)"
    hourly = 2 * INSTANCE_TYPES["ml.p5.48xlarge"].price_per_hour + INSTANCE_TYPES["ml.c5.4xlarge"].price_per_hour
    assert float(summary["max_cost_usd"]) == round(hourly * 10, 2)
    pipeline.decide("launch", "reject", reason="not this quarter")
    assert pipeline.finish(arn)["status"] == "FAILED" and pipeline.jobs() == []

"""The adoption check's comparison (lambdas/jobs/adoption.py): a job is the one asked for only when every field of the
service's create request is as the platform built it, those it left unset included; a service's documented default
is the only value allowed beyond the request."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from contract.execution_state import TrainingRequest
from contract.service_requests import (
    RunState,
    ServiceRequest,
    create_training_job,
    create_tuning_job,
    submit_service_job,
)
from lambdas.jobs.adoption import _shape, differences
from lambdas.validate.api_requests import PLACEHOLDERS
from lambdas.validate.request import resolve
from tests.lambdas.test_teams import BUCKET, LIMITS, VISION_SCIENTIST

EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:p:run-1"


def _request(**changes: Any) -> TrainingRequest:
    event = {
        "run_name": "adopt-me",
        "dataset": f"s3://{BUCKET}/vision/frames/",
        "validation_dataset": "fsx:///datasets/vision/held-out/",
        "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2,
        "max_runtime_hours": 2,
        "team": "vision",
        "backend": "queue",
        **changes,
    }
    resolved = resolve(event, execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST, execution=EXECUTION)
    return TrainingRequest.parse(resolved)


def _sent(call: ServiceRequest, request: TrainingRequest) -> dict[str, Any]:
    """What the state machine sends for the request's first attempt."""
    return call.values(RunState(request, 1, PLACEHOLDERS.execution))


def _as_described(asked: dict[str, Any]) -> dict[str, Any]:
    """What SageMaker's DescribeTrainingJob answers for that request (its defaults filled in), less the tags."""
    described = copy.deepcopy({k: v for k, v in asked.items() if k != "Tags"})
    for channel in described["InputDataConfig"]:
        channel |= {"CompressionType": "None", "RecordWrapperType": "None"}
    described["OutputDataConfig"]["CompressionType"] = "GZIP"
    described["ProfilerConfig"]["ProfilingIntervalInMilliseconds"] = 500
    return described


def _found(asked: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    found = _as_described(asked)
    *parents, last = path.split(".")
    node = found
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return found


# What the handler compares: the request less its name (the job was found by it) and its tags (read apart).
ASKED = {
    k: v
    for k, v in _sent(create_training_job(PLACEHOLDERS.training), _request()).items()
    if k not in ("TrainingJobName", "Tags")
}
SHAPE = _shape("sagemaker", "CreateTrainingJob")


def test_a_job_as_asked_with_the_services_defaults_differs_in_nothing() -> None:
    assert differences(ASKED, _as_described(ASKED), SHAPE) == []


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        ("RoleArn", "arn:aws:iam::123456789012:role/Mine", "RoleArn is"),
        (
            "AlgorithmSpecification.TrainingImage",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1",
            "TrainingImage",
        ),
        ("AlgorithmSpecification.ContainerEntrypoint", ["python", "-c", "import os"], "ContainerEntrypoint is"),
        ("AlgorithmSpecification.ContainerArguments", ["--steal"], "ContainerArguments is"),
        ("HyperParameters.distribution", "fsdp", "HyperParameters.distribution is"),
        ("HyperParameters.extra", "1", "HyperParameters has extra, not asked"),
        ("Environment.LD_PRELOAD", "/tmp/x.so", "Environment has LD_PRELOAD, not asked"),
        ("InputDataConfig.0.DataSource.S3DataSource.S3Uri", f"s3://{BUCKET}/language/", "S3Uri is"),
        ("InputDataConfig.0.CompressionType", "Gzip", "CompressionType is"),
        ("OutputDataConfig.S3OutputPath", "s3://elsewhere/", "S3OutputPath is"),
        ("CheckpointConfig.S3Uri", "s3://elsewhere/x/", "CheckpointConfig.S3Uri is"),
        ("VpcConfig.Subnets", ["subnet-0000000000000000a"], "VpcConfig.Subnets[] is"),
        ("EnableNetworkIsolation", True, "EnableNetworkIsolation is"),
        ("ResourceConfig.InstanceCount", 1, "InstanceCount is"),
        ("RemoteDebugConfig", {"EnableRemoteDebug": True}, "RemoteDebugConfig is"),
        ("DebugHookConfig", {"S3OutputPath": "s3://elsewhere/"}, "DebugHookConfig is"),
    ],
)
def test_any_field_other_than_asked_is_a_difference(path: str, value: Any, said: str) -> None:
    found = differences(ASKED, _found(ASKED, path, value), SHAPE)
    assert len(found) == 1 and said in found[0], found


def test_a_queued_payload_and_a_tuning_job_are_compared_as_their_services_read_them() -> None:
    submitted = _sent(submit_service_job(PLACEHOLDERS.queue, PLACEHOLDERS.training), _request())
    payload = {k: v for k, v in json.loads(submitted["serviceRequestPayload"]).items() if k != "Tags"}
    assert differences(payload, _as_described(payload), SHAPE) == []
    tuning = _sent(
        create_tuning_job(PLACEHOLDERS.training),
        _request(
            backend="sagemaker",
            instance_count=1,
            tuning={
                "ranges": {"lr": {"type": "continuous", "min": 0.0001, "max": 0.01}},
                "objective": {"metric": "validation:loss", "type": "Minimize"},
                "max_jobs": 2,
                "max_parallel_jobs": 1,
            },
        ),
    )
    tuning.pop("Tags")
    described = copy.deepcopy(tuning)
    definition = described["TrainingJobDefinition"]
    definition["StaticHyperParameters"]["_tuning_objective_metric"] = "validation:loss"  # SageMaker's own
    described["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] = "Off"
    tuning_shape = _shape("sagemaker", "CreateHyperParameterTuningJob")
    assert differences(tuning, described, tuning_shape) == []
    definition["StaticHyperParameters"]["lr"] = "1.0"
    assert differences(tuning, described, tuning_shape) == [
        "TrainingJobDefinition.StaticHyperParameters has lr, not asked"
    ]

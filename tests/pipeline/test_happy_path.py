"""The whole pipeline, executed: validate -> estimate -> train -> evaluate -> register -> promote."""

from __future__ import annotations

import json
import re
from typing import Any

import boto3

from contract.metrics import METRIC_DEFINITIONS
from lambdas.validate.request import RUN_ID_HEX
from tests.conftest import APPROVER
from tests.pipeline.conftest import Pipeline


def test_happy_path_registers_and_promotes_the_model(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    decision = pipeline.decide("promotion", "approve", reason="val loss is fine")
    described = pipeline.finish(arn)

    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    # The history the local platform reads from moto's engine is GetExecutionHistory's answer, event for event.
    history = pipeline.local.history(arn)
    assert history == pipeline.local.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    assert {e["type"] for e in history} >= {
        "TaskScheduled",
        "TaskSucceeded",
        "LambdaFunctionSucceeded",
        "WaitStateExited",
    }
    assert pipeline.local.states_entered(arn) == [
        "Handed over?",  # a run's first execution: not a hand-over (stacks/pipeline/handover.py)
        "Receive input",
        "Validate request",
        "Request valid?",
        "Accept request",
        "Estimate cost",
        "Approval needed?",  # 1 x ml.g5.2xlarge x 2 h is far below the approval threshold
        "Open the checkpoint ledger",  # before the first job: the ledger its jobs read is never empty
        "Tuning job?",  # no `tuning`: one training job
        "Training backend?",  # the request's backend (default sagemaker) picks the training step
        "First attempt",
        "Reset progress",
        "Volume encryption?",
        "Create training job (instance storage)",
        "Wait for training",
        "Check progress",  # one handler call per poll: it describes the job and reads the checkpoints
        "Job finished?",
        "Wait for training",
        "Check progress",
        "Job finished?",
        "Prune checkpoints",
        "Training step succeeded",
        "Backend succeeded",
        "Tuning or job succeeded",
        "Evaluate model",
        "Quality gate met?",
        "Register model",
        "Approval gate (promotion)",
        "Approval gate (promotion): decision recorded?",  # the decision function recorded this decision
        "Promotion approved?",
        "Verify model bytes",  # the archive and the lineage still hold the bytes registration pinned
        "Approve model",
        "Notify success",
        "Model promoted",
    ]
    assert decision["decision"] == "approved" and decision["by"] == APPROVER
    (package,) = pipeline.model_packages()
    assert package["ModelApprovalStatus"] == "Approved"

    runs = pipeline.local.messages("TopicsRuns")
    kinds = [m["MessageAttributes"]["kind"]["Value"] for m in runs]
    assert kinds == ["approval", "run"]
    success = json.loads(runs[1]["Message"])
    assert success["model_package"] == package["ModelPackageArn"]
    assert json.loads(runs[1]["MessageAttributes"]["recipients"]["Value"]) == ["alice@example.org"]


def test_create_training_job_request_carries_every_platform_field(pipeline: Pipeline, platform: Any) -> None:
    arn = pipeline.start(pipeline.input(warm_pool_minutes=15, instance_type="ml.m5.xlarge", model="tiny"))
    pipeline.run_until(arn, "Approval gate (promotion)")
    (name,) = pipeline.jobs()
    request = pipeline.local.training_requests[name]
    env = pipeline.local.environment("Validate")

    assert re.fullmatch(rf"gpt2-small-[0-9a-f]{{{RUN_ID_HEX}}}-1", name)  # run, execution hash, attempt
    local = pipeline.local
    (role,) = [
        logical for _, logical, _ in local.assembly.resources("AWS::IAM::Role") if "TrainingExecutionRole" in logical
    ]
    assert request["RoleArn"] == local.resolver.get_att(local.pipeline_stack, role, "Arn")
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert "@sha256:" in image and ".dkr.ecr." in image  # the platform's own repository, pinned by digest
    assert request["AlgorithmSpecification"]["MetricDefinitions"] == METRIC_DEFINITIONS
    assert request["HyperParameters"] == {"max_steps": "100", "lr": "0.0006", "model": "tiny", "distribution": "ddp"}
    assert (
        request["InputDataConfig"]
        == [
            {
                "ChannelName": "train",
                "DataSource": {
                    "FileSystemDataSource": {
                        "FileSystemId": env["FSX_FILE_SYSTEM_ID"],
                        "FileSystemAccessMode": "ro",
                        "FileSystemType": "FSxLustre",
                        "DirectoryPath": f"/{env['FSX_MOUNT_NAME']}/datasets/corpus",
                    }
                },
                "InputMode": "File",
            },
            {  # the run's checkpoint ledger: which checkpoints its jobs may load (contract/ledger.py)
                "ChannelName": "ledger",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": f"s3://{env['ARTIFACTS_BUCKET']}/runs/{request['TrainingJobName'][:-2]}/lineage/checkpoints/",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
                "InputMode": "File",
            },
        ]
    )
    key_arn = request["OutputDataConfig"]["KmsKeyId"]
    assert key_arn.startswith("arn:aws:kms:")
    assert request["OutputDataConfig"]["S3OutputPath"] == "s3://tp-dev-artifacts-123456789012-us-east-1/runs/"
    assert request["ResourceConfig"] == {
        "InstanceType": "ml.m5.xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 200,
        "KeepAlivePeriodInSeconds": 900,
        "VolumeKmsKeyId": key_arn,  # EBS-backed type: the volume is encrypted with the platform key
    }
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}
    assert request["EnableManagedSpotTraining"] is False
    base = name.rsplit("-", 1)[0]
    assert request["CheckpointConfig"] == {
        "S3Uri": f"s3://tp-dev-checkpoints-123456789012-us-east-1/runs/{base}/checkpoints/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    subnets, groups = request["VpcConfig"]["Subnets"], request["VpcConfig"]["SecurityGroupIds"]
    assert len(subnets) == 1 and subnets[0].startswith("subnet-")
    assert len(groups) == 1 and groups[0].startswith("sg-")
    assert request["EnableInterContainerTrafficEncryption"] is True
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    assert request["ProfilerConfig"] == {"S3OutputPath": "s3://tp-dev-artifacts-123456789012-us-east-1/runs/profiler/"}
    assert request["TensorBoardOutputConfig"] == {
        "LocalPath": "/opt/ml/output/tensorboard",
        "S3OutputPath": f"s3://tp-dev-artifacts-123456789012-us-east-1/runs/{base}/tensorboard/",
    }
    assert {"Key": "run", "Value": "gpt2-small"} in request["Tags"]
    assert {"Key": "team", "Value": "ml-platform"} in request["Tags"]
    # ml.m5.xlarge has no EFA: the launcher keeps NCCL on TCP sockets; and no GPU, so the pre-flight
    # check expects none and holds the all-reduce to no floor.
    assert request["Environment"] == {
        "PYTHONUNBUFFERED": "1",
        "NCCL_DEBUG": "WARN",
        "TRAINING_EFA": "false",
        "TRAINING_EXPECTED_GPUS": "0",
        "TRAINING_MIN_BUSBW_GBPS": "0.0",
        "TRAINING_GROUPS": "train",  # one group: every host trains
    }


def test_security_fields_are_constants_of_the_definition(deployed_definition: dict[str, Any]) -> None:
    """No execution input can reach the role, image, VPC, keys, encryption or output locations."""
    states = deployed_definition["States"]
    for name in ("Create training job", "Create training job (instance storage)"):
        parameters = states[name]["Parameters"]
        for field in ("RoleArn", "AlgorithmSpecification", "VpcConfig", "OutputDataConfig", "ProfilerConfig"):
            assert field in parameters and f"{field}.$" not in parameters
            assert "$" not in json.dumps(parameters[field])
        assert "EnableInterContainerTrafficEncryption" in parameters
        checkpoint = parameters["CheckpointConfig"]["S3Uri.$"]
        assert checkpoint.startswith(
            "States.Format('s3://tp-dev-checkpoints-123456789012-us-east-1/runs/{}/checkpoints/'"
        )
        resource = parameters["ResourceConfig"]
        assert ("VolumeKmsKeyId" in resource) == (name == "Create training job")


def test_every_task_state_has_a_timeout(deployed_definition: dict[str, Any]) -> None:
    tasks = {n: s for n, s in deployed_definition["States"].items() if s["Type"] == "Task"}
    assert len(tasks) >= 20
    assert [n for n, s in tasks.items() if "TimeoutSeconds" not in s and "TimeoutSecondsPath" not in s] == []


def test_spot_run_sets_max_wait_and_managed_spot(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input(spot=True, max_runtime_hours=4, max_wait_hours=10))
    pipeline.run_until(arn, "Approval gate (promotion)")
    (name,) = pipeline.jobs()
    request = pipeline.local.training_requests[name]
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 14400, "MaxWaitTimeInSeconds": 36000}
    assert "VolumeKmsKeyId" not in request["ResourceConfig"]  # g5 instances use instance-store NVMe


def test_datasets_on_s3_become_s3_channels(pipeline: Pipeline) -> None:
    bucket = pipeline.datasets_bucket
    arn = pipeline.start(
        pipeline.input(dataset=f"s3://{bucket}/corpus/train", validation_dataset=f"s3://{bucket}/corpus/val/")
    )
    pipeline.run_until(arn, "Approval gate (promotion)")
    (name,) = pipeline.jobs()
    channels = pipeline.local.training_requests[name]["InputDataConfig"]
    assert [c["ChannelName"] for c in channels] == ["train", "validation", "ledger"]
    assert channels[0]["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{bucket}/corpus/train/"
    s3 = boto3.client("s3", region_name="us-east-1")
    assert s3.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200

"""The local platform enforces the synthesized IAM: a permission the deployed role lacks fails here too."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from localrun.aws.iam import LAMBDA, SAGEMAKER, acting_as
from tests.pipeline.conftest import Pipeline

Statement = dict[str, Any]


def _assembly_with(platform: Any, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the synthesized assembly whose pipeline template `edit` has changed."""
    source = Path(platform.assembly.directory)
    target = tmp_path / "assembly"
    target.mkdir()
    for path in source.glob("*.json"):
        shutil.copy(path, target / path.name)
    template_path = target / f"{platform.pipeline.stack_name}.template.json"
    template = json.loads(template_path.read_text())
    edit(template)
    template_path.write_text(json.dumps(template))
    return target


def _policies_of(template: dict[str, Any], role_prefix: str) -> list[list[Statement]]:
    """The statement lists of a role's default policy and of the overflow policies CDK moves statements into once
    the inline policy outgrows IAM's size limit, by the role's logical ID prefix."""
    policies = [
        r
        for logical, r in template["Resources"].items()
        if (
            (r["Type"] == "AWS::IAM::Policy" and "DefaultPolicy" in json.dumps(r["Properties"]["PolicyName"]))
            or (r["Type"] == "AWS::IAM::ManagedPolicy" and "OverflowPolicy" in logical)
        )
        and any(role["Ref"].startswith(role_prefix) for role in r["Properties"].get("Roles", []))
    ]
    assert policies, f"no policy of {role_prefix}"
    return [policy["Properties"]["PolicyDocument"]["Statement"] for policy in policies]


def _drop(role_prefix: str, sid: str) -> Callable[[dict[str, Any]], None]:
    def edit(template: dict[str, Any]) -> None:
        holding = [s for s in _policies_of(template, role_prefix) if any(st.get("Sid") == sid for st in s)]
        assert len(holding) == 1, f"no statement {sid} in {role_prefix}'s policies"
        statements = holding[0]
        kept = [s for s in statements if s.get("Sid") != sid]
        assert len(kept) == len(statements) - 1, f"no statement {sid} in {role_prefix}'s policy"
        statements[:] = kept

    return edit


def test_a_dropped_statement_fails_the_run_naming_action_and_resource(
    platform: Any, tmp_path: Path, open_platform: Any
) -> None:
    # Without its one S3 statement, the Monitor function cannot list the run's checkpoints.
    pipeline = open_platform(_assembly_with(platform, tmp_path, _drop("MonitorRole", "ListRunCheckpoints")))
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert described["status"] == "FAILED"
    states = pipeline.local.states_entered(arn)
    # The poll failed, so the run stopped its job and ended with the denial as its cause.
    assert "Check progress" in states and states[-5:] == [
        "Training step failed",
        "Backend failed",
        "Tuning or job failed",
        "Notify training failed",
        "Training failed",
    ]
    assert pipeline.training.stopped_names == pipeline.jobs()
    cause = described["cause"]
    assert "s3:ListBucket" in cause and "arn:aws:s3:::tp-dev-checkpoints-123456789012-us-east-1" in cause
    assert "assumed-role/MonitorRole" in cause
    (denied,) = pipeline.local.iam.denials()
    assert (denied.action, denied.allowed) == ("s3:ListBucket", False)


def test_the_state_machine_role_is_enforced_on_its_own_calls(platform: Any, tmp_path: Path, open_platform: Any) -> None:
    pipeline = open_platform(
        _assembly_with(platform, tmp_path, _drop("TrainingPipelineRole", "CreateJobsOnInstanceStoreTypes"))
    )
    arn = pipeline.start(pipeline.input())
    described = pipeline.finish(arn)
    assert pipeline.error(described)[0] == "TrainingJobNotCreated"
    assert (
        "sagemaker:CreateTrainingJob on resource: arn:aws:sagemaker:us-east-1:123456789012:training-job/"
        in (described["cause"])
    )
    assert pipeline.jobs() == []


def test_conditions_are_evaluated_not_ignored(platform: Any, tmp_path: Path, open_platform: Any) -> None:
    """moto would ignore the condition; here a job outside the allowed subnet is refused."""

    def other_subnet(template: dict[str, Any]) -> None:
        (create,) = [
            s
            for statements in _policies_of(template, "TrainingPipelineRole")
            for s in statements
            if s.get("Sid") == "CreateJobsOnInstanceStoreTypes"
        ]
        create["Condition"]["ForAllValues:StringEquals"]["sagemaker:VpcSubnets"] = ["subnet-0123456789abcdef0"]

    pipeline = open_platform(_assembly_with(platform, tmp_path, other_subnet))
    described = pipeline.finish(pipeline.start(pipeline.input()))
    assert pipeline.error(described)[0] == "TrainingJobNotCreated"
    assert pipeline.jobs() == []


def test_each_role_acts_only_as_its_service_and_within_its_policy(pipeline: Pipeline) -> None:
    iam = pipeline.local.iam
    (training_role,) = [
        role.arn for role in boto3_roles() if "sagemaker.amazonaws.com" in json.dumps(role.assume_role_policy_document)
    ]
    with pytest.raises(PermissionError, match="trust policy does not allow it"):
        iam.credentials(training_role, LAMBDA)
    session = iam.credentials(training_role, SAGEMAKER)
    s3 = boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id=session.access_key,
        aws_secret_access_key=session.secret_key,
        aws_session_token=session.token,
    )
    checkpoints = "tp-dev-checkpoints-123456789012-us-east-1"
    s3.put_object(Bucket=checkpoints, Key="runs/job-1/checkpoints/step-1/manifest.json", Body=b"{}")
    with pytest.raises(ClientError, match=r"s3:PutObject on resource: arn:aws:s3:::tp-dev-datasets-"):
        s3.put_object(Bucket="tp-dev-datasets-123456789012-us-east-1", Key="corpus/poisoned.bin", Body=b"x")
    with pytest.raises(ClientError, match="not authorized to perform: s3:PutObject"):
        s3.put_object(Bucket=checkpoints, Key="elsewhere/x", Body=b"x")


def test_an_operation_outside_the_request_model_is_refused_not_allowed(pipeline: Pipeline) -> None:
    with (
        acting_as(pipeline.local.function_session("Register")),
        pytest.raises(ClientError, match="local IAM request model"),
    ):
        boto3.client("sagemaker", region_name="us-east-1").list_endpoints()


def boto3_roles() -> list[Any]:
    from moto.iam.models import iam_backends

    return list(iam_backends["123456789012"]["aws"].get_roles())


def test_uploads_that_name_an_encryption_must_name_the_platform_key(pipeline: Pipeline) -> None:
    """The buckets' policies deny another key or SSE-S3; an upload naming nothing gets the platform key."""
    bucket = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]  # Register writes lineage there
    platform_key = pipeline.local.training_key_arn()
    with acting_as(pipeline.local.function_session("Register")):
        s3 = boto3.client("s3", region_name="us-east-1")
        lineage = "runs/job-1/lineage/lineage.json"
        s3.put_object(Bucket=bucket, Key=lineage, Body=b"{}")
        s3.put_object(Bucket=bucket, Key=lineage, Body=b"{}", ServerSideEncryption="aws:kms", SSEKMSKeyId=platform_key)
        with pytest.raises(ClientError, match=r"explicit deny in bucket policy .* statement DenyOtherKeys"):
            s3.put_object(
                Bucket=bucket,
                Key=lineage,
                Body=b"{}",
                ServerSideEncryption="aws:kms",
                SSEKMSKeyId="arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000",
            )
        with pytest.raises(ClientError, match="statement DenyOtherEncryption"):
            s3.put_object(Bucket=bucket, Key=lineage, Body=b"{}", ServerSideEncryption="AES256")


def _definition_text(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    """Replace text in the state machine's definition (the literal parts of its Fn::Join)."""

    def edit(template: dict[str, Any]) -> None:
        (machine,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
        parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
        replaced = [p.replace(old, new) if isinstance(p, str) else p for p in parts]
        assert replaced != parts, f"{old!r} is not in the definition"
        parts[:] = replaced

    return edit


@pytest.mark.parametrize(
    "flag",
    ['"EnableNetworkIsolation":', '"EnableInterContainerTrafficEncryption":'],
    ids=["network isolation", "inter-container encryption"],
)
def test_create_training_job_conditions_refuse_a_weakened_request(
    platform: Any, tmp_path: Path, open_platform: Any, flag: str
) -> None:
    """Were the definition changed to weaken a job, the state machine's own role could not create it."""
    weakened = _definition_text(f"{flag}true", f"{flag}false")
    pipeline = open_platform(_assembly_with(platform, tmp_path, weakened))
    described = pipeline.finish(pipeline.start(pipeline.input()))
    assert pipeline.error(described)[0] == "TrainingJobNotCreated"
    assert "not authorized to perform: sagemaker:CreateTrainingJob" in described["cause"]


def test_instance_types_volume_key_and_runtime_are_conditions_too(pipeline: Pipeline) -> None:
    """The state machine role's grant, judged on variations of a request it really sent."""
    from localrun.aws.iam import REQUEST_MODEL, Call
    from localrun.aws.iam_policy import evaluate

    arn = pipeline.start(pipeline.input())  # ml.g5.2xlarge: instance-store NVMe, so no volume key
    pipeline.run_until(arn, "Wait for training")
    (sent,) = pipeline.local.training_requests.values()
    policies = pipeline.local.iam.role_policies(pipeline.local.state_machine_role_arn.rsplit("/", 1)[1])
    key = pipeline.local.training_key_arn()

    def allowed(resources: dict[str, Any], runtime: int = 7200) -> bool:
        params = json.loads(json.dumps(sent))
        params["ResourceConfig"] = {**params["ResourceConfig"], **resources}
        params["StoppingCondition"]["MaxRuntimeInSeconds"] = runtime
        (create, *_) = REQUEST_MODEL[("sagemaker", "CreateTrainingJob")](Call("sagemaker", "CreateTrainingJob", params))
        return evaluate(policies, create).allowed

    assert allowed({})
    assert not allowed({"VolumeKmsKeyId": key})  # an instance-store type takes no volume key
    assert allowed({"InstanceType": "ml.m5.xlarge", "VolumeKmsKeyId": key})  # EBS: only with the platform key
    assert not allowed({"InstanceType": "ml.m5.xlarge"})
    assert not allowed({"InstanceType": "ml.m5.xlarge", "VolumeKmsKeyId": key.replace(key[-12:], "0" * 12)})
    assert not allowed({"InstanceType": "ml.r5.large"})  # not a type of the platform's catalog
    assert not allowed({}, runtime=120 * 3600 + 1)  # beyond pipeline.max_runtime_hours


def test_a_heterogeneous_cluster_takes_the_volume_key_exactly_when_every_group_is_on_ebs(pipeline: Pipeline) -> None:
    """InstanceGroups under the same grant: instance-store anywhere means no key; EBS only means the platform's."""
    from localrun.aws.iam import REQUEST_MODEL, Call
    from localrun.aws.iam_policy import evaluate

    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Wait for training")
    (sent,) = pipeline.local.training_requests.values()
    policies = pipeline.local.iam.role_policies(pipeline.local.state_machine_role_arn.rsplit("/", 1)[1])
    key = pipeline.local.training_key_arn()

    def allowed(types: list[str], volume_key: str | None) -> bool:
        params = json.loads(json.dumps(sent))
        resource = {k: v for k, v in params["ResourceConfig"].items() if k not in ("InstanceType", "InstanceCount")}
        resource["InstanceGroups"] = [
            {"InstanceGroupName": f"g{i}", "InstanceType": t, "InstanceCount": 1} for i, t in enumerate(types)
        ]
        resource.pop("VolumeKmsKeyId", None)
        params["ResourceConfig"] = resource | ({"VolumeKmsKeyId": volume_key} if volume_key else {})
        (create, *_) = REQUEST_MODEL[("sagemaker", "CreateTrainingJob")](Call("sagemaker", "CreateTrainingJob", params))
        return evaluate(policies, create).allowed

    mixed = ["ml.p4d.24xlarge", "ml.c5.4xlarge"]  # instance-store GPU group, EBS CPU group
    assert allowed(mixed, None)
    assert not allowed(mixed, key)
    assert allowed(["ml.m5.xlarge", "ml.c5.4xlarge"], key)
    assert not allowed(["ml.m5.xlarge", "ml.c5.4xlarge"], None)  # EBS only: never without the platform key
    assert not allowed(["ml.p4d.24xlarge", "ml.r5.large"], None)  # a type outside the catalog, in any group

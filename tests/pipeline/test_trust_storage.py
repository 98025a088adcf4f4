"""Training roles (SageMaker's execution role, Batch's job role) cannot delete objects or write any run's lineage,
and no other principal of the account can write a run's checkpoints, whatever its own policies allow.

Acted out with the roles' own sessions, as their services obtain them, against the deployed buckets with
IAM enforced.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from contract.layout import run_checkpoints, run_lineage, run_output
from localrun.aws.cfn import REGION
from localrun.aws.iam import SAGEMAKER
from localrun.backends.batch import ECS_TASKS
from tests.pipeline.conftest import Pipeline

# The training roles, by the service that assumes them and the start of their logical ID.
TRAINING_ROLES = {SAGEMAKER: "TrainingExecutionRole", ECS_TASKS: "BatchClusterJobRole"}


def _training_role(service: str) -> str:
    from moto.iam.models import iam_backends

    (arn,) = [
        role.arn
        for role in iam_backends["123456789012"]["aws"].get_roles()
        if service in json.dumps(role.assume_role_policy_document) and role.name.startswith(TRAINING_ROLES[service])
    ]
    return str(arn)


def _s3_as(pipeline: Pipeline, service: str) -> Any:
    session = pipeline.local.iam.credentials(_training_role(service), service)
    return boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id=session.access_key,
        aws_secret_access_key=session.secret_key,
        aws_session_token=session.token,
    )


@pytest.mark.parametrize("service", [SAGEMAKER, ECS_TASKS])
def test_training_roles_cannot_delete_or_write_lineage(pipeline: Pipeline, service: str) -> None:
    artifacts = pipeline.local.environment("Register")["ARTIFACTS_BUCKET"]
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    victim_lineage = f"{run_lineage('victim-run')}lineage.json"
    victim_checkpoint = f"{run_checkpoints('victim-run')}step-4/manifest.json"
    # What the platform wrote: a checkpoint SageMaker synced and the lineage Register recorded.
    platform = boto3.client("s3", region_name="us-east-1")
    platform.put_object(Bucket=checkpoints, Key=victim_checkpoint, Body=b"{}")
    platform.put_object(Bucket=artifacts, Key=victim_lineage, Body=b'{"true": "lineage"}')

    s3 = _s3_as(pipeline, service)
    # What training needs still works: its checkpoints in and out, its outputs out.
    s3.put_object(Bucket=checkpoints, Key=f"{run_checkpoints('own-run')}step-1/manifest.json", Body=b"{}")
    assert s3.get_object(Bucket=checkpoints, Key=victim_checkpoint)["Body"].read() == b"{}"
    s3.put_object(Bucket=artifacts, Key=f"{run_output('own-run-1')}model.tar.gz", Body=b"model")

    for bucket, key in ((checkpoints, victim_checkpoint), (artifacts, victim_lineage)):
        with pytest.raises(ClientError, match="not authorized to perform: s3:DeleteObject"):
            s3.delete_object(Bucket=bucket, Key=key)
    for key in (victim_lineage, f"{run_lineage('own-run')}lineage.json"):
        with pytest.raises(ClientError, match="not authorized to perform: s3:PutObject"):
            s3.put_object(Bucket=artifacts, Key=key, Body=b'{"forged": true}')
    assert platform.get_object(Bucket=artifacts, Key=victim_lineage)["Body"].read() == b'{"true": "lineage"}'
    assert platform.get_object(Bucket=checkpoints, Key=victim_checkpoint)["Body"].read() == b"{}"


EVERYTHING = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "kms:*"], "Resource": "*"}]}


def test_no_other_principal_of_the_account_writes_a_runs_checkpoints(pipeline: Pipeline) -> None:
    """A user whose own policy allows every S3 and KMS action cannot plant, copy over or delete a checkpoint."""
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    datasets = pipeline.local.environment("Validate")["DATASETS_BUCKET"]
    own = f"{run_checkpoints('victim-run')}step-4/manifest.json"
    boto3.client("s3", region_name=REGION).put_object(Bucket=checkpoints, Key=own, Body=b"{}")
    insider = "arn:aws:iam::123456789012:role/Insider"
    session = pipeline.local.person(insider)
    boto3.client("iam", region_name=REGION).put_role_policy(
        RoleName="Insider", PolicyName="Everything", PolicyDocument=json.dumps(EVERYTHING)
    )
    s3 = session.client("s3")
    planted = f"{run_checkpoints('victim-run')}step-8/manifest.json"
    attempts = [
        ("s3:PutObject", lambda: s3.put_object(Bucket=checkpoints, Key=planted, Body=b'{"planted": true}')),
        (
            "s3:PutObject",
            lambda: s3.copy_object(
                Bucket=checkpoints, Key=own, CopySource={"Bucket": checkpoints, "Key": own}, MetadataDirective="REPLACE"
            ),
        ),
        ("s3:DeleteObject", lambda: s3.delete_object(Bucket=checkpoints, Key=own)),
    ]
    for action, attempt in attempts:
        with pytest.raises(ClientError, match=f"not authorized to perform: {action}"):
            attempt()
    # The bucket policy's deny refused it, not a lack of the user's own permissions: elsewhere the user writes.
    denials = [j for j in pipeline.local.iam.denials() if "Insider" in j.principal]
    assert denials and all("CheckpointsByTrainingRolesOnly" in j.reason for j in denials), denials
    s3.put_object(Bucket=datasets, Key="insider/any.txt", Body=b"ok")
    s3.put_object(Bucket=checkpoints, Key="elsewhere/manifest.json", Body=b"ok")
    listed = boto3.client("s3", region_name=REGION).list_objects_v2(
        Bucket=checkpoints, Prefix=run_checkpoints("victim-run")
    )
    assert [o["Key"] for o in listed["Contents"]] == [own]

"""Security properties of the synthesized templates that a reviewer would otherwise check by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.iam_policy import Policy, Request, evaluate
from stacks.naming import CHECKPOINT_WRITERS_PATH
from tests.support.iam import AssemblyIam, Role, task_states

RESOURCE_POLICIES = {
    "AWS::KMS::Key": "KeyPolicy",
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::S3::BucketPolicy": "PolicyDocument",
}


@pytest.fixture(scope="module")
def iam(platform: Any) -> AssemblyIam:
    return AssemblyIam(Path(platform.assembly.directory))


def test_service_principals_act_for_this_account_only(iam: AssemblyIam) -> None:
    """A service may use a key, topic or bucket only on behalf of this account (no confused deputy)."""
    unbound = []
    for type_, attribute in RESOURCE_POLICIES.items():
        for _, logical, props in iam.resources(type_):
            for statement in props[attribute]["Statement"]:
                principal = statement.get("Principal", {})
                if statement["Effect"] != "Allow" or not isinstance(principal, dict) or "Service" not in principal:
                    continue
                # aws:SourceAccount, or an aws:SourceArn / encryption-context ARN in this account.
                if ACCOUNT not in json.dumps(statement.get("Condition", {})):
                    unbound.append((logical, statement.get("Sid"), principal["Service"]))
    assert unbound == []


def _machine(iam: AssemblyIam) -> tuple[str, dict[str, Any]]:
    (machine,) = [
        (iam.resolver.ref(stack, logical), props)
        for stack, logical, props in iam.resources("AWS::StepFunctions::StateMachine")
        if stack.endswith("-pipeline")
    ]
    return machine


def test_execution_data_is_encrypted_with_a_key_of_its_own(iam: AssemblyIam) -> None:
    _, props = _machine(iam)
    configuration = props["EncryptionConfiguration"]
    assert configuration["Type"] == "CUSTOMER_MANAGED_KMS_KEY"
    data_keys = {iam.arn(s, logical) for s, logical, _ in iam.resources("AWS::KMS::Key") if s.endswith("-data")}
    assert configuration["KmsKeyId"] not in data_keys
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False  # tokens and inputs stay out of logs


def _administrator() -> Role:
    """An account administrator: every KMS action on every key by IAM policy."""
    everything = Policy.parse("admin", {"Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]})
    trust = Policy.parse("trust", {"Statement": []}, resource_policy=True)
    return Role(f"arn:aws:iam::{ACCOUNT}:role/Administrator", "Administrator", trust, [everything])


def test_only_the_platform_roles_can_decrypt_execution_data(iam: AssemblyIam) -> None:
    machine, props = _machine(iam)
    key = props["EncryptionConfiguration"]["KmsKeyId"]
    context = {"kms:EncryptionContext:aws:states:stateMachineArn": machine}
    readers = {role.logical for role in iam.roles.values() if iam.may_use_key(role, "kms:Decrypt", key, **context)}
    decide = next(r.logical for r in iam.roles.values() if r.logical.startswith("ApprovalDecideRole"))
    # Validate reads an ended run's history for `resume_from`, with Decrypt alone: it encrypts nothing.
    validate = next(r.logical for r in iam.roles.values() if r.logical.startswith("ValidateRole"))
    # TellEndedRun reads an ended run's history for its recipients, with Decrypt alone too.
    tell = next(r.logical for r in iam.roles.values() if r.logical.startswith("TellEndedRunRole"))
    # TakeOver reads the history of the execution a hand-over names, to prove it, with Decrypt alone too.
    take_over = next(r.logical for r in iam.roles.values() if r.logical.startswith("TakeOverRole"))
    # Each backend's cleanup reads the proof of an ended execution a run was handed over to (lambdas/jobs/prune.py),
    # to stop the jobs of the run's first execution, with Decrypt alone too.
    cleanups = {
        r.logical
        for r in iam.roles.values()
        if r.logical.startswith(("CleanupRole", "StopBatchJobsRole", "StopServiceJobsRole"))
    }
    assert cleanups
    assert readers == {iam.roles[props["RoleArn"]].logical, decide, validate, tell, take_over, *cleanups}
    writers = {r.logical for r in iam.roles.values() if iam.may_use_key(r, "kms:GenerateDataKey", key, **context)}
    assert writers == {iam.roles[props["RoleArn"]].logical, decide}
    administrator = _administrator()
    assert not iam.may_use_key(administrator, "kms:Decrypt", key, **context)
    assert iam.may_use_key(administrator, "kms:ScheduleKeyDeletion", key)  # administers, cannot read
    # Anyone IAM lets start a run may encrypt its input, through Step Functions only.
    assert iam.may_use_key(
        administrator, "kms:GenerateDataKey", key, **context, **{"kms:ViaService": f"states.{REGION}.amazonaws.com"}
    )
    assert not iam.may_use_key(administrator, "kms:GenerateDataKey", key, **context)


def test_named_readers_can_decrypt_execution_data(variant: Any) -> None:
    iam = AssemblyIam(Path(variant.assembly.directory))
    machine, props = _machine(iam)
    key = props["EncryptionConfiguration"]["KmsKeyId"]
    (reader,) = variant.settings.execution_data_readers
    role = Role(reader, reader.rsplit("/", 1)[1], _administrator().trust, [])
    assert iam.may_use_key(role, "kms:Decrypt", key, **{"kms:EncryptionContext:aws:states:stateMachineArn": machine})


def test_one_run_cannot_destroy_anothers_checkpoints(iam: AssemblyIam) -> None:
    """What bounds the shared training role (docs/architecture/checkpoints.md)."""
    (stack, logical, _), *_ = [
        m for m in iam.resources("AWS::StepFunctions::StateMachine") if m[0].endswith("-pipeline")
    ]
    creates = [
        task["Parameters"]
        for task in task_states(iam.definition(stack, logical))
        if task["Resource"].endswith(":sagemaker:createTrainingJob")
    ]
    for request in creates:
        # No container can reach S3 itself; SageMaker syncs only the run's own prefix, which no input sets.
        assert request["EnableNetworkIsolation"] is True
        assert request["CheckpointConfig"]["S3Uri.$"].endswith("/runs/{}/checkpoints/', $.request.job_name_base)")
    role = iam.roles[creates[0]["RoleArn"]]
    bucket = next(
        f"arn:aws:s3:::{props['BucketName']}"
        for _, logical_id, props in iam.resources("AWS::S3::Bucket")
        if logical_id.startswith("BucketsCheckpoints")
    )
    # It may overwrite (the role is shared), never delete; an overwrite leaves the previous version, which the
    # role cannot remove or expire early.
    assert role.may("s3:PutObject", f"{bucket}/runs/other-run/checkpoints/step-1/manifest.json")
    assert not role.may("s3:DeleteObject", f"{bucket}/runs/other-run/checkpoints/step-1/manifest.json")
    for action in (
        "s3:DeleteObjectVersion",
        "s3:PutBucketVersioning",
        "s3:PutLifecycleConfiguration",
        "s3:PutBucketPolicy",
    ):
        assert not role.may(action, bucket) and not role.may(action, f"{bucket}/runs/other-run/x"), action
    (versioning,) = [
        p["VersioningConfiguration"]
        for _, lid, p in iam.resources("AWS::S3::Bucket")
        if lid.startswith("BucketsCheckpoints")
    ]
    assert versioning == {"Status": "Enabled"}


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_every_key_denies_grants_that_no_aws_service_makes(built: str, request: Any) -> None:
    """Control Tower's CT.KMS.PR.3, as its guard rule reads a key policy; and what the statement does."""
    iam = AssemblyIam(Path(request.getfixturevalue(built).assembly.directory))
    keys = iam.resources("AWS::KMS::Key")
    assert len(keys) >= 4, "the data key, the flow-logs key, the execution data key and the approval token key"
    administrator = _administrator()
    for stack, logical, props in keys:
        statements = props["KeyPolicy"]["Statement"]
        denies = [
            s
            for s in statements
            if s["Effect"] == "Deny"
            and s["Action"] in ("kms:CreateGrant", ["kms:CreateGrant"])
            and s["Principal"] in ("*", {"AWS": "*"})
            and s["Resource"] in ("*", ["*"])
            and s["Condition"]
            == {"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}}
        ]
        assert len(denies) == 1, f"{stack}/{logical}: no CT.KMS.PR.3 statement"
        key = iam.arn(stack, logical)
        # An administrator whose IAM policy allows kms:* still cannot grant the key to a principal of its choice.
        assert not iam.may_use_key(administrator, "kms:CreateGrant", key, **{"kms:GrantIsForAWSResource": False}), (
            f"{stack}/{logical}"
        )


def test_no_platform_role_lists_the_run_buckets_outside_the_runs(iam: AssemblyIam) -> None:
    """Every listing of the checkpoints and artifacts buckets is bounded by an s3:prefix under runs/: no handler
    or training role can list another prefix (the teams' membership prefixes, say), or the whole bucket."""
    buckets = [
        iam.arn(stack, logical)
        for stack, logical, props in iam.resources("AWS::S3::Bucket")
        if any(kind in str(props.get("BucketName")) for kind in ("checkpoints", "artifacts"))
    ]
    assert len(buckets) == 2
    listing = {
        (role.logical, bucket, prefix)
        for role in iam.roles.values()
        for bucket in buckets
        for prefix in (None, "", "team-membership/vision/", "elsewhere/")
        if role.may("s3:ListBucket", bucket, **({} if prefix is None else {"s3:prefix": prefix}))
    }
    assert listing == set()
    assert any(role.may("s3:ListBucket", buckets[0], **{"s3:prefix": "runs/r-1/"}) for role in iam.roles.values())


def _checkpoints_bucket_policy(iam: AssemblyIam) -> tuple[str, Policy]:
    (bucket,) = [
        f"arn:aws:s3:::{props['BucketName']}"
        for _, logical, props in iam.resources("AWS::S3::Bucket")
        if logical.startswith("BucketsCheckpoints")
    ]
    (policy,) = [
        Policy.parse(logical, props["PolicyDocument"], resource_policy=True)
        for _, logical, props in iam.resources("AWS::S3::BucketPolicy")
        if logical.startswith("BucketsCheckpointsPolicy")
    ]
    return bucket, policy


def _may_write(bucket_policy: Policy, role: Role, action: str, resource: str) -> bool:
    """S3's rule within one account: the role's own policies and the bucket policy, a Deny in either wins."""
    request = Request(
        action, resource, {"aws:PrincipalArn": role.arn}, known_keys=None, principal=role.arn, principal_role=role.arn
    )
    return evaluate([*role.policies, bucket_policy], request).allowed


WRITERS = {"TrainingExecution", "BatchClusterJob", "OpenLedger"}
"""The roles that write runs' checkpoints: SageMaker's sync, the Batch contract, the copy of a resumed run's."""
PRUNERS = {"Cleanup", "StopBatchJobs"}
"""The roles that delete superseded checkpoints when a job ends (SageMaker's cleanup, Batch's)."""


def test_only_the_checkpoint_writers_write_a_runs_checkpoints(iam: AssemblyIam) -> None:
    """The bucket policy, not only the roles' own policies, decides who writes under runs/*/checkpoints/."""
    bucket, policy = _checkpoints_bucket_policy(iam)
    checkpoint = f"{bucket}/runs/other-run/checkpoints/step-1/manifest.json"
    insider = Role(
        f"arn:aws:iam::{ACCOUNT}:role/Insider",
        "Insider",
        _administrator().trust,
        [Policy.parse("all", {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})],
    )
    for action, expected in (
        ("s3:PutObject", WRITERS),
        ("s3:DeleteObject", PRUNERS),
        ("s3:DeleteObjectVersion", set()),
    ):
        allowed = {
            r.logical.rsplit("Role", 1)[0] for r in iam.roles.values() if _may_write(policy, r, action, checkpoint)
        }
        assert allowed == expected, action
        # Whatever an account principal's own policy allows, the bucket policy refuses it there, and only there.
        assert not _may_write(policy, insider, action, checkpoint)
        assert _may_write(policy, insider, action, f"{bucket}/elsewhere/step-1/manifest.json")
    # Only the roles that write or prune are on the path the bucket policy admits.
    on_path = {r.logical.rsplit("Role", 1)[0] for r in iam.roles.values() if CHECKPOINT_WRITERS_PATH in r.arn}
    assert on_path == WRITERS | PRUNERS

"""IAM policy evaluation as AWS documents it: the cases moto's own check gets wrong, and the edges."""

from __future__ import annotations

from typing import Any

import pytest

from localrun.aws.iam_policy import Policy, Request, UnmodelledConditionKey, allows, evaluate

TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/Approvals"
BUCKET = "arn:aws:s3:::tp-dev-checkpoints"


def policy(*statements: dict[str, Any], resource_policy: bool = False) -> Policy:
    return Policy.parse(
        "test", {"Version": "2012-10-17", "Statement": list(statements)}, resource_policy=resource_policy
    )


def allow(action: Any, resource: Any, **condition: Any) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Action": action, "Resource": resource}
    if condition:
        statement["Condition"] = condition
    return statement


def test_resources_are_matched_not_just_actions() -> None:
    granted = [policy(allow("dynamodb:PutItem", TABLE))]
    assert allows(granted, "dynamodb:PutItem", TABLE)
    assert not allows(granted, "dynamodb:PutItem", TABLE.replace("Approvals", "Other"))
    assert not allows(granted, "dynamodb:DeleteItem", TABLE)


def test_actions_are_case_insensitive_and_wildcards_span_separators() -> None:
    granted = [policy(allow("sagemaker:updateModelPackage", "arn:aws:sagemaker:*:*:model-package/group/*"))]
    assert allows(granted, "sagemaker:UpdateModelPackage", "arn:aws:sagemaker:us-east-1:1:model-package/group/3")
    assert not allows(granted, "sagemaker:UpdateModelPackage", "arn:aws:sagemaker:us-east-1:1:model-package/other/3")
    assert allows([policy(allow("s3:Get*", f"{BUCKET}/runs/?/x"))], "s3:GetObject", f"{BUCKET}/runs/a/x")


def test_explicit_deny_wins_and_reason_names_it() -> None:
    deny = {"Effect": "Deny", "Sid": "NoDeletes", "Action": "s3:DeleteObject", "Resource": "*"}
    decision = evaluate([policy(allow("s3:*", "*"), deny)], Request("s3:DeleteObject", f"{BUCKET}/a"))
    assert not decision.allowed and "NoDeletes" in decision.reason
    assert "no identity-based policy allows" in evaluate([], Request("s3:GetObject", BUCKET)).reason


def test_not_action_and_not_resource() -> None:
    granted = [policy({"Effect": "Allow", "NotAction": "iam:*", "NotResource": f"{BUCKET}/secret/*"})]
    assert allows(granted, "s3:GetObject", f"{BUCKET}/runs/a")
    assert not allows(granted, "s3:GetObject", f"{BUCKET}/secret/a")
    assert not allows(granted, "iam:PassRole", "*")


def test_set_operators_and_null_as_the_create_training_job_grant_uses_them() -> None:
    grant = allow(
        "sagemaker:CreateTrainingJob",
        "*",
        **{
            "ForAllValues:StringEquals": {"sagemaker:VpcSubnets": ["subnet-a"]},
            "Null": {"sagemaker:VpcSubnets": "false"},
            "Bool": {"sagemaker:NetworkIsolation": "true"},
        },
    )
    granted = [policy(grant)]

    def create(**context: Any) -> bool:
        return allows(granted, "sagemaker:CreateTrainingJob", "arn:job", **context)

    assert create(**{"sagemaker:VpcSubnets": ["subnet-a"], "sagemaker:NetworkIsolation": True})
    assert not create(**{"sagemaker:VpcSubnets": ["subnet-a", "subnet-b"], "sagemaker:NetworkIsolation": True})
    # Without Null, ForAllValues over an absent key would hold vacuously: a job outside any VPC.
    assert not create(**{"sagemaker:NetworkIsolation": True})
    assert not create(**{"sagemaker:VpcSubnets": ["subnet-a"], "sagemaker:NetworkIsolation": False})
    assert not create(**{"sagemaker:VpcSubnets": ["subnet-a"]})


def test_negated_operators_null_and_if_exists_on_absent_keys() -> None:
    # The bucket-policy shape that forces the platform key: deny a named other key, allow the default.
    key_id = "s3:x-amz-server-side-encryption-aws-kms-key-id"
    deny = {
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:PutObject",
        "Resource": f"{BUCKET}/*",
        "Condition": {"Null": {key_id: "false"}, "StringNotEquals": {key_id: "arn:key/1"}},
    }
    bucket_policy = policy(deny, resource_policy=True)
    identity = policy(allow("s3:PutObject", f"{BUCKET}/*"))

    def put(statement_policy: Policy = bucket_policy, **context: Any) -> bool:
        request = Request("s3:PutObject", f"{BUCKET}/a", context, frozenset({key_id}))
        return evaluate([identity, statement_policy], request).allowed

    assert put()  # no header: the bucket's default key applies
    assert put(**{key_id: "arn:key/1"})
    assert not put(**{key_id: "arn:key/2"})
    # Without the Null check a negated operator holds on an absent key (AWS's rule), denying default uploads.
    strict = policy({**deny, "Condition": {"StringNotEquals": {key_id: "arn:key/1"}}}, resource_policy=True)
    assert not put(strict)
    # ...IfExists holds on an absent key too.
    if_exists = policy({**deny, "Condition": {"StringNotEqualsIfExists": {key_id: "arn:key/1"}}}, resource_policy=True)
    assert not put(if_exists) and put(if_exists, **{key_id: "arn:key/1"})


def test_tls_only_bucket_policy_denies_plain_http() -> None:
    deny = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Resource": [BUCKET, f"{BUCKET}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    policies = [policy(allow("s3:GetObject", f"{BUCKET}/*")), policy(deny, resource_policy=True)]
    assert evaluate(policies, Request("s3:GetObject", f"{BUCKET}/a", {"aws:SecureTransport": True})).allowed
    assert not evaluate(policies, Request("s3:GetObject", f"{BUCKET}/a", {"aws:SecureTransport": False})).allowed


def test_numeric_and_arn_operators() -> None:
    granted = [
        policy(
            allow(
                "sagemaker:CreateTrainingJob",
                "*",
                NumericLessThanEquals={"sagemaker:MaxRuntimeInSeconds": "432000"},
                ArnLike={"aws:SourceArn": "arn:aws:states:*:123456789012:stateMachine:*"},
            )
        )
    ]
    source = "arn:aws:states:us-east-1:123456789012:stateMachine:Pipeline"
    assert allows(
        granted, "sagemaker:CreateTrainingJob", "j", **{"sagemaker:MaxRuntimeInSeconds": 3600, "aws:SourceArn": source}
    )
    assert not allows(
        granted,
        "sagemaker:CreateTrainingJob",
        "j",
        **{"sagemaker:MaxRuntimeInSeconds": 432001, "aws:SourceArn": source},
    )


def test_trust_policies_match_the_service_principal() -> None:
    trust = policy(
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"},
        resource_policy=True,
    )
    assert evaluate([trust], Request("sts:AssumeRole", "arn:role", principal_service="lambda.amazonaws.com")).allowed
    assert not evaluate(
        [trust], Request("sts:AssumeRole", "arn:role", principal_service="sagemaker.amazonaws.com")
    ).allowed


def test_a_condition_key_the_model_does_not_compute_is_a_loud_gap() -> None:
    granted = [policy(allow("dynamodb:PutItem", TABLE, StringEquals={"dynamodb:LeadingKeys": ["a"]}))]
    with pytest.raises(UnmodelledConditionKey, match="dynamodb:LeadingKeys"):
        evaluate(granted, Request("dynamodb:PutItem", TABLE))

"""Every policy statement of the synthesized templates against AWS's Service Authorization Reference.

moto accepts any action name, condition key and ARN; AWS does not. A statement the reference
rejects is a permission that silently grants nothing (a call denied in production only) or one
broader than written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.aws.cfn import ACCOUNT, REGION, Assembly, Resolver
from tests.support.iam import AssemblyIam
from tests.support.iam_reference import Finding, actions_matching, check_statement, unscoped_actions

# Policy documents of resource types whose statements the reference can check, by property.
IDENTITY_POLICIES = {
    "AWS::IAM::Role": "Policies",
    "AWS::IAM::Policy": "PolicyDocument",
    "AWS::IAM::ManagedPolicy": "PolicyDocument",
}
RESOURCE_POLICIES = {
    "AWS::IAM::Role": "AssumeRolePolicyDocument",
    "AWS::KMS::Key": "KeyPolicy",
    "AWS::S3::BucketPolicy": "PolicyDocument",
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::SQS::QueuePolicy": "PolicyDocument",
    "AWS::ECR::Repository": "RepositoryPolicyText",
    "AWS::Logs::ResourcePolicy": "PolicyDocument",
    "AWS::EC2::VPCEndpoint": "PolicyDocument",
}

# (where, action) the platform grants on "*" although the reference lets the action name a resource
# type, each with why no resource can be named there. Anything else granted on "*" names its resources.
UNSCOPED: dict[tuple[str, str], str] = {
    **{
        ("TrainingImageProviderwaiterstatemachineRole", action): "The CDK Provider framework's own waiter state "
        "machine: its role's log-delivery statement is the framework's, not the platform's, to scope."
        for action in ("logs:CreateLogStream", "logs:PutLogEvents")
    },
}


def statements(directory: Path) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(stack/logical ID/policy name, resolved statement, whether a resource policy) of every policy."""
    assembly = Assembly.load(directory)
    resolver = Resolver(assembly)
    for types, resource_policy in ((IDENTITY_POLICIES, False), (RESOURCE_POLICIES, True)):
        for type_, prop in types.items():
            for stack, logical, resource in assembly.resources(type_):
                value = resource.get("Properties", {}).get(prop)
                if value is None:
                    continue
                documents = (
                    [(p["PolicyName"], p["PolicyDocument"]) for p in value] if prop == "Policies" else [(prop, value)]
                )
                for name, document in documents:
                    resolved = resolver.resolve(stack, document)
                    for statement in resolved.get("Statement", []):
                        yield f"{stack}/{logical}/{name}", statement, resource_policy


def findings(directory: Path) -> list[Finding]:
    found: list[Finding] = []
    for where, statement, resource_policy in statements(directory):
        found += check_statement(where, statement, resource_policy=resource_policy)
        if not resource_policy:
            sid = statement.get("Sid", "(none)")
            found += [
                Finding(f"{where}, Sid {sid}", action, "granted on * although it accepts a resource type")
                for action in unscoped_actions(statement)
                if not any(part in where and action == allowed for part, allowed in UNSCOPED)
            ]
    return found


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_every_statement_is_true_to_the_service_authorization_reference(built: str, request: Any) -> None:
    assembly = request.getfixturevalue(built).assembly
    problems = findings(Path(assembly.directory))
    assert not problems, "\n".join(map(str, problems))


def test_every_kms_create_grant_is_for_an_aws_resource(platform: Any) -> None:
    """A grant is a standing permission outside every policy: only an AWS service acting for a caller
    (EBS, FSx) may create one, in identity and key policies alike (`kms:*` included)."""
    unbound = [
        where
        for where, statement, _ in statements(Path(platform.assembly.directory))
        if statement.get("Effect") == "Allow"
        and any(
            a.name == "kms:CreateGrant"
            for pattern in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
            for a in actions_matching(pattern)
        )
        and str(statement.get("Condition", {}).get("Bool", {}).get("kms:GrantIsForAWSResource")).lower() != "true"
    ]
    assert unbound == []


def test_vpc_function_roles_reach_only_their_own_network(platform: Any) -> None:
    """A function's role creates interfaces only in its own subnets with its own security groups, and
    deletes or re-addresses interfaces only in the platform VPC."""
    iam = AssemblyIam(Path(platform.assembly.directory))
    ec2_arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    interface = f"{ec2_arn}:network-interface/eni-0123456789abcdef0"
    ((stack, logical, _),) = iam.resources("AWS::EC2::VPC")
    vpc = f"{ec2_arn}:vpc/{iam.resolver.ref(stack, logical)}"
    other_vpc = {"ec2:Vpc": f"{ec2_arn}:vpc/vpc-0ther"}
    in_vpc = [
        (logical, iam.roles[props["Role"]])
        for _, logical, props in iam.resources("AWS::Lambda::Function")
        if props.get("VpcConfig")
    ]
    assert len(in_vpc) >= 7
    reach = {
        logical: [
            role.may("ec2:CreateNetworkInterface", f"{ec2_arn}:subnet/subnet-0ther"),
            role.may("ec2:CreateNetworkInterface", f"{ec2_arn}:security-group/sg-0ther"),
            role.may("ec2:CreateNetworkInterface", "*"),
            *(
                role.may(action, interface, **other_vpc)
                for action in (
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                )
            ),
            not role.may("ec2:DeleteNetworkInterface", interface, **{"ec2:Vpc": vpc}),
        ]
        for logical, role in in_vpc
    }
    assert {logical: r for logical, r in reach.items() if any(r)} == {}


def test_training_role_changes_interface_permissions_only_in_the_platform_vpc(platform: Any) -> None:
    iam = AssemblyIam(Path(platform.assembly.directory))
    (role,) = [r for r in iam.roles.values() if r.logical.startswith("TrainingExecutionRole")]
    interface = f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"
    other_vpc = {"ec2:Vpc": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-0ther"}
    assert not role.may("ec2:DeleteNetworkInterfacePermission", interface, **other_vpc)
    assert not role.may("ec2:DeleteNetworkInterfacePermission", "*")


# The checker itself, on hand-made statements: each class of mismatch is reported, a true statement is not.
ARN_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ({"Action": "s3:GetObjekt", "Resource": "arn:aws:s3:::b/*"}, "no such action"),
        ({"Action": "kms:Frobnicate*", "Resource": ARN_KEY}, "no such action"),
        (
            {
                "Action": "kms:Describe*",
                "Resource": ARN_KEY,
                "Condition": {"ArnLike": {"kms:EncryptionContext:x": "y"}},
            },
            "condition key kms:EncryptionContext:x is not supported",
        ),
        (
            {"Action": "kms:DescribeKey", "Resource": ARN_KEY, "Condition": {"StringEquals": {"s3:prefix": "a"}}},
            "condition key s3:prefix is not supported",
        ),
        ({"Action": "fsx:DescribeFileSystems", "Resource": "arn:aws:fsx:us-east-1:1:file-system/fs-1"}, "only *"),
        ({"Action": "states:SendTaskSuccess", "Resource": "arn:aws:states:us-east-1:1:stateMachine:m"}, "only *"),
        ({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::bucket"}, "no resource of"),
        ({"Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bucket/*"}, "no resource of"),
        (
            {
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": ["arn:aws:s3:::b/*", "arn:aws:sqs:us-east-1:1:q"],
            },
            "resource arn:aws:sqs:us-east-1:1:q is one none of the actions accepts",
        ),
        ({"NotAction": "s3:GetObject", "Resource": "*"}, "NotAction"),
    ],
)
def test_the_checker_reports_each_kind_of_mismatch(statement: dict[str, Any], problem: str) -> None:
    found = check_statement("stack/Role/Policy", {"Effect": "Allow", **statement})
    assert found and all("stack/Role/Policy, Sid (none)" in str(f) for f in found)
    assert any(problem in f.problem for f in found), found


@pytest.mark.parametrize(
    "statement",
    [
        {"Action": ["s3:GetObject", "s3:ListBucket"], "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/runs/*"]},
        {"Action": "logs:PutLogEvents", "Resource": "arn:aws:logs:us-east-1:1:log-group:/aws/x:*"},
        {"Action": "kms:Decrypt*", "Resource": ARN_KEY, "Condition": {"StringEquals": {"kms:ViaService": "s"}}},
        {"Action": "kms:Decrypt", "Resource": ARN_KEY, "Condition": {"StringLike": {"kms:EncryptionContext:a": "b"}}},
        {"Action": "sts:AssumeRole", "Resource": "*", "Condition": {"StringEquals": {"aws:SourceAccount": "1"}}},
        {"Action": "xray:PutTraceSegments", "Resource": "*"},
        {"Action": "ec2:DeleteNetworkInterface", "Resource": "arn:aws:ec2:us-east-1:1:network-interface/*"},
    ],
)
def test_the_checker_accepts_true_statements(statement: dict[str, Any]) -> None:
    assert check_statement("stack/Role/Policy", {"Effect": "Allow", **statement}) == []


def test_star_on_an_action_that_names_resources_is_reported() -> None:
    statement = {"Effect": "Allow", "Action": ["ec2:DescribeSubnets", "ec2:DeleteNetworkInterface"], "Resource": "*"}
    assert unscoped_actions(statement) == ["ec2:DeleteNetworkInterface"]
    assert unscoped_actions({**statement, "Effect": "Deny"}) == []

"""A customer-managed key whose use the account's IAM decides, except grants, which only AWS services make."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

# Managing the key, never using it (no Decrypt, Encrypt, GenerateDataKey, ReEncrypt or CreateGrant).
ADMINISTRATION = [
    "kms:DescribeKey",
    "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus",
    "kms:ListGrants",
    "kms:ListKeyPolicies",
    "kms:ListResourceTags",
    "kms:PutKeyPolicy",
    "kms:EnableKey",
    "kms:DisableKey",
    "kms:EnableKeyRotation",
    "kms:DisableKeyRotation",
    "kms:RotateKeyOnDemand",
    "kms:UpdateKeyDescription",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:CreateAlias",
    "kms:UpdateAlias",
    "kms:DeleteAlias",
    "kms:RevokeGrant",
    "kms:RetireGrant",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
]
# The cryptographic operations of a symmetric key that IAM policies may grant to the platform's roles.
CRYPTOGRAPHY = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]


def grants_for_aws_services_only() -> iam.PolicyStatement:
    """A key-policy deny of every grant that no AWS service creates for a resource of its own, whatever any other
    statement or IAM policy allows (Control Tower's CT.KMS.PR.3 form: BoolIfExists on both keys)."""
    return iam.PolicyStatement(
        sid="NoGrantsButForAwsServices",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["kms:CreateGrant"],
        resources=["*"],
        conditions={"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}},
    )


def account_key(scope: Construct, id_: str, *, description: str) -> kms.Key:
    """A retained, rotating key: administered and used as the account's IAM allows (CDK's default
    `kms:*` for the account, less CreateGrant), while a grant, a standing permission outside every
    policy, is created only by an AWS service acting for a caller (EBS, FSx, ECR, DynamoDB)."""
    account = iam.AccountRootPrincipal()
    policy = iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid="AccountIamDecides", principals=[account], actions=[*ADMINISTRATION, *CRYPTOGRAPHY], resources=["*"]
            ),
            iam.PolicyStatement(
                sid="GrantsForAwsResourcesOnly",
                principals=[account],
                actions=["kms:CreateGrant"],
                resources=["*"],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            ),
            grants_for_aws_services_only(),
        ]
    )
    return kms.Key(
        scope,
        id_,
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.RETAIN,
        policy=policy,
    )

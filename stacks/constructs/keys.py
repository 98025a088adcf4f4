"""A customer-managed key whose use the account's IAM decides, except grants, which only AWS services make."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.constructs.execution_key import ADMINISTRATION

# The cryptographic operations of a symmetric key that IAM policies may grant to the platform's roles.
CRYPTOGRAPHY = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]


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

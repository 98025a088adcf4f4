"""Physical names, where the platform chooses to have them.

Bucket names are deterministic (stage, purpose, account, Region) although CDK could generate
them: ML engineers write dataset URIs in execution inputs, IAM statements and cdk-nag
acknowledgements that scope object prefixes stay readable in review, and the pipeline stack
addresses the buckets without a cross-stack export per ARN. This function is the one place
both stacks get a name from.
"""

from __future__ import annotations

from aws_cdk import Stack
from constructs import Construct

BUCKET_PURPOSES = ("datasets", "checkpoints", "artifacts", "access-logs")


def bucket_name(scope: Construct, stage: str, purpose: str) -> str:
    """`tp-<stage>-<purpose>-<account>-<region>`: at most 63 characters for a stage of at most 20."""
    if purpose not in BUCKET_PURPOSES:
        raise ValueError(f"unknown bucket purpose {purpose!r}; one of {BUCKET_PURPOSES}")
    stack = Stack.of(scope)
    return f"tp-{stage}-{purpose}-{stack.account}-{stack.region}"


def ec2_arn_prefix(scope: Construct) -> str:
    """`arn:<partition>:ec2:<region>:<account>` of the scope's stack; EC2 resource ARNs append `:<type>/<id>`."""
    stack = Stack.of(scope)
    return f"arn:{stack.partition}:ec2:{stack.region}:{stack.account}"

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

CHECKPOINT_WRITERS_PATH = "/training-platform/checkpoint-writers/"
"""The IAM path of the roles that write or delete runs' checkpoints (the training roles, the ledger opener's copy,
the cleanups' prune): the checkpoints bucket's policy refuses those writes to every principal not on it
(stacks/constructs/buckets.py). A role's path is part of its ARN and of `aws:PrincipalArn`, and only a principal
that may create IAM roles can put one on it."""


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


def checkpoint_writers_arn(scope: Construct) -> str:
    """`aws:PrincipalArn` of every role on `CHECKPOINT_WRITERS_PATH` in the scope's account, as `ArnLike` takes it."""
    stack = Stack.of(scope)
    return f"arn:{stack.partition}:iam::{stack.account}:role{CHECKPOINT_WRITERS_PATH}*"

"""What training containers may do in S3, for every backend's role (SageMaker's execution role, Batch's job role).

Training code reads datasets and runs' packed code, reads and writes checkpoints and writes its outputs; it never
writes a run's lineage (only the platform's handlers do: Register, the progress handlers' ledgers) nor any run's
packed code (`tp` uploads it, written once), and never deletes: pruning old checkpoints is the platform's
(lambdas/jobs/prune.py). The three denials hold whatever else a role is granted.
Training code of one run can still write into another run's checkpoint prefix (one role serves every job),
which is why a job loads only a checkpoint its run's ledger records (contract/ledger.py), which training roles
may read and never write, verifies the digest of every segment of every file it loads (BLAKE3; SHA-256 in older
manifests) and never unpickles anything but DCP's own metadata types (training/checkpoint/reader.py)."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import IConstruct

from contract.layout import ANY_CHECKPOINT, ANY_CODE, ANY_LEDGER_RECORD, ANY_LINEAGE, ANY_RUN
from stacks.constructs.nag import acknowledge_wildcard


def training_storage_statements(
    *, datasets: s3.IBucket, checkpoints: s3.IBucket, artifacts: s3.IBucket
) -> dict[str, iam.PolicyStatement]:
    """The S3 statements of a training role, by Sid."""
    return {
        "ReadDatasets": iam.PolicyStatement(
            actions=["s3:GetObject", "s3:ListBucket"], resources=[datasets.bucket_arn, f"{datasets.bucket_arn}/*"]
        ),
        "RunCheckpoints": iam.PolicyStatement(
            actions=["s3:GetObject", "s3:PutObject"], resources=[f"{checkpoints.bucket_arn}/{ANY_CHECKPOINT}"]
        ),
        "ListRunCheckpoints": iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[checkpoints.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [ANY_CHECKPOINT]}},
        ),
        # The ledger channel: SageMaker (or the Batch contract) downloads the run's ledger with this role.
        "ReadRunLedgers": iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[f"{artifacts.bucket_arn}/{ANY_LEDGER_RECORD}"]
        ),
        "ListRunLedgers": iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[artifacts.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [ANY_LEDGER_RECORD]}},
        ),
        # The code channel: SageMaker (or the Batch contract) downloads the run's packed code with this role.
        "ReadRunCode": iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{artifacts.bucket_arn}/{ANY_CODE}"]),
        "ListRunCode": iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[artifacts.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [ANY_CODE]}},
        ),
        "WriteOutputs": iam.PolicyStatement(actions=["s3:PutObject"], resources=[f"{artifacts.bucket_arn}/{ANY_RUN}"]),
        "NoLineageWrites": iam.PolicyStatement(
            effect=iam.Effect.DENY, actions=["s3:PutObject"], resources=[f"{artifacts.bucket_arn}/{ANY_LINEAGE}"]
        ),
        "NoCodeWrites": iam.PolicyStatement(
            effect=iam.Effect.DENY, actions=["s3:PutObject"], resources=[f"{artifacts.bucket_arn}/{ANY_CODE}"]
        ),
        "NoDeletes": iam.PolicyStatement(
            effect=iam.Effect.DENY,
            actions=["s3:DeleteObject", "s3:DeleteObjectVersion"],
            resources=[f"{bucket.bucket_arn}/*" for bucket in (datasets, checkpoints, artifacts)],
        ),
    }


def acknowledge_training_storage(
    role: IConstruct, *, datasets: s3.IBucket, checkpoints: s3.IBucket, artifacts: s3.IBucket
) -> None:
    """The wildcard resources of `training_storage_statements`' allowances, each with its reason."""
    for resource, reason in {
        f"{datasets.bucket_arn}/*": "Read-only: any dataset the request's channels name under the datasets bucket.",
        f"{checkpoints.bucket_arn}/{ANY_CHECKPOINT}": (
            "Each run's checkpoints live under runs/<run>/checkpoints/; one role serves every job's."
        ),
        f"{artifacts.bucket_arn}/{ANY_LEDGER_RECORD}": (
            "Read-only: each run's checkpoint ledger, which its jobs receive as their ledger channel."
        ),
        f"{artifacts.bucket_arn}/{ANY_CODE}": (
            "Read-only: each run's packed code, which its jobs receive as their code channel (one role serves all)."
        ),
        f"{artifacts.bucket_arn}/{ANY_RUN}": (
            "Model, results, profiler and TensorBoard output under runs/; lineage and deletes are denied."
        ),
    }.items():
        acknowledge_wildcard(role, resource, reason)

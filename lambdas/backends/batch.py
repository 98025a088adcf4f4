"""The AWS Batch backend: multi-node parallel jobs on the platform's Batch compute environment
(stacks/pipeline/batch_step.py), and what a request must be to run there (checked beside Validate's own checks)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from contract.distributions import DISTRIBUTIONS
from lambdas.backends.backend import Backend, Deployment
from lambdas.validate.inputs import ExecutionInput

INSTANCE_TYPES_ENV = "BATCH_INSTANCE_TYPES"
MAX_NODES_ENV = "BATCH_MAX_NODES"


@dataclass(frozen=True)
class BatchLimits:
    """The AWS Batch compute environment: the largest cluster's type, and its count as the most nodes a job takes."""

    instance_types: tuple[str, ...] = ()
    """The compute environment's instance types (empty when the platform has none)."""
    max_nodes: int = 0

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> BatchLimits:
        return cls(instance_types=(deployment.largest_cluster_type,), max_nodes=deployment.largest_cluster_count)

    @classmethod
    def from_environment(cls) -> BatchLimits:
        # Set only where the platform deploys the AWS Batch backend.
        return cls(
            instance_types=tuple(json.loads(os.environ.get(INSTANCE_TYPES_ENV, "[]"))),
            max_nodes=int(os.environ.get(MAX_NODES_ENV, "0")),
        )

    def environment(self) -> dict[str, str]:
        return {INSTANCE_TYPES_ENV: json.dumps(list(self.instance_types)), MAX_NODES_ENV: str(self.max_nodes)}


def batch_problems(request: ExecutionInput, limits: BatchLimits) -> list[str]:
    """Why the Batch path cannot run this request, one line each (empty when it can)."""
    problems = []
    if not limits.instance_types:
        problems.append('backend "batch": this platform deploys no AWS Batch compute environment')
        return problems
    if request.instance_groups is not None:
        problems.append(
            "instance_groups: heterogeneous clusters are SageMaker's; give instance_type and instance_count with "
            'backend "batch"'
        )
        return problems
    if request.instance_type is not None and request.instance_type not in limits.instance_types:
        problems.append(
            f"instance_type {request.instance_type!r}: the AWS Batch compute environment runs "
            f"{', '.join(limits.instance_types)} only (network.largest_cluster.instance_type); use it, or "
            'backend "sagemaker"'
        )
    if (request.instance_count or 1) > limits.max_nodes:
        problems.append(
            f"instance_count {request.instance_count}: the AWS Batch job definition and compute environment hold "
            f"{limits.max_nodes} nodes at most (network.largest_cluster.count)"
        )
    if request.spot:
        problems.append(
            "spot: AWS Batch runs multi-node parallel jobs on On-Demand instances only; set spot to false, or use "
            'backend "sagemaker" for managed spot training'
        )
    if request.warm_pool_minutes:
        problems.append('warm_pool_minutes: warm pools are SageMaker\'s; set 0 with backend "batch"')
    strategy = DISTRIBUTIONS.get(request.distribution)
    if strategy is not None and (strategy.required_module or strategy.launcher != "torchrun"):
        problems.append(
            f"distribution {request.distribution!r} needs SageMaker (its library or its SSH between hosts); "
            'use ddp or fsdp with backend "batch"'
        )
    return problems


BATCH = Backend(
    name="batch",
    limits=BatchLimits,
    check=batch_problems,
    step="stacks.pipeline.batch_step.BatchTraining",
    step_id="BatchTrainingStep",
    local="localrun.backends.batch.local_player",
    denies=("batch:SubmitJob",),
)

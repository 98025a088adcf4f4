"""What a request must be to run on the AWS Batch backend (checked beside Validate's own checks)."""

from __future__ import annotations

from lambdas.validate.inputs import ExecutionInput, PlatformLimits
from training.distributions import DISTRIBUTIONS


def batch_problems(request: ExecutionInput, limits: PlatformLimits) -> list[str]:
    """Why the Batch path cannot run this request, one line each (empty when it can)."""
    problems = []
    if not limits.batch_instance_types:
        problems.append('backend "batch": this platform deploys no AWS Batch compute environment')
        return problems
    if request.instance_groups is not None:
        problems.append(
            "instance_groups: heterogeneous clusters are SageMaker's; give instance_type and instance_count with "
            'backend "batch"'
        )
        return problems
    if request.instance_type is not None and request.instance_type not in limits.batch_instance_types:
        problems.append(
            f"instance_type {request.instance_type!r}: the AWS Batch compute environment runs "
            f"{', '.join(limits.batch_instance_types)} only (network.largest_cluster.instance_type); use it, or "
            'backend "sagemaker"'
        )
    if (request.instance_count or 1) > limits.batch_max_nodes:
        problems.append(
            f"instance_count {request.instance_count}: the AWS Batch job definition and compute environment hold "
            f"{limits.batch_max_nodes} nodes at most (network.largest_cluster.count)"
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

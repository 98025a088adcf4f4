"""Capacity fallback handler: after insufficient capacity, the next attempt runs on the request's next fallback
cluster (docs/ml-engineer/capacity-fallback.md); once none is left, attempts stay on the last one tried."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from contract.execution_state import CostEstimate, NextCluster, NextClusterEvent, TrainingRequest
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def next_cluster(request: TrainingRequest, estimate: CostEstimate) -> NextCluster:
    """The request on its next fallback cluster, priced as the estimate priced it; unchanged when none is left.

    The request's `instance_groups` is what CreateTrainingJob's ResourceConfig and the launcher's expectations
    (EFA, GPUs, bandwidth floor) are made from, so replacing it moves the whole job onto the new cluster.
    """
    if not request.fallback_left:
        return NextCluster(request=request, hourly_usd=estimate.hourly_usd)
    index = request.alternative
    return NextCluster(request=request.on_fallback(index), hourly_usd=estimate.fallback_hourly_usd[index])


@classified
@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    parsed = NextClusterEvent.model_validate(event)
    result = next_cluster(parsed.request, parsed.estimate)
    logger.info("next cluster", extra={"cluster": result.request.cluster, "alternative": result.request.alternative})
    return result.model_dump(mode="json")

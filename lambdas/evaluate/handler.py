"""Evaluate handler: did the finished job reach the run's quality gate?"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from contract.execution_state import EvaluateEvent, Evaluation, Quality
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def evaluate(quality: Quality | None, final_metrics: dict[str, float]) -> Evaluation:
    """Pass/fail against the gate; a run without a gate passes, a gate on a missing metric fails."""
    if quality is None:
        return Evaluation(passed=True, reason="no quality gate requested", metrics=final_metrics)
    metric = quality.metric
    value = final_metrics.get(metric)
    if value is None:
        reason = f"{metric} was not reported by the job (reported: {', '.join(sorted(final_metrics)) or 'none'})"
        return Evaluation(passed=False, reason=reason, metrics=final_metrics)
    if quality.max is not None:
        passed = value <= quality.max
        bound = f"<= {quality.max}"
    elif quality.min is not None:
        passed = value >= quality.min
        bound = f">= {quality.min}"
    else:
        raise ValueError(f"the quality gate on {metric} has neither a max nor a min")
    verdict = "meets" if passed else "does not meet"
    return Evaluation(passed=passed, reason=f"{metric} = {value} {verdict} {bound}", metrics=final_metrics)


@classified
@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    parsed = EvaluateEvent.model_validate(event)
    result = evaluate(parsed.quality, parsed.final_metrics)
    logger.info("evaluated", extra={"passed": result.passed, "reason": result.reason})
    return result.model_dump(mode="json")

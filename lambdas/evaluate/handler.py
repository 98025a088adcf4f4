"""Evaluate handler: did the finished job reach the run's quality gate?"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from lambdas.execution_state import Evaluation, Quality

logger = Logger(service="training-platform")


def evaluate(quality: dict[str, Any] | None, final_metrics: dict[str, float]) -> dict[str, Any]:
    """Pass/fail against the gate; a run without a gate passes, a gate on a missing metric fails."""
    if quality is None:
        return {"passed": True, "reason": "no quality gate requested", "metrics": final_metrics}
    metric = quality["metric"]
    value = final_metrics.get(metric)
    if value is None:
        reason = f"{metric} was not reported by the job (reported: {', '.join(sorted(final_metrics)) or 'none'})"
        return {"passed": False, "reason": reason, "metrics": final_metrics}
    if quality.get("max") is not None:
        passed = value <= quality["max"]
        bound = f"<= {quality['max']}"
    else:
        passed = value >= quality["min"]
        bound = f">= {quality['min']}"
    verdict = "meets" if passed else "does not meet"
    return {"passed": passed, "reason": f"{metric} = {value} {verdict} {bound}", "metrics": final_metrics}


@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    quality = Quality.model_validate(event["quality"]).model_dump() if event["quality"] is not None else None
    result = Evaluation.model_validate(evaluate(quality, event["final_metrics"])).model_dump(mode="json")
    logger.info("evaluated", extra={"passed": result["passed"], "reason": result["reason"]})
    return result

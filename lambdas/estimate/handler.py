"""Estimate handler: the run's cost bound from the bundled price table, and whether it needs approval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger

from contract.catalog import PRICES_REVIEWED, instance_type
from contract.execution_state import CostEstimate, EstimateEvent, InstanceGroup, TrainingRequest
from contract.memory import job_memory
from lambdas.estimate.environment import EstimateEnvironment
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Metric, Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.INTAKE)


def estimate(
    request: TrainingRequest,
    *,
    threshold_usd: float,
    spot_fraction: tuple[float, float],
    price_overrides: dict[str, float],
    monthly_budget_usd: float | None = None,
    team_budgets_usd: Mapping[str, float] | None = None,
) -> CostEstimate:
    """Every group's count x hourly price, x max runtime (+ warm-pool keep-alive); spot as an estimated range.

    A tuning job is max_jobs such jobs, each at the single job's worst case, however many run at once. A run with
    `fallback` clusters costs what the dearest of them and its own would: any of them may be the one that runs.
    A worst case above the platform's monthly budget or the run's team's is said in `budget_warning`.
    """
    clusters = [("the run's own cluster", request.instance_groups)] + [
        (f"fallback[{index}]", [group]) for index, group in enumerate(request.fallback)
    ]
    hourly = [_hourly(groups, price_overrides) for _, groups in clusters]
    worst = max(range(len(clusters)), key=lambda index: hourly[index])
    worst_label, worst_groups = clusters[worst]
    types = {group.instance_type for _, groups in clusters for group in groups}
    overridden = [name for name in types if name in price_overrides]
    runtime_hours = request.stopping_condition["MaxRuntimeInSeconds"] / 3600
    keep_alive_hours = request.keep_alive_seconds / 3600
    tuning = request.tuning
    jobs = tuning.max_jobs if tuning else 1
    on_demand = jobs * hourly[worst] * (runtime_hours + keep_alive_hours)
    spot = [round(on_demand * spot_fraction[0], 2), round(on_demand * spot_fraction[1], 2)] if request.spot else None
    # Approval is decided on the worst case the run can cost. For spot that is the on-demand price too:
    # the spot price can rise to it, so the expected range is shown but never approved on.
    max_cost = on_demand
    cluster = " + ".join(f"{group.instance_count} x {group.instance_type}" for group in worst_groups)
    base = request.base_model
    memory = job_memory(
        request.hyperparameters,
        request.instance_groups,
        args=base.shape if base is not None else None,
        trained=base.trained_parameters if base is not None and base.trained_parameters != base.parameters else None,
    )
    return CostEstimate(
        hourly_usd=round(hourly[0], 4),
        on_demand_usd=round(on_demand, 2),
        spot_usd=spot,
        max_cost_usd=round(max_cost, 2),
        threshold_usd=threshold_usd,
        approval_required=max_cost > threshold_usd,
        price_source=_price_source(overridden, len(types)),
        training_jobs=jobs,
        parallel_jobs=tuning.max_parallel_jobs if tuning else 1,
        worst_case=f"{worst_label}: {cluster}",
        fallback_hourly_usd=[round(price, 4) for price in hourly[1:]],
        gpu_memory=memory,
        budget_warning=budget_warning(
            max_cost,
            platform_usd=monthly_budget_usd,
            team=request.team,
            team_usd=(team_budgets_usd or {}).get(request.team or ""),
        ),
    )


def budget_warning(max_cost_usd: float, *, platform_usd: float | None, team: str | None, team_usd: float | None) -> str:
    """Which monthly budgets a run's worst case exceeds, and what that means, in words; "" when it fits them."""
    over = [
        f"{100 * max_cost_usd / budget:.0f}% of {whose} monthly budget of ${budget:,.2f}"
        for whose, budget in (("the platform's", platform_usd), (f"team {team}'s", team_usd))
        if budget and max_cost_usd > budget
    ]
    if not over:
        return ""
    return (
        f"the worst case, ${max_cost_usd:,.2f}, is {' and '.join(over)}: once the month's spend reaches a budget, its "
        "budget stop refuses new runs (jobs already training keep running); lower max_runtime_hours or the cluster, "
        "or ask the platform team about the budget"
    )


def _hourly(groups: list[InstanceGroup], price_overrides: dict[str, float]) -> float:
    """A cluster's list price per hour (or the settings' override of a type's)."""
    return sum(
        group.instance_count
        * price_overrides.get(group.instance_type, instance_type(group.instance_type).price_per_hour)
        for group in groups
    )


def _price_source(overridden: list[str], types: int) -> str:
    listed = f"list price, reviewed {PRICES_REVIEWED}"
    if not overridden:
        return listed
    if len(overridden) == types:
        return "settings override"
    return f"settings override for {', '.join(sorted(overridden))}; {listed} for the rest"


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    environment = EstimateEnvironment.from_environ()
    result = estimate(
        EstimateEvent.model_validate(event).request,
        threshold_usd=environment.approval_threshold_usd,
        spot_fraction=environment.spot_cost_fraction,
        price_overrides=environment.price_overrides,
        monthly_budget_usd=environment.monthly_budget_usd,
        team_budgets_usd=environment.team_budgets_usd,
    )
    logger.info("cost estimated", extra=result.model_dump(mode="json"))
    metrics.record(Metric.ESTIMATED_MAX_COST, result.max_cost_usd)
    return result.model_dump(mode="json")

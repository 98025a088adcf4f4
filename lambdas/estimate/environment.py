"""The Estimate handler's environment (stacks/pipeline/intake.py sets it)."""

from __future__ import annotations

from lambdas.shared.env import HandlerEnvironment


class EstimateEnvironment(HandlerEnvironment):
    approval_threshold_usd: float
    """A run that may cost more needs launch approval."""
    spot_cost_fraction: tuple[float, float]
    """The range of the on-demand price a spot run is expected to cost."""
    price_overrides: dict[str, float]
    """Hourly prices by instance type, instead of the catalog's list prices."""
    monthly_budget_usd: float
    """The platform's monthly budget (pipeline.monthly_budget_usd)."""
    team_budgets_usd: dict[str, float]
    """Each team's monthly budget (teams[].monthly_budget_usd), by team name."""

"""Whether a budget stop is in force: the platform's, or a run's team's. Then no run (of the team) can start a job
on any backend, so Validate refuses it in words before anything is created.

When a monthly budget is spent, AWS Budgets attaches a deny policy to the roles that start jobs and to Validate's
(stacks/constructs/cost_controls.py BudgetStop, TeamBudget). Besides denying what starts jobs, it denies
describing one job that never exists, its probe (`probe_job`). Validate describes it: the answer "not found"
means the stop is not in force; an explicit deny means it is. This asks IAM's own evaluation through the
SageMaker endpoint the pipeline already reaches, where reading the role's attached policies would need the IAM
API, which the platform's VPC has no endpoint for.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

PROBE_JOB = "platform-budget-probe"
"""A training job no run can be named (a run's jobs end in -<16 hex>-<attempt>): the platform stop's probe."""


def probe_job(team: str | None = None) -> str:
    """The training job whose description the platform's budget stop denies, or team `team`'s stop."""
    return PROBE_JOB if team is None else f"{PROBE_JOB}-{team}"


def budget_stopped(sagemaker: Any, probe_job: str) -> bool:
    """True when the budget stop's explicit deny answers; any other refusal is a platform fault."""
    try:
        sagemaker.describe_training_job(TrainingJobName=probe_job)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationException":
            return False  # not found: nothing denies it
        if (
            error.get("Code") in ("AccessDeniedException", "AccessDenied")
            and "explicit deny" in str(error.get("Message", "")).lower()
        ):
            return True
        raise
    raise RuntimeError(f"training job {probe_job} exists; it is the budget probe and must never be created")


def refusal(*, limit_usd: float, contact: str, team: str | None = None) -> str:
    """Why no run (of `team`) is accepted, and whom to ask."""
    if team is None:
        spent = f"the platform's monthly budget of ${limit_usd:,.2f} is spent"
        setting = "pipeline.monthly_budget_usd"
    else:
        spent = f"team {team!r}'s monthly budget of ${limit_usd:,.2f} is spent"
        setting = "the team's teams[].monthly_budget_usd"
    return (
        "The training request cannot run:\n"
        f"  - budget: {spent}, and AWS Budgets has stopped "
        "new training jobs on every backend (jobs already training keep running). "
        f"Ask {contact} to raise the budget ({setting}) or to reverse the budget action."
    )

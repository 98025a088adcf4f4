"""Whether the platform's budget stop is in force: then no run can create a training job, so none starts.

When the monthly budget is spent, AWS Budgets attaches a deny policy to the roles that create
training jobs and to Validate's (stacks/constructs/cost_controls.py BudgetStop). Besides denying
CreateTrainingJob, it denies describing one job that never exists. Validate describes it: the
answer "not found" means the stop is not in force; an explicit deny means it is. This asks IAM's
own evaluation through the SageMaker endpoint the pipeline already reaches, where reading the
role's attached policies would need the IAM API, which the platform's VPC has no endpoint for.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError


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


def refusal(*, limit_usd: float, contact: str) -> str:
    return (
        "The training request cannot run:\n"
        f"  - budget: the platform's monthly budget of ${limit_usd:,.2f} is spent, and AWS Budgets has stopped "
        "new training jobs (jobs already training keep running). "
        f"Ask {contact} to raise the budget (pipeline.monthly_budget_usd) or to reverse the budget action."
    )

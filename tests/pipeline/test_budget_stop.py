"""The budget stop, applied as AWS Budgets applies it: new runs are refused with the reason, creates are denied."""

from __future__ import annotations

from typing import Any

import boto3

from localrun.aws.cfn import REGION
from tests.conftest import platform_context
from tests.pipeline.conftest import Pipeline

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 4, "max_runtime_hours": 10}


def _budget_action(pipeline: Pipeline) -> dict[str, Any]:
    """The IAM action definition of the platform's budget action, resolved."""
    local = pipeline.local
    ((stack, _, action),) = list(local.assembly.resources("AWS::Budgets::BudgetsAction"))
    props = local.resolver.resolve(stack, action["Properties"])
    assert (props["ActionType"], props["ApprovalModel"], props["NotificationType"]) == (
        "APPLY_IAM_POLICY",
        "AUTOMATIC",
        "ACTUAL",
    )
    definition: dict[str, Any] = props["Definition"]["IamActionDefinition"]
    return definition


def _apply(pipeline: Pipeline, *, reverse: bool = False) -> None:
    """What Budgets does at 100% of actual spend (attach), or when an administrator reverses the action."""
    iam = boto3.client("iam", region_name=REGION)
    definition = _budget_action(pipeline)
    for role in definition["Roles"]:
        if reverse:
            iam.detach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])
        else:
            iam.attach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])


def test_a_spent_budget_refuses_new_runs_with_the_reason_and_who_to_ask(pipeline: Pipeline) -> None:
    _apply(pipeline)
    arn = pipeline.start(pipeline.input(), name="over-budget")
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "InvalidRequest")
    budget_emails = platform_context()["platform"]["notifications"]["budget_emails"]
    assert "monthly budget of $10,000.00 is spent" in cause, cause
    assert f"Ask {', '.join(budget_emails)} to raise the budget (pipeline.monthly_budget_usd)" in cause, cause
    assert pipeline.jobs() == []

    _apply(pipeline, reverse=True)  # reversed: runs are accepted again
    arn = pipeline.start(pipeline.input(), name="budget-restored")
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert len(pipeline.jobs()) == 1


def test_the_stop_denies_creating_jobs_to_a_run_accepted_before_it(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input(**EXPENSIVE), name="accepted-then-stopped")
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    _apply(pipeline)  # the budget is spent while the run waits for its approval
    pipeline.decide("launch", "approve")
    described = pipeline.finish(arn)
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "TrainingJobNotCreated")
    assert "sagemaker:CreateTrainingJob" in cause and "NoNewTrainingJobs" in cause, cause
    assert pipeline.jobs() == []

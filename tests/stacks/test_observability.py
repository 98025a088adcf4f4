"""The dashboard, the budget's alerts and its stop, as the pipeline template declares them."""

from __future__ import annotations

import json
from typing import Any

from lambdas.shared.metrics import BY_TEAM, NAMESPACE, STAGE_OF, Metric
from stacks.constructs.cost_controls import BUDGET_PROBE_JOB
from stacks.constructs.dashboard import SAGEMAKER_TRAINING_NAMESPACE, TRAINING_FIGURES
from tests.conftest import TEAMS
from tests.support.templates import get_att, logical_id, resources


def _dashboard_body(platform: Any) -> str:
    ((dashboard),) = resources(platform, platform.pipeline, "AWS::CloudWatch::Dashboard").values()
    body: str = json.dumps(dashboard["Properties"]["DashboardBody"])
    return body


def test_the_dashboard_graphs_every_metric_the_handlers_emit_with_their_dimensions(platform: Any) -> None:
    body = _dashboard_body(platform)
    for metric in set(Metric) - BY_TEAM:  # the shipped settings have no teams
        # ["<namespace>","<name>","service","training-platform","stage","<stage>"] in the widget JSON
        expected = f'\\"{NAMESPACE}\\",\\"{metric.value}\\",\\"service\\",\\"training-platform\\",\\"stage\\",'
        assert expected + f'\\"{STAGE_OF[metric].value}\\"' in body, metric


def _widgets(platform: Any) -> list[dict[str, Any]]:
    """The dashboard's widgets, its body's Fn::Join resolved (the tokens in it are not the widgets' concern)."""
    ((dashboard),) = resources(platform, platform.pipeline, "AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = "".join(p if isinstance(p, str) else "token" for p in parts)
    widgets: list[dict[str, Any]] = json.loads(body)["widgets"]
    return widgets


def test_each_teams_spend_this_month_is_graphed_against_its_budget_and_none_without_teams(
    platform: Any, variant: Any
) -> None:
    def team_graphs(widgets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [w for w in widgets if "team" in w["properties"].get("title", "").lower()]

    assert team_graphs(_widgets(platform)) == []
    (graph,) = team_graphs(_widgets(variant))
    props = graph["properties"]
    assert props["start"] == "-P30D"
    lines = [m for m in props["metrics"] if "expression" in m[0]]
    daily = {m[-1]["id"]: m for m in props["metrics"] if "expression" not in m[0]}
    assert [line[0]["label"] for line in lines] == ["vision", "language"]
    for line in lines:
        (source,) = [i for i in daily if f"RUNNING_SUM({i})" == line[0]["expression"]]
        namespace, name, *dimensions, options = daily[source]
        assert (namespace, name) == (NAMESPACE, Metric.TEAM_TRAINING_COST.value)
        assert dict(zip(dimensions[::2], dimensions[1::2], strict=True)) == {
            "service": "training-platform",
            "stage": "training",
            "team": line[0]["label"],
        }
        assert (options["stat"], options["period"], options["visible"]) == ("Sum", 86400, False)
    budgets = {a["label"]: a["value"] for a in props["annotations"]["horizontal"]}
    assert budgets == {f"{t['name']} budget": t["monthly_budget_usd"] for t in TEAMS}


def test_the_dashboard_shows_runs_model_figures_per_job_and_handler_errors(platform: Any) -> None:
    stack = platform.pipeline
    body = _dashboard_body(platform)
    for name in ("ExecutionsStarted", "ExecutionsSucceeded", "ExecutionsFailed", "ExecutionsAborted"):
        assert f'\\"AWS/States\\",\\"{name}\\"' in body, name
    for metric_name, _ in TRAINING_FIGURES:
        search = (
            f'SEARCH(\'{{\\\\\\"{SAGEMAKER_TRAINING_NAMESPACE}\\\\\\",Host}} MetricName=\\\\\\"{metric_name}\\\\\\"\''
        )
        assert search in body, metric_name
    functions = resources(platform, stack, "AWS::Lambda::Function")
    handlers = [f for f in functions if not f.startswith(("AWS", "Custom", "LogRetention", "BucketNotifications"))]
    graphed = [f for f in handlers if json.dumps({"Ref": f}) in body]
    assert sorted(graphed) == sorted(handlers)


def test_the_budget_alerts_at_80_percent_and_stops_new_jobs_at_100(platform: Any) -> None:
    stack = platform.pipeline
    ((budget),) = resources(platform, stack, "AWS::Budgets::Budget").values()
    alerts = {
        (n["Notification"]["NotificationType"], n["Notification"]["Threshold"])
        for n in budget["Properties"]["NotificationsWithSubscribers"]
    }
    assert alerts == {("ACTUAL", 80), ("FORECASTED", 100)}
    ((action),) = resources(platform, stack, "AWS::Budgets::BudgetsAction").values()
    props = action["Properties"]
    assert (props["ActionType"], props["ApprovalModel"], props["NotificationType"]) == (
        "APPLY_IAM_POLICY",
        "AUTOMATIC",
        "ACTUAL",
    )
    assert props["ActionThreshold"] == {"Type": "PERCENTAGE", "Value": 100}
    machine_role = logical_id(platform, stack, "AWS::IAM::Role", "TrainingPipelineRole")
    validate_role = logical_id(platform, stack, "AWS::IAM::Role", "ValidateRole")
    definition = props["Definition"]["IamActionDefinition"]
    assert definition["Roles"] == [{"Ref": machine_role}, {"Ref": validate_role}]

    deny = resources(platform, stack, "AWS::IAM::ManagedPolicy")[definition["PolicyArn"]["Ref"]]
    statements = {s["Sid"]: s for s in deny["Properties"]["PolicyDocument"]["Statement"]}
    assert statements["NoNewTrainingJobs"]["Effect"] == "Deny"
    assert statements["NoNewTrainingJobs"]["Action"] == ["batch:SubmitJob", "sagemaker:CreateTrainingJob"]
    assert BUDGET_PROBE_JOB in json.dumps(statements["BudgetStopInForce"]["Resource"])
    assert "Roles" not in deny["Properties"]  # attached by Budgets only, never by the deploy


def test_budgets_may_attach_only_the_stop_and_only_to_its_roles(platform: Any) -> None:
    stack = platform.pipeline
    ((action),) = resources(platform, stack, "AWS::Budgets::BudgetsAction").values()
    role_id = action["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    role = resources(platform, stack, "AWS::IAM::Role")[role_id]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    (policy,) = [
        p
        for p in resources(platform, stack, "AWS::IAM::Policy").values()
        if p["Properties"]["Roles"] == [{"Ref": role_id}]
    ]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    definition = action["Properties"]["Definition"]["IamActionDefinition"]
    assert statement["Action"] == ["iam:AttachRolePolicy", "iam:DetachRolePolicy"]
    assert statement["Resource"] == [get_att(r["Ref"], "Arn") for r in definition["Roles"]]
    assert statement["Condition"] == {"ArnEquals": {"iam:PolicyARN": definition["PolicyArn"]}}

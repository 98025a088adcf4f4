"""The platform's CloudWatch dashboard: runs, approvals, training jobs, spend, model metrics, faults.

Its sources are the state machine's own metrics, the handlers' embedded metrics (names and
dimensions from lambdas/shared/metrics.py, so a graph cannot ask for a metric nobody emits),
SageMaker's training-job metrics (the MetricDefinitions of contract/metrics.py, one line per job
host) and each handler's Lambda errors.
"""

from __future__ import annotations

import functools

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from lambdas.shared.metrics import GOODPUT_LOG_MESSAGE, NAMESPACE, SERVICE, STAGE_OF, TEAM_DIMENSION, Metric

# SageMaker publishes a training job's MetricDefinitions here, with the dimension Host = "<job>/algo-<n>".
SAGEMAKER_TRAINING_NAMESPACE = "/aws/sagemaker/TrainingJobs"
# The model's figures graphed per job: (metric definition name, graph title).
TRAINING_FIGURES = (
    ("train:loss", "Training loss per job"),
    ("train:tokens_per_sec", "Tokens per second per job"),
    ("train:mfu", "Model FLOPs utilisation per job"),
)
PERIOD = Duration.minutes(5)
# The teams' spend: summed by day, over the last 30 days (a team's budget is a month's).
TEAM_SPEND_PERIOD = Duration.days(1)
TEAM_SPEND_RANGE = "-P30D"


def platform_metric(metric: Metric, statistic: str = "Sum") -> cloudwatch.Metric:
    """A handler's embedded metric, with exactly the dimensions the handler writes."""
    return cloudwatch.Metric(
        namespace=NAMESPACE,
        metric_name=metric.value,
        dimensions_map={"service": SERVICE, "stage": STAGE_OF[metric].value},
        statistic=statistic,
        period=PERIOD,
    )


def team_spend(team: str, index: int) -> cloudwatch.MathExpression:
    """A team's training spend (list price) added up day by day over the graph's range."""
    daily = cloudwatch.Metric(
        namespace=NAMESPACE,
        metric_name=Metric.TEAM_TRAINING_COST.value,
        dimensions_map={"service": SERVICE, "stage": STAGE_OF[Metric.TEAM_TRAINING_COST].value, TEAM_DIMENSION: team},
        statistic="Sum",
        period=TEAM_SPEND_PERIOD,
    )
    return cloudwatch.MathExpression(
        expression=f"RUNNING_SUM(team{index})",
        using_metrics={f"team{index}": daily},
        label=team,
        period=TEAM_SPEND_PERIOD,
    )


def per_job(metric_name: str) -> cloudwatch.MathExpression:
    """Every training job's line of one SageMaker training metric (a search: jobs come and go)."""
    return cloudwatch.MathExpression(
        expression=(
            f'SEARCH(\'{{"{SAGEMAKER_TRAINING_NAMESPACE}",Host}} MetricName="{metric_name}"\', '
            f"'Average', {int(PERIOD.to_seconds())})"
        ),
        label="",
        period=PERIOD,
    )


def goodput_percent() -> cloudwatch.MathExpression:
    """The training stage's goodput: its jobs' productive instance-seconds over their billed ones, in percent."""
    return cloudwatch.MathExpression(
        expression="100 * productive / billed",
        using_metrics={
            "productive": platform_metric(Metric.PRODUCTIVE_INSTANCE_SECONDS),
            "billed": platform_metric(Metric.BILLED_INSTANCE_SECONDS),
        },
        label="goodput %",
        period=PERIOD,
    )


# A graph of half the dashboard's width.
graph = functools.partial(cloudwatch.GraphWidget, width=12, height=6)


def run_rows(state_machine: sfn.IStateMachine) -> list[list[cloudwatch.IWidget]]:
    """Runs started and ended, requests at intake; approvals waiting and decided."""
    m = platform_metric
    return [
        [
            graph(
                title="Runs, and models registered",
                left=[
                    state_machine.metric_started(period=PERIOD, label="started"),
                    state_machine.metric_succeeded(period=PERIOD, label="succeeded"),
                    state_machine.metric_failed(period=PERIOD, label="failed"),
                    state_machine.metric_aborted(period=PERIOD, label="aborted"),
                    state_machine.metric_timed_out(period=PERIOD, label="timed out"),
                ],
                right=[m(Metric.MODELS_REGISTERED)],
            ),
            graph(
                title="Requests at intake",
                left=[m(Metric.RUNS_ACCEPTED), m(Metric.RUNS_REJECTED), m(Metric.RUNS_REFUSED_OVER_BUDGET)],
                right=[m(Metric.ESTIMATED_MAX_COST, "Maximum")],
            ),
        ],
        [
            graph(
                title="Approvals waiting, and the oldest one's age (s)",
                left=[m(Metric.APPROVALS_PENDING, "Maximum")],
                right=[m(Metric.OLDEST_PENDING_APPROVAL, "Maximum")],
            ),
            graph(
                title="Approval decisions (and any not recorded), and time to decide (s)",
                left=[m(Metric.APPROVALS_REQUESTED), m(Metric.APPROVALS_DECIDED), m(Metric.UNRECORDED_DECISIONS)],
                right=[m(Metric.APPROVAL_WAIT, "Average"), m(Metric.APPROVAL_WAIT, "Maximum")],
            ),
        ],
    ]


def training_rows(goodput_logs: list[logs.ILogGroup]) -> list[list[cloudwatch.IWidget]]:
    """Training jobs ended and what they cost; goodput, with each run's ledger; the model's figures per job."""
    m = platform_metric
    return [
        [
            graph(
                title="Training jobs ended, and their durations (s)",
                left=[m(Metric.JOBS_COMPLETED), m(Metric.JOBS_FAILED)],
                right=[m(Metric.JOB_DURATION, "Average"), m(Metric.JOB_DURATION, "Maximum")],
            ),
            graph(
                title="Spend (USD, list price), spot savings and interruptions",
                left=[m(Metric.TRAINING_COST), m(Metric.SPOT_SAVINGS)],
                right=[m(Metric.SPOT_INTERRUPTIONS)],
            ),
        ],
        [
            graph(
                title="Goodput (%): of the stage's billed instance-seconds, and the jobs' average",
                left=[goodput_percent(), m(Metric.GOODPUT, "Average")],
                right=[m(Metric.BILLED_INSTANCE_SECONDS), m(Metric.PRODUCTIVE_INSTANCE_SECONDS)],
            ),
            cloudwatch.LogQueryWidget(
                title="Goodput per run: the latest jobs' ledgers (contract/goodput.py)",
                log_group_names=[group.log_group_name for group in goodput_logs],
                query_lines=[
                    f'filter message = "{GOODPUT_LOG_MESSAGE}"',
                    "fields @timestamp, run, job, goodput, billed_seconds, parts.productive, parts.rework, "
                    "parts.stalls, parts.provisioning, parts.startup, parts.checkpoint",
                    "sort @timestamp desc",
                    "limit 50",
                ],
                width=12,
                height=6,
            ),
        ],
        [graph(title=title, left=[per_job(name)], width=8) for name, title in TRAINING_FIGURES],
    ]


def fault_row(functions: dict[str, lambda_.IFunction]) -> list[cloudwatch.IWidget]:
    """Checkpoints gone stale or changed after recording, and every handler's errors."""
    m = platform_metric
    return [
        graph(
            title="Newest checkpoint's age in running jobs (s), and checkpoints changed after recording",
            left=[m(Metric.CHECKPOINT_AGE, "Maximum")],
            right=[m(Metric.CHECKPOINTS_NOT_AS_RECORDED)],
        ),
        graph(
            title="Handler errors",
            left=[function.metric_errors(period=PERIOD, label=label) for label, function in functions.items()],
        ),
    ]


def team_row(team_budgets: dict[str, float]) -> list[cloudwatch.IWidget]:
    """Each team's spend over the last 30 days, against its monthly budget."""
    return [
        graph(
            title="Each team's training spend over the last 30 days (USD, list price), and its monthly budget",
            left=[team_spend(team, i) for i, team in enumerate(team_budgets)],
            left_annotations=[
                cloudwatch.HorizontalAnnotation(value=budget, label=f"{team} budget")
                for team, budget in team_budgets.items()
            ],
            start=TEAM_SPEND_RANGE,
            width=24,
        )
    ]


class PlatformDashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        name: str,
        state_machine: sfn.IStateMachine,
        functions: dict[str, lambda_.IFunction],
        goodput_logs: list[logs.ILogGroup],
        team_budgets: dict[str, float] | None = None,
    ) -> None:
        """`goodput_logs`: the log groups of the handlers that log each finished job's goodput ledger;
        `team_budgets`: each team's monthly budget (USD) by name, graphed with its spend (none: no graph)."""
        super().__init__(scope, id_)
        rows = [*run_rows(state_machine), *training_rows(goodput_logs), fault_row(functions)]
        if team_budgets:
            rows.append(team_row(team_budgets))
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=name, widgets=rows)

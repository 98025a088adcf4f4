"""A team's spend: the progress handlers' per-team cost metric (read from the EMF lines they print) and the team in
the run's lineage, which `tp cost` reads."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract.execution_state import Evaluation, JobCost, JobProgress, RegisterEvent
from contract.layout import split_s3_uri
from lambdas.batch import monitor as batch_monitor
from lambdas.estimate.handler import estimate
from lambdas.jobs.progress import record_metrics
from lambdas.register.handler import Destination, register
from lambdas.sagemaker import monitor as sagemaker_monitor
from lambdas.shared.metrics import NAMESPACE, Metric, Stage, StageMetrics
from tests.lambdas.test_handlers import _request


def _finished(actual_usd: float = 12.5) -> JobProgress:
    return JobProgress(
        job_name="run-1",
        status="Completed",
        secondary_status="Completed",
        finished=True,
        error=None,
        failure_reason="",
        retry_on_new_nodes=False,
        interruptions=0,
        checkpoint=None,
        checkpoint_age_minutes=None,
        stale=False,
        warn_stale=False,
        stale_warned=False,
        final_metrics={},
        billable_seconds=1800,
        training_seconds=1800,
        cost=JobCost(actual_usd=actual_usd, on_demand_usd=actual_usd, spot_savings_usd=0.0),
        model_artifacts=None,
    )


def _emf(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    return [line for line in lines if line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == NAMESPACE]


def _with(lines: list[dict[str, Any]], metric: Metric) -> list[dict[str, Any]]:
    return [line for line in lines if metric.value in line]


@pytest.mark.parametrize("team", ["vision", None])
def test_a_finished_jobs_cost_is_also_its_teams_with_the_team_as_a_dimension(
    team: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = StageMetrics(Stage.TRAINING)
    metrics.flushed(lambda _event, _context: record_metrics(_finished(12.5), metrics, team=team))({}, None)

    lines = _emf(capsys.readouterr().out)
    (overall,) = _with(lines, Metric.TRAINING_COST)
    assert overall["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["stage", "service"]]  # never by team
    teams = _with(lines, Metric.TEAM_TRAINING_COST)
    if team is None:
        assert teams == []
        return
    (line,) = teams
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    assert sorted(directive["Dimensions"][0]) == ["service", "stage", "team"]
    assert [m["Name"] for m in directive["Metrics"]] == [Metric.TEAM_TRAINING_COST.value]  # alone on its line
    assert (line["team"], line["stage"], line[Metric.TEAM_TRAINING_COST.value]) == ("vision", "training", [12.5])


def test_a_running_job_costs_its_team_nothing_yet(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = StageMetrics(Stage.TRAINING)
    running = _finished().model_copy(update={"status": "InProgress", "finished": False, "cost": None})
    metrics.flushed(lambda _event, _context: record_metrics(running, metrics, team="vision"))({}, None)
    assert _with(_emf(capsys.readouterr().out), Metric.TEAM_TRAINING_COST) == []


def test_a_team_metric_is_never_recorded_without_its_team() -> None:
    metrics = StageMetrics(Stage.TRAINING)
    with pytest.raises(ValueError, match="recorded per team"):
        metrics.record(Metric.TEAM_TRAINING_COST, 1.0)
    with pytest.raises(ValueError, match="no team dimension"):
        metrics.record_for_team(Metric.TRAINING_COST, "vision", 1.0)


class _Context:
    function_name = "Monitor"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:Monitor"
    aws_request_id = "req-1"


@pytest.mark.parametrize(
    ("module", "environment", "job"),
    [
        (sagemaker_monitor, sagemaker_monitor.MonitorEnvironment, {"job_name": "run-1"}),
        (
            batch_monitor,
            batch_monitor.BatchMonitorEnvironment,
            {"job": {"arn": "arn:aws:batch:us-east-1:123456789012:job/j", "job_name": "run-1"}},
        ),
    ],
    ids=["sagemaker", "batch"],
)
def test_each_progress_handler_counts_the_cost_as_the_requests_teams(
    module: Any, environment: Any, job: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(module, "poll", lambda *_args, **_kwargs: _finished(7.0))
    monkeypatch.setattr(environment, "from_environ", staticmethod(lambda: None))
    event = {
        "request": _request(team="nlp").model_dump(mode="json"),
        "execution": "arn:aws:states:us-east-1:123456789012:execution:sm:e",
        "previous": {},
        "hourly_usd": 14.0,
        **job,
    }
    module.handler(event, _Context())

    (line,) = _with(_emf(capsys.readouterr().out), Metric.TEAM_TRAINING_COST)
    assert (line["team"], line[Metric.TEAM_TRAINING_COST.value]) == ("nlp", [7.0])


class _Registry:
    """SageMaker's CreateModelPackage, as Register calls it."""

    def create_model_package(self, **_kwargs: Any) -> dict[str, str]:
        return {"ModelPackageArn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1"}


@pytest.mark.parametrize("team", ["nlp", None])
@mock_aws
def test_the_lineage_records_the_runs_team(team: str | None) -> None:
    request = _request(team=team)
    s3 = boto3.client("s3", region_name="us-east-1")
    for bucket in (split_s3_uri(request.dataset.s3_uri)[0], "artifacts"):
        s3.create_bucket(Bucket=bucket)
    model = "s3://artifacts/runs/x-1/output/model.tar.gz"
    s3.put_object(Bucket="artifacts", Key=split_s3_uri(model)[1], Body=b"model")
    event = RegisterEvent(
        request=request,
        job=_finished().model_copy(update={"model_artifacts": model}),
        estimate=estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={}),
        evaluation=Evaluation(passed=True, reason="validation:loss 2.1 <= 3.0", metrics={}),
        execution="arn:aws:states:us-east-1:123456789012:execution:sm:e",
    )
    where = Destination(artifacts_bucket="artifacts", group="g", image_uri="image@sha256:0", revision="abc")
    registration = register(event, s3=s3, sagemaker=_Registry(), where=where)

    bucket, key = split_s3_uri(registration.lineage_uri)
    assert json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["team"] == team

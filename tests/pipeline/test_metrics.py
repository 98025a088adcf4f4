"""The handlers' embedded metrics, read from what they print during executed runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lambdas.shared.metrics import NAMESPACE, STAGE_OF, Metric
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import Pipeline

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 4, "max_runtime_hours": 10}


def _emf(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    return [line for line in lines if line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == NAMESPACE]


def _values(lines: list[dict[str, Any]], metric: Metric) -> list[float]:
    return [v for line in lines if metric.value in line for v in line[metric.value]]


def test_a_run_emits_its_figures_by_stage_never_by_run(
    pipeline_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A spot job that trained 3000 s and was billed 1800 s: SageMaker's accounting of spot savings.
    completed = Poll(
        "Completed", "Completed", metrics={"validation:loss": 2.5}, billable_seconds=1800, training_seconds=3000
    )
    pipeline: Pipeline = pipeline_factory([[Poll(), completed]])
    arn = pipeline.start(pipeline.input(run_name="metrics-run"))
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"

    lines = _emf(capsys.readouterr().out)
    for line in lines:
        (directive,) = line["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["stage", "service"]]
        for name in (m["Name"] for m in directive["Metrics"]):
            assert line["stage"] == STAGE_OF[Metric(name)].value, name
        assert "metrics-run" not in json.dumps(line)  # no run name, as a dimension or otherwise
    for metric in (
        Metric.RUNS_ACCEPTED,
        Metric.ESTIMATED_MAX_COST,
        Metric.JOBS_COMPLETED,
        Metric.MODELS_REGISTERED,
        Metric.APPROVALS_REQUESTED,
        Metric.APPROVALS_DECIDED,
    ):
        assert _values(lines, metric), metric
    hourly = _values(lines, Metric.TRAINING_COST)[0] * 3600 / 1800
    assert _values(lines, Metric.JOB_DURATION) == [3000]
    assert _values(lines, Metric.SPOT_SAVINGS) == [pytest.approx(hourly * 1200 / 3600, abs=1e-3)]
    lineage = pipeline.lineage()
    assert lineage["cost"]["spot_savings_usd"] == pytest.approx(hourly * 1200 / 3600, abs=1e-3)
    assert lineage["cost"]["training_seconds"] == 3000


def test_the_scheduled_gauge_counts_approvals_still_waiting(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    arn = pipeline.start(pipeline.input(**EXPENSIVE), name="waiting")
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    pipeline.pending("launch")  # the request is stored: entering the gate comes before its function runs
    pipeline.local.events.schedule_due()  # EventBridge's five-minute schedule, due now
    pipeline.local.events.drain()
    gauge = pipeline.local.functions.named("Pending").name
    (delivery,) = [d for d in pipeline.local.events.deliveries if d["function"] == gauge]
    assert delivery["permitted"] and delivery["result"]["pending"] == 1, delivery
    lines = _emf(capsys.readouterr().out)
    assert _values(lines, Metric.APPROVALS_PENDING) == [1]
    assert _values(lines, Metric.OLDEST_PENDING_APPROVAL)[0] >= 0

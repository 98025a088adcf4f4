"""The `tuning` input: resolved into SageMaker's tuning config, every bad input refused with what to fix;
its estimate; one poll of a tuning job."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contract.execution_state import JobProgress, TrainingRequest
from lambdas.estimate.handler import estimate
from lambdas.shared.errors import InvalidRequest
from lambdas.tuning.handler import poll
from lambdas.validate.request import RUN_ID_HEX, resolve
from tests.lambdas.test_handlers import LIMITS

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tuning.json").read_text())


def _resolve(**changes: Any) -> dict[str, Any]:
    execution_input = json.loads(json.dumps(EXAMPLE))
    for key, value in changes.items():
        if key.startswith("tuning_"):
            execution_input["tuning"][key.removeprefix("tuning_")] = value
        else:
            execution_input[key] = value
    return resolve(execution_input, execution_name="exec-1", limits=LIMITS)


def test_the_example_resolves_to_sagemakers_tuning_config() -> None:
    request = _resolve()
    tuning = request["tuning"]
    assert TrainingRequest.parse(request).tuning is not None
    # The run name is cut to fit SageMaker's 32 characters; the run's identity never is.
    assert re.fullmatch(rf"demo-tiny-tunin-[0-9a-f]{{{RUN_ID_HEX}}}", tuning["job_name"])
    config = tuning["config"]
    assert config["Strategy"] == "Bayesian" and config["TrainingJobEarlyStoppingType"] == "Off"
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Minimize", "MetricName": "validation:loss"}
    assert config["ResourceLimits"] == {"MaxNumberOfTrainingJobs": 4, "MaxParallelTrainingJobs": 2}
    ranges = config["ParameterRanges"]
    assert ranges["ContinuousParameterRanges"] == [
        {"Name": "lr", "MinValue": "0.0005", "MaxValue": "0.01", "ScalingType": "Logarithmic"}
    ]
    assert ranges["IntegerParameterRanges"] == [
        {"Name": "optim.warmup_steps", "MinValue": "5", "MaxValue": "30", "ScalingType": "Auto"}
    ]
    assert ranges["CategoricalParameterRanges"] == [{"Name": "batch_size", "Values": ["4", "8"]}]
    # Tuned values are not static ones.
    assert not {"lr", "optim.warmup_steps", "batch_size"} & set(request["hyperparameters"])


def test_a_long_run_name_is_cut_to_sagemakers_32_characters() -> None:
    name = _resolve(run_name="a-very-long-run-name-for-tuning-jobs-01")["tuning"]["job_name"]
    assert len(name) == 32 and re.fullmatch(rf"a-very-long-run-[0-9a-f]{{{RUN_ID_HEX}}}", name)


def test_hyperband_takes_its_resource_bounds_and_no_early_stopping_type() -> None:
    config = _resolve(tuning_strategy="Hyperband", tuning_hyperband={"min_resource": 1, "max_resource": 9})["tuning"][
        "config"
    ]
    assert config["StrategyConfig"] == {"HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 9}}
    assert config["TrainingJobEarlyStoppingType"] == "Off"
    assert _resolve(tuning_early_stopping=True)["tuning"]["config"]["TrainingJobEarlyStoppingType"] == "Auto"


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown range",
        {"tuning_ranges": {"learning_rate": {"type": "continuous", "min": 0.1, "max": 1}}},
        "learning_rate",
    ),
    ("tuned and fixed", {"tuning_ranges": {"max_steps": {"type": "integer", "min": 1, "max": 9}}}, "also fixed"),
    ("top-level key", {"tuning_ranges": {"model": {"type": "categorical", "values": ["tiny"]}}}, "set at the top"),
    (
        "an end the trainer refuses",
        {"tuning_ranges": {"optim.warmup_steps": {"type": "integer", "min": -5, "max": 9}}},
        "-5, -4, -3, -2, -1 are refused by the trainer",
    ),
    (
        "a categorical value the trainer refuses",
        {"tuning_ranges": {"batch_size": {"type": "categorical", "values": [4, "many"]}}},
        "many is refused by the trainer",
    ),
    ("min not below max", {"tuning_ranges": {"lr": {"type": "continuous", "min": 0.1, "max": 0.1}}}, "must be below"),
    ("no max", {"tuning_ranges": {"lr": {"type": "continuous", "min": 0.1}}}, "needs both `min` and `max`"),
    (
        "float integer",
        {"tuning_ranges": {"batch_size": {"type": "integer", "min": 1.5, "max": 4}}},
        "integer min and max",
    ),
    (
        "log of zero",
        {"tuning_ranges": {"lr": {"type": "continuous", "min": 0, "max": 0.1, "scaling": "Logarithmic"}}},
        "Logarithmic scaling needs min > 0",
    ),
    (
        "reverse log outside [0, 1)",
        {"tuning_ranges": {"lr": {"type": "continuous", "min": 0.5, "max": 2, "scaling": "ReverseLogarithmic"}}},
        "ReverseLogarithmic",
    ),
    ("values on a numeric range", {"tuning_ranges": {"lr": {"type": "continuous", "values": [1]}}}, "not `values`"),
    (
        "min on a categorical range",
        {"tuning_ranges": {"batch_size": {"type": "categorical", "min": 1}}},
        "`values` only",
    ),
    ("repeated values", {"tuning_ranges": {"batch_size": {"type": "categorical", "values": [4, 4]}}}, "repeated"),
    ("no ranges", {"tuning_ranges": {}}, "tuning.ranges"),
    (
        "unknown scaling",
        {"tuning_ranges": {"lr": {"type": "continuous", "min": 0.1, "max": 1, "scaling": "Log"}}},
        "scaling",
    ),
    (
        "set by the platform",
        {
            "checkpoints": False,
            "spot": False,
            "tuning_ranges": {"checkpoint.interval_minutes": {"type": "integer", "min": 5, "max": 9}},
        },
        "set to 0 for this request by the platform",
    ),
    ("objective not reported", {"tuning_objective": {"metric": "accuracy"}}, "'accuracy' is not reported"),
    ("objective type", {"tuning_objective": {"metric": "validation:loss", "type": "Lowest"}}, "tuning.objective.type"),
    ("unknown strategy", {"tuning_strategy": "Grid"}, "tuning.strategy"),
    ("hyperband without bounds", {"tuning_strategy": "Hyperband"}, "Hyperband needs"),
    (
        "hyperband bounds elsewhere",
        {"tuning_hyperband": {"min_resource": 1, "max_resource": 2}},
        "Hyperband strategy only",
    ),
    (
        "hyperband with early stopping",
        {
            "tuning_strategy": "Hyperband",
            "tuning_hyperband": {"min_resource": 1, "max_resource": 2},
            "tuning_early_stopping": True,
        },
        "stops trials early itself",
    ),
    ("too many jobs", {"tuning_max_jobs": 1000}, "tuning.max_jobs"),
    ("parallel above max", {"tuning_max_jobs": 2, "tuning_max_parallel_jobs": 3}, "exceeds max_jobs 2"),
    ("unknown key", {"tuning_seed": 7}, "tuning.seed: unknown key"),
    ("warm pool", {"warm_pool_minutes": 10, "spot": False}, "warm_pool_minutes does not apply to tuning jobs"),
]


@pytest.mark.parametrize(("changes", "expected"), [(c, e) for _, c, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_tuning_inputs_say_what_to_fix(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        _resolve(**changes)
    assert expected in str(raised.value)


def test_tuning_on_another_backend_is_refused() -> None:
    execution_input = {**EXAMPLE, "backend": "batch"}
    with pytest.raises(InvalidRequest, match="tuning runs on the sagemaker backend only"):
        resolve(
            execution_input,
            execution_name="exec-1",
            limits=dataclasses.replace(LIMITS, backends=("sagemaker", "batch")),
        )


def test_tuning_more_than_one_instance_group_is_refused() -> None:
    from contract.execution_state import InstanceGroup
    from lambdas.validate.tuning import TuningInput, resolve_tuning

    group = InstanceGroup(instance_type="ml.m5.xlarge", instance_count=1, efa=False, local_storage=False)
    problems: list[str] = []
    resolve_tuning(
        TuningInput.model_validate(EXAMPLE["tuning"]),
        run_name="run",
        suffix="12345678",
        fixed={"model": "tiny", "distribution": "ddp"},
        given={},
        top_level={},
        groups=[group, group.model_copy(update={"name": "second"})],
        warm_pool_minutes=0,
        problems=problems,
    )
    assert problems == ["tuning needs one instance group (every trial runs the same cluster); this request has 2"]


def test_the_estimate_is_max_jobs_times_the_single_jobs_worst_case() -> None:
    request = TrainingRequest.parse(_resolve())
    single = estimate(
        request.model_copy(update={"tuning": None}), threshold_usd=0.5, spot_fraction=(0.3, 0.7), price_overrides={}
    )
    tuned = estimate(request, threshold_usd=0.5, spot_fraction=(0.3, 0.7), price_overrides={})
    assert tuned.max_cost_usd == pytest.approx(4 * single.max_cost_usd, abs=0.01)
    assert (tuned.training_jobs, tuned.parallel_jobs) == (4, 2)
    assert not single.approval_required and tuned.approval_required  # 0.23 alone, 0.92 for four


class _SageMaker:
    """The tuning job `t` and its trials; the trials are listed two to a page."""

    def __init__(self, tuning: dict[str, Any], *trials: dict[str, Any]) -> None:
        self.tuning, self.trials = tuning, {trial["TrainingJobName"]: trial for trial in trials}

    def describe_hyper_parameter_tuning_job(self, **_: Any) -> dict[str, Any]:
        return self.tuning

    def describe_training_job(self, **kwargs: Any) -> dict[str, Any]:
        return self.trials[kwargs["TrainingJobName"]]

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_training_jobs_for_hyper_parameter_tuning_job"
        names = list(self.trials)

        class Paginator:
            @staticmethod
            def paginate(**kwargs: Any) -> list[dict[str, Any]]:
                assert kwargs["HyperParameterTuningJobName"] == "t"
                pages = [names[i : i + 2] for i in range(0, len(names), 2)]
                return [{"TrainingJobSummaries": [{"TrainingJobName": n} for n in page]} for page in pages]

        return Paginator()


CONFIG = {"HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "validation:loss"}}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_running_tuning_job_is_not_finished() -> None:
    described = {"HyperParameterTuningJobStatus": "InProgress", "HyperParameterTuningJobConfig": CONFIG}
    progress = JobProgress.model_validate(poll(_SageMaker(described), "t", hourly_usd=1.0, now=NOW))
    assert (progress.finished, progress.status, progress.tuning) == (False, "InProgress", None)


def test_a_completed_tuning_job_is_its_best_trial_with_what_it_tuned() -> None:
    described = {
        "HyperParameterTuningJobStatus": "Completed",
        "HyperParameterTuningJobConfig": CONFIG,
        "TrainingJobStatusCounters": {"Completed": 3, "NonRetryableError": 1, "Stopped": 0},
        "BestTrainingJob": {
            "TrainingJobName": "t-002-abcdef12",
            "TunedHyperParameters": {"lr": "0.002"},
            "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "validation:loss", "Value": 2.1},
        },
    }
    best = {
        "TrainingJobName": "t-002-abcdef12",
        "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed",
        "FinalMetricDataList": [{"MetricName": "validation:loss", "Value": 2.1}],
        "BillableTimeInSeconds": 3600,
        "TrainingTimeInSeconds": 3600,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://artifacts/runs/t-002-abcdef12/output/model.tar.gz"},
    }
    spot = {"TrainingJobName": "t-001-0badcafe", "BillableTimeInSeconds": 1800, "TrainingTimeInSeconds": 3600}
    never_billed = {"TrainingJobName": "t-003-12345678", "TrainingJobStatus": "Failed"}
    also_billed = {"TrainingJobName": "t-004-87654321", "BillableTimeInSeconds": 360, "TrainingTimeInSeconds": 360}
    sagemaker = _SageMaker(described, spot, best, never_billed, also_billed)
    progress = JobProgress.model_validate(poll(sagemaker, "t", hourly_usd=2.0, now=NOW))
    assert progress.job_name == "t-002-abcdef12" and progress.status == "Completed" and progress.finished
    assert progress.final_metrics == {"validation:loss": 2.1}
    assert progress.model_artifacts == best["ModelArtifacts"]["S3ModelArtifacts"]
    # What the run cost: every billed trial at $2/h, across both pages of the listing.
    assert (progress.billable_seconds, progress.training_seconds) == (5760, 7560)
    assert progress.cost is not None
    assert progress.cost.model_dump() == {"actual_usd": 3.2, "on_demand_usd": 4.2, "spot_savings_usd": 1.0}
    assert progress.tuning is not None
    assert progress.tuning.model_dump() == {
        "tuning_job": "t",
        "best_training_job": "t-002-abcdef12",
        "hyperparameters": {"lr": "0.002"},
        "objective_metric": "validation:loss",
        "objective_type": "Minimize",
        "objective_value": 2.1,
        "trials_completed": 3,
        "trials_launched": 4,
        "trials_billed": 3,
        "best_trial_cost": {"actual_usd": 2.0, "on_demand_usd": 2.0, "spot_savings_usd": 0.0},
    }


@pytest.mark.parametrize(
    ("status", "best", "error"),
    [
        ("Failed", None, "TuningJobFailed"),
        ("Completed", None, "TuningJobFailed"),
        ("Stopped", None, "TuningJobStopped"),
    ],
)
def test_a_tuning_job_without_a_best_trial_fails_the_step(status: str, best: Any, error: str) -> None:
    described = {
        "HyperParameterTuningJobStatus": status,
        "HyperParameterTuningJobConfig": CONFIG,
        "TrainingJobStatusCounters": {"Completed": 0, "NonRetryableError": 2},
        **({"BestTrainingJob": best} if best else {}),
    }
    progress = JobProgress.model_validate(poll(_SageMaker(described), "t", hourly_usd=1.0, now=NOW))
    assert progress.finished and progress.error == error and progress.status != "Completed"
    assert "t ended" in progress.failure_reason and "0 of 2 trials completed" in progress.failure_reason

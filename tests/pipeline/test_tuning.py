"""Hyperparameter tuning, executed: the tuning job's trials run as training jobs; the best one is registered."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.responses import SageMakerResponse

from contract.layout import LEDGER_CHANNEL
from lambdas.shared.metrics import Metric
from lambdas.validate.request import RUN_ID_HEX
from localrun.aws.clock import Clock
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import Pipeline
from tests.pipeline.test_iam_enforced import _assembly_with, _drop
from tools import run_state

TUNING = {
    "ranges": {
        "lr": {"type": "continuous", "min": 0.0001, "max": 0.01, "scaling": "Logarithmic"},
        "batch_size": {"type": "categorical", "values": [4, 8]},
    },
    "objective": {"metric": "validation:loss", "type": "Minimize"},
    "max_jobs": 4,
    "max_parallel_jobs": 2,
}
# Trial n follows script n: the third trial scores best.
LOSSES = [2.9, 2.7, 2.2, 2.8]
BILLED = [600, 900, 1200, 1500]


def _trial(loss: float, billed: int | None = None) -> list[Poll]:
    metrics = {"validation:loss": loss, "train:loss": loss - 0.1}
    done = Poll("Completed", "Completed", metrics=metrics, billable_seconds=billed, training_seconds=billed)
    return [Poll(), Poll(), done]


def tuning_input(pipeline: Pipeline, **tuning: Any) -> dict[str, Any]:
    return pipeline.input(hyperparameters={"max_steps": 100}, tuning={**TUNING, **tuning})


def _running_at_each_create(pipeline: Pipeline) -> list[int]:
    """How many trials were running when each trial was created (the tuning job's parallelism)."""
    seen: list[int] = []

    def hook(name: str, _request: dict[str, Any], _job: Any) -> None:
        (tuning,) = pipeline.local.tuning.jobs.values()
        seen.append(
            sum(1 for t in tuning.trials if t.job.training_job_status not in ("Completed", "Failed", "Stopped"))
        )

    pipeline.training.on_create.append(hook)
    return seen


def test_tuning_registers_the_best_trial_with_its_lineage(
    pipeline_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = pipeline_factory(scripts=[_trial(loss, billed) for loss, billed in zip(LOSSES, BILLED, strict=True)])
    running = _running_at_each_create(pipeline)
    arn = pipeline.start(tuning_input(pipeline))
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)

    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    states = pipeline.local.states_entered(arn)
    assert "Create tuning job (instance storage)" in states and "Create training job" not in " ".join(states)
    trials = pipeline.jobs()
    assert len(trials) == 4
    (tuning,) = pipeline.local.tuning.jobs
    assert len(tuning) <= 32 and all(re.fullmatch(rf"{tuning}-00[1-4]-[0-9a-f]{{8}}", t) for t in trials)
    assert max(running) <= 2 and running[:2] == [1, 2]  # two at once, never more (the hook runs after each create)

    best = trials[2]
    lineage = pipeline.lineage()
    assert lineage["training_job"] == best
    assert lineage["metrics"]["validation:loss"] == 2.2
    record = lineage["tuning"]
    tuned = pipeline.local.training_requests[best]["HyperParameters"]
    assert record["tuning_job"] == tuning and record["best_training_job"] == best
    assert record["hyperparameters"] == {"lr": tuned["lr"], "batch_size": tuned["batch_size"]}
    assert record["objective_metric"] == "validation:loss" and record["objective_value"] == 2.2
    assert record["trials_completed"] == 4 and record["trials_launched"] == 4
    # What the run cost is every trial's billed time at the cluster's price; the best trial's is kept beside it.
    estimate = next(c.result for c in pipeline.local.lambda_calls if c.handler.startswith("lambdas.estimate"))
    hourly = estimate["hourly_usd"]
    assert lineage["cost"]["billable_seconds"] == sum(BILLED) and record["trials_billed"] == 4
    assert lineage["cost"]["actual_usd"] == pytest.approx(hourly * sum(BILLED) / 3600, abs=1e-3)
    assert record["best_trial_cost"]["actual_usd"] == pytest.approx(hourly * BILLED[2] / 3600, abs=1e-3)
    # TuningProgress emits the tuning job's figures itself, with its own invocation's metrics.
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert [v for line in emitted for v in line.get(Metric.JOB_DURATION.value, [])] == [sum(BILLED)]
    assert lineage["hyperparameters"]["lr"] == tuned["lr"] and lineage["hyperparameters"]["max_steps"] == "100"
    (package,) = pipeline.model_packages()
    assert package["ModelApprovalStatus"] == "Approved"
    # `tp logs` finds every trial's streams through the tuning job (SageMaker names a trial's as any job's).
    logs = boto3.client("logs", region_name="us-east-1")
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    for trial in trials:
        logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=f"{trial}/algo-1-1700000000")
    session = boto3.Session(region_name="us-east-1")
    streams = run_state.streams(session, run_state.history(session.client("stepfunctions"), arn))
    assert sorted(s.job for s in streams) == sorted(trials) and {s.host for s in streams} == {"algo-1"}


def _without_ledger(value: Any) -> Any:
    """A request field with the ledger channel left out (it names the run's own ledger)."""
    if isinstance(value, list):
        return [c for c in value if not (isinstance(c, dict) and c.get("ChannelName") == LEDGER_CHANNEL)]
    return value


def test_every_trial_carries_the_single_jobs_enforced_fields(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[_trial(loss) for loss in LOSSES])
    arn = pipeline.start(pipeline.input(hyperparameters={"max_steps": 100}), name="single")
    pipeline.run_until(arn, "Approval gate (promotion)")
    (job,) = pipeline.local.training_requests.values()
    arn = pipeline.start(tuning_input(pipeline, max_jobs=2, max_parallel_jobs=1), name="tuned")
    pipeline.run_until(arn, "Approval gate (promotion)")
    single = {name: r for name, r in pipeline.local.training_requests.items() if r is not job}
    assert len(single) == 2
    tuned_run = next(iter(single)).rsplit("-", 2)[0]
    for trial in single.values():
        for field in (
            "RoleArn",
            "InputDataConfig",
            "OutputDataConfig",
            "StoppingCondition",
            "VpcConfig",
            "EnableNetworkIsolation",
            "EnableInterContainerTrafficEncryption",
            "EnableManagedSpotTraining",
            "Environment",
        ):
            assert _without_ledger(trial[field]) == _without_ledger(job[field]), field
        # Each run reads its own checkpoint ledger: a trial, its tuning run's.
        (ledger,) = [c for c in trial["InputDataConfig"] if c["ChannelName"] == LEDGER_CHANNEL]
        assert ledger["DataSource"]["S3DataSource"]["S3Uri"].endswith(f"/runs/{tuned_run}/lineage/checkpoints/")
        # A tuning job's definition takes no warm pool; everything else of the cluster is the single job's.
        assert trial["ResourceConfig"] == {
            k: v for k, v in job["ResourceConfig"].items() if k != "KeepAlivePeriodInSeconds"
        }
        assert trial["AlgorithmSpecification"]["TrainingImage"] == job["AlgorithmSpecification"]["TrainingImage"]
        # Under the run's own prefix in the checkpoints bucket, one folder per trial (localrun/backends/tuning.py).
        bucket = job["CheckpointConfig"]["S3Uri"].split("/runs/")[0]
        assert re.fullmatch(
            rf"{bucket}/runs/gpt2-small-[0-9a-f]{{{RUN_ID_HEX}}}/checkpoints/{trial['TrainingJobName']}/",
            trial["CheckpointConfig"]["S3Uri"],
        )
        assert trial["HyperParameters"]["_tuning_objective_metric"] == "validation:loss"
        # The tuning job's tags (SageMaker copies them onto its trials): the run's, and this execution's.
        assert [t for t in trial["Tags"] if t["Key"] != "execution"] == [
            t for t in job["Tags"] if t["Key"] != "execution"
        ]
        assert {"Key": "execution", "Value": arn} in trial["Tags"]


def test_approval_is_asked_on_max_jobs_times_the_worst_case(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[_trial(loss) for loss in LOSSES])
    # 1 x ml.p4d.24xlarge for 2 h is below the threshold once; 4 trials are not.
    execution_input = {**tuning_input(pipeline, max_jobs=20), "instance_type": "ml.p4d.24xlarge"}
    arn = pipeline.start(execution_input, name="costly")
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    estimate = next(c.result for c in pipeline.local.lambda_calls if c.handler.startswith("lambdas.estimate"))
    single = estimate["max_cost_usd"] / 20
    assert estimate["training_jobs"] == 20 and estimate["parallel_jobs"] == 2
    assert estimate["approval_required"] and single < estimate["threshold_usd"] < estimate["max_cost_usd"]
    assert pipeline.jobs() == []


def test_a_tuning_job_whose_trials_all_fail_fails_the_run(pipeline_factory: Any) -> None:
    failed = [Poll(), Poll("Failed", "Failed", failure_reason="AlgorithmError: loss is NaN")]
    pipeline = pipeline_factory(scripts=[failed])
    arn = pipeline.start(tuning_input(pipeline, max_jobs=2, max_parallel_jobs=2), name="failing")
    described = pipeline.finish(arn)

    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "TuningJobFailed" and "loss is NaN" in cause
    assert "Prune checkpoints (failed job, tuning)" in pipeline.local.states_entered(arn)
    assert pipeline.model_packages() == []


def test_aborting_a_run_stops_its_tuning_job_and_trials(pipeline_factory: Any) -> None:
    pipeline = pipeline_factory(scripts=[[Poll()]], clock=Clock(wait_scale=0.001))  # trials that never end
    arn = pipeline.start(tuning_input(pipeline), name="aborted")
    pipeline.run_until(arn, "Check progress (tuning)")
    pipeline.local.wait(arn, 10, until=lambda: len(pipeline.jobs()) == 2)
    pipeline.local.sfn.stop_execution(executionArn=arn, error="Cancelled", cause="an engineer stopped the run")
    # EventBridge delivers the status change to the rule's target (the cleanup handler), asynchronously.
    pipeline.local.wait(arn, 30, until=lambda: bool(pipeline.local.events.deliveries))
    pipeline.local.events.drain()

    ((name, tuning),) = pipeline.local.tuning.jobs.items()
    (delivery,) = [d for d in pipeline.local.events.deliveries if d["function"].startswith("Cleanup")]
    assert delivery["event"]["detail"]["status"] == "ABORTED" and delivery["permitted"]
    assert delivery["result"]["stopped_tuning_jobs"] == [name]
    assert tuning.status == "Stopping" and sorted(pipeline.training.stopped_names) == sorted(pipeline.jobs())


@pytest.mark.parametrize(
    ("tuning", "expected"),
    [
        ({"ranges": {"learning_rate": {"type": "continuous", "min": 0.1, "max": 1}}}, "unknown hyperparameter"),
        ({"ranges": {"max_steps": {"type": "integer", "min": 1, "max": 9}}}, "also fixed in `hyperparameters`"),
        (
            {"ranges": {"optim.warmup_steps": {"type": "integer", "min": -5, "max": 9}}},
            "tuning.ranges.optim.warmup_steps: -5, -4, -3, -2, -1 are refused by the trainer",
        ),
        ({"objective": {"metric": "accuracy"}}, "'accuracy' is not reported"),
        ({"max_parallel_jobs": 5, "max_jobs": 2}, "exceeds max_jobs 2"),
        ({"strategy": "Hyperband"}, "Hyperband needs"),
    ],
)
def test_bad_tuning_inputs_are_rejected_before_anything_runs(
    pipeline: Pipeline, tuning: dict[str, Any], expected: str
) -> None:
    execution_input = pipeline.input(hyperparameters={"max_steps": 100}, tuning={**TUNING, **tuning})
    described = pipeline.finish(pipeline.start(execution_input, name="bad"))
    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "InvalidRequest" and expected in cause
    assert pipeline.jobs() == [] and pipeline.local.tuning.jobs == {}


def test_a_tuning_job_sagemaker_refuses_fails_the_run_after_stopping_what_it_may_have_started(
    pipeline: Pipeline,
) -> None:
    def refuse(_response: Any) -> Any:
        raise ValidationError(message="The account-level service limit for tuning jobs is exceeded")

    with mock.patch.object(SageMakerResponse, "create_hyper_parameter_tuning_job", refuse):
        arn = pipeline.start(tuning_input(pipeline), name="refused")
        described = pipeline.finish(arn)

    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "TuningJobNotCreated" and "service limit for tuning jobs" in cause
    assert "Stop the run's jobs (not created, tuning)" in pipeline.local.states_entered(arn)
    assert pipeline.jobs() == []


def test_without_listing_the_trials_the_ended_tuning_job_fails_the_run_naming_the_denial(
    platform: Any, tmp_path: Path, open_platform: Any
) -> None:
    # The trials' cost is summed from ListTrainingJobsForHyperParameterTuningJob; that statement is the only grant.
    assembly = _assembly_with(platform, tmp_path, _drop("TuningProgressRole", "ListTrials"))
    pipeline = open_platform(
        assembly, scripts=[_trial(loss, billed) for loss, billed in zip(LOSSES, BILLED, strict=True)]
    )
    arn = pipeline.start(tuning_input(pipeline))
    described = pipeline.finish(arn, timeout=60)
    assert described["status"] == "FAILED"
    cause = described["cause"]
    assert "sagemaker:ListTrainingJobsForHyperParameterTuningJob" in cause and "TuningProgressRole" in cause, cause
    assert [d.action for d in pipeline.local.iam.denials()] == ["sagemaker:ListTrainingJobsForHyperParameterTuningJob"]

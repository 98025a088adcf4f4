"""The handlers' plain functions, on real-shaped inputs."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contract.catalog import INSTANCE_TYPES
from contract.execution_state import Quality, TrainingRequest
from lambdas.approvals.identity import Principal
from lambdas.approvals.store import request_id_for
from lambdas.backends.batch import BatchLimits
from lambdas.estimate.handler import estimate
from lambdas.evaluate.handler import evaluate
from lambdas.sagemaker.monitor import job_cost, summarize
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import resolve
from stacks.settings import settings_from_context
from tests.conftest import EXAMPLE_INPUTS, cdk_context

EXAMPLES = EXAMPLE_INPUTS
# The limits cdk.json's settings deploy: every catalog type, a /20 training subnet, Batch on 4 x ml.p5.48xlarge.
LIMITS = settings_from_context(
    cdk_context(notifications={"run_emails": ["alice@example.org", "ml-engineer@example.org"]})  # the demo's
).platform_limits(
    datasets_bucket="tp-dev-datasets-123456789012-us-east-1",
    artifacts_bucket="tp-dev-artifacts-123456789012-us-east-1",
    fsx_file_system_id="fs-0123456789abcdef0",
    fsx_mount_name="abcdef12",
    tags={"platform": "distributed-training"},
    backends=("sagemaker", "batch"),
)


def _example(stem: str) -> dict[str, Any]:
    (path,) = [e for e in EXAMPLES if e.stem == stem]
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_readme_examples_are_valid_requests(example: Path) -> None:
    request = resolve(json.loads(example.read_text()), execution_name="exec-1", limits=LIMITS)
    assert request["channels"][0]["ChannelName"] == "train"
    assert request["job_name_base"].startswith(request["run_name"] + "-")
    assert len(request["job_name_base"]) + len("-10-10") <= 63  # SageMaker's job-name limit


def test_examples_cover_the_documented_shapes() -> None:
    shapes = {e.stem: json.loads(e.read_text()) for e in EXAMPLES}
    assert shapes["multi-node-fsdp-spot"]["spot"] and shapes["multi-node-fsdp-spot"]["instance_count"] > 1
    assert shapes["multi-node-fsdp-spot"]["distribution"] == "fsdp"
    assert shapes["warm-pool-iteration"]["warm_pool_minutes"] > 0
    assert shapes["single-node-ddp"]["instance_count"] == 1
    assert shapes["tuning"]["tuning"]["max_jobs"] == 4 and shapes["tuning"]["tuning"]["max_parallel_jobs"] == 2
    assert shapes["batch-multi-node"]["backend"] == "batch" and shapes["batch-multi-node"]["instance_count"] > 1
    assert len(shapes["capacity-fallback"]["fallback"]) == 1


def test_resolution_is_stable_per_execution_and_unique_across_them() -> None:
    base = _example("single-node-ddp")
    first = resolve(base, execution_name="exec-1", limits=LIMITS)
    assert resolve(base, execution_name="exec-1", limits=LIMITS) == first
    assert resolve(base, execution_name="exec-2", limits=LIMITS)["job_name_base"] != first["job_name_base"]


def test_checkpoints_off_turns_the_trainers_periodic_saves_off() -> None:
    base = _example("single-node-ddp") | {"checkpoints": False}
    hyperparameters = resolve(base, execution_name="e", limits=LIMITS)["hyperparameters"]
    assert hyperparameters["checkpoint.interval_steps"] == "0"
    assert hyperparameters["checkpoint.interval_minutes"] == "0"


def test_trainer_config_errors_reach_the_user() -> None:
    base = _example("single-node-ddp")
    base["hyperparameters"] = {"max_steps": 50}  # below the default 100 warmup steps
    with pytest.raises(InvalidRequest, match="warmup"):
        resolve(base, execution_name="e", limits=LIMITS)


def test_the_preflight_hyperparameter_is_checked_like_the_trainers_own() -> None:
    base = _example("single-node-ddp")
    off = resolve(base | {"hyperparameters": {"preflight": False}}, execution_name="e", limits=LIMITS)
    assert off["hyperparameters"]["preflight"] == "false"  # what the launcher reads in hyperparameters.json
    with pytest.raises(InvalidRequest, match=r"hyperparameter preflight='maybe' is invalid: use true or false"):
        resolve(base | {"hyperparameters": {"preflight": "maybe"}}, execution_name="e", limits=LIMITS)


def _request(instance_type: str = "ml.p5.48xlarge", instance_count: int = 4, **overrides: Any) -> TrainingRequest:
    """A request with what Estimate reads set: the cluster's groups, the runtime, warm pool and spot."""
    request = resolve(_example("single-node-ddp"), execution_name="e", limits=LIMITS) | {
        "instance_groups": [{"name": "train", "instance_type": instance_type, "instance_count": instance_count}],
        "stopping_condition": {"MaxRuntimeInSeconds": 36000},
        "keep_alive_seconds": 0,
        "spot": False,
    }
    request |= overrides
    request["instance_groups"] = [{"efa": False, "local_storage": False} | g for g in request["instance_groups"]]
    return TrainingRequest.parse(request)


def test_the_estimate_of_a_heterogeneous_cluster_sums_its_groups() -> None:
    groups = [
        {"name": "gpu", "instance_type": "ml.p4d.24xlarge", "instance_count": 2},
        {"name": "cpu", "instance_type": "ml.c5.4xlarge", "instance_count": 3},
    ]
    request = _request(instance_groups=groups, stopping_condition={"MaxRuntimeInSeconds": 7200})
    result = estimate(request, threshold_usd=500, spot_fraction=(0.3, 0.7), price_overrides={"ml.c5.4xlarge": 1.0})
    hourly = 2 * INSTANCE_TYPES["ml.p4d.24xlarge"].price_per_hour + 3 * 1.0
    assert result.hourly_usd == round(hourly, 4)
    assert result.on_demand_usd == round(hourly * 2, 2) == result.max_cost_usd
    assert result.price_source.startswith("settings override for ml.c5.4xlarge; list price, reviewed ")


def test_instance_types_outside_the_allow_list_are_refused() -> None:
    limits = dataclasses.replace(LIMITS, allowed_instance_types=("ml.p5.48xlarge",))
    with pytest.raises(
        InvalidRequest, match=r"'ml.g5.2xlarge' is not allowed on this platform; use one of ml.p5.48xlarge"
    ):
        resolve(_example("single-node-ddp") | {"instance_type": "ml.g5.2xlarge"}, execution_name="e", limits=limits)


def test_a_backend_the_platform_does_not_deploy_is_refused() -> None:
    limits = dataclasses.replace(LIMITS, backends=("sagemaker",))
    with pytest.raises(InvalidRequest, match=r"backend 'batch': this platform deploys sagemaker"):
        resolve(_example("batch-multi-node"), execution_name="e", limits=limits)
    assert resolve(_example("batch-multi-node"), execution_name="e", limits=LIMITS)["backend"] == "batch"


def test_the_batch_backend_refuses_what_its_compute_environment_cannot_run() -> None:
    request = _example("single-node-ddp") | {"backend": "batch", "spot": True, "distribution": "mpi"}
    with pytest.raises(InvalidRequest) as raised:
        resolve(request, execution_name="e", limits=LIMITS)
    message = str(raised.value)
    assert "the AWS Batch compute environment runs ml.p5.48xlarge only" in message
    assert "On-Demand instances only" in message
    assert "distribution 'mpi' needs SageMaker" in message
    with pytest.raises(InvalidRequest, match="heterogeneous clusters are SageMaker's"):
        resolve(_example("heterogeneous-cluster") | {"backend": "batch"}, execution_name="e", limits=LIMITS)
    no_batch = dataclasses.replace(LIMITS, backend_limits={**LIMITS.backend_limits, "batch": BatchLimits()})
    with pytest.raises(InvalidRequest, match="deploys no AWS Batch compute environment"):
        resolve(_example("batch-multi-node"), execution_name="e", limits=no_batch)


def test_estimate_is_count_times_price_times_runtime() -> None:
    result = estimate(_request(), threshold_usd=500, spot_fraction=(0.3, 0.7), price_overrides={})
    assert result.on_demand_usd == round(4 * 113.07 * 10, 2)
    assert result.approval_required is True
    assert result.spot_usd is None


def test_spot_estimate_is_a_range_but_decides_on_the_on_demand_price_it_can_reach() -> None:
    result = estimate(
        _request(spot=True, instance_count=1, stopping_condition={"MaxRuntimeInSeconds": 3600}),
        threshold_usd=80,
        spot_fraction=(0.3, 0.7),
        price_overrides={"ml.p5.48xlarge": 100.0},
    )
    assert result.spot_usd == [30.0, 70.0]
    assert result.max_cost_usd == result.on_demand_usd == 100.0
    assert result.approval_required is True  # its expected upper end (70) is below the threshold; 100 is not
    assert result.price_source == "settings override"


def test_warm_pool_keep_alive_is_billed() -> None:
    result = estimate(
        _request(instance_count=1, stopping_condition={"MaxRuntimeInSeconds": 3600}, keep_alive_seconds=1800),
        threshold_usd=1000,
        spot_fraction=(0.3, 0.7),
        price_overrides={},
    )
    assert result.on_demand_usd == round(113.07 * 1.5, 2)


def test_an_estimate_above_the_platforms_or_the_teams_monthly_budget_warns_and_says_by_how_much() -> None:
    costs = {"threshold_usd": 500, "spot_fraction": (0.3, 0.7), "price_overrides": {}}
    request = _request()  # 4 x ml.p5.48xlarge for 10 hours: $4,522.80
    within = estimate(request, **costs, monthly_budget_usd=5000)
    assert within.budget_warning == ""
    over = estimate(request, **costs, monthly_budget_usd=4000)
    assert "the worst case, $4,522.80, is 113% of the platform's monthly budget of $4,000.00" in over.budget_warning
    assert over.approval_required and over.max_cost_usd == within.max_cost_usd  # a warning, nothing else changes
    team = TrainingRequest.parse(request.model_dump() | {"team": "vision"})
    both = estimate(team, **costs, monthly_budget_usd=4000, team_budgets_usd={"vision": 2000, "language": 99_999})
    assert "113% of the platform's monthly budget" in both.budget_warning
    assert "226% of team vision's monthly budget of $2,000.00" in both.budget_warning
    assert estimate(team, **costs, team_budgets_usd={"language": 2000}).budget_warning == ""


def _describe(**fields: Any) -> dict[str, Any]:
    return {"TrainingJobName": "run-abc-1-0", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"} | fields


NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_monitor_counts_spot_interruptions() -> None:
    transitions = [
        {"Status": s} for s in ("Starting", "Training", "Interrupted", "Starting", "Training", "Interrupted")
    ]
    summary = summarize(
        _describe(SecondaryStatusTransitions=transitions),
        checkpoint=None,
        now=NOW,
        stale_minutes=90,
        hourly_usd=10.0,
    )
    assert summary.interruptions == 2 and summary.finished is False


def test_monitor_flags_stale_checkpoints_once_and_rearms() -> None:
    old = {
        "step": 10,
        "uri": "s3://b/runs/x/checkpoints/step-10/",
        "written_at": (NOW - timedelta(hours=2)).isoformat(),
    }
    first = summarize(_describe(), checkpoint=old, now=NOW, stale_minutes=90, hourly_usd=10.0)
    assert first.stale and first.warn_stale and first.checkpoint_age_minutes == 120.0
    again = summarize(
        _describe(), checkpoint=old, now=NOW, stale_minutes=90, hourly_usd=10.0, stale_warned=first.stale_warned
    )
    assert again.stale and not again.warn_stale
    fresh = {**old, "written_at": (NOW - timedelta(minutes=5)).isoformat()}
    recovered = summarize(
        _describe(), checkpoint=fresh, now=NOW, stale_minutes=90, hourly_usd=10.0, stale_warned=again.stale_warned
    )
    assert not recovered.stale and not recovered.stale_warned


@pytest.mark.parametrize(
    ("status", "secondary", "reason", "error"),
    [
        (
            "Failed",
            "Failed",
            "CapacityError: Unable to provision requested ML compute capacity",
            "InsufficientCapacity",
        ),
        (
            "Failed",
            "Failed",
            "AlgorithmError: PreflightFailed: GPUs missing (torch.cuda.device_count()): host algo-2 sees 7 of the "
            "8 expected",
            "PreflightFailed",
        ),
        ("Failed", "Failed", "PreflightFailed: the pre-flight check did not finish: ...", "PreflightFailed"),
        (
            "Failed",
            "Failed",
            "AlgorithmError: StragglerDetected: host algo-2 (ranks 8, 9) computed its steps 31% slower ...",
            "StragglerDetected",
        ),
        (
            "Failed",
            "Failed",
            "AlgorithmError: HangDetected: no training step for 612 s after step 1200 on algo-3",
            "HangDetected",
        ),
        ("Failed", "Failed", "AlgorithmError: exit code 1", "TrainingJobFailed"),
        # A run's own script: its own failure ends the run; a listed exit status and a lost link are retried.
        ("Failed", "Failed", "AlgorithmError: UserCodeFailed: the script exited with status 3", "TrainingJobFailed"),
        ("Failed", "Failed", "AlgorithmError: RetryableExit: the script exited with status 75", "RetryableExit"),
        ("Failed", "Failed", "AlgorithmError: CommunicationFailed: DistNetworkError", "CommunicationFailed"),
        # Only the failure file's own first word counts, not the words of some other error.
        ("Failed", "Failed", "AlgorithmError: ValueError: no 'PreflightFailed: ' here", "TrainingJobFailed"),
        ("Stopped", "MaxWaitTimeExceeded", "", "MaxWaitTimeExceeded"),
        ("Stopped", "MaxRuntimeExceeded", "", "MaxRuntimeExceeded"),
        ("Stopped", "Stopped", "", "TrainingJobStopped"),
        ("Completed", "Completed", "", None),
    ],
)
def test_monitor_names_how_a_job_ended(status: str, secondary: str, reason: str, error: str | None) -> None:
    describe = _describe(TrainingJobStatus=status, SecondaryStatus=secondary, FailureReason=reason)
    summary = summarize(describe, checkpoint=None, now=NOW, stale_minutes=90, hourly_usd=10.0)
    assert summary.finished is True
    assert summary.error == error
    retried = (
        "InsufficientCapacity",
        "PreflightFailed",
        "StragglerDetected",
        "HangDetected",
        "RetryableExit",
        "CommunicationFailed",
    )
    assert summary.retry_on_new_nodes is (error in retried)
    if error and not reason:
        assert secondary in summary.failure_reason


def test_a_finished_jobs_cost_is_billable_time_at_list_price_and_spot_saves_the_rest() -> None:
    # 4 instances at 25 USD/h: 100 USD per hour of the cluster. Spot: trained 3 h, billed 1.2 h.
    spot = job_cost({"BillableTimeInSeconds": 4320, "TrainingTimeInSeconds": 10800}, 100.0)
    assert spot is not None and (spot.actual_usd, spot.on_demand_usd, spot.spot_savings_usd) == (120.0, 300.0, 180.0)
    on_demand = job_cost({"BillableTimeInSeconds": 3600, "TrainingTimeInSeconds": 3600}, 100.0)
    assert on_demand is not None and on_demand.spot_savings_usd == 0
    assert job_cost({"TrainingTimeInSeconds": 3600}, 100.0) is None  # not billed yet: no figure is better than 0


@pytest.mark.parametrize(
    ("quality", "metrics", "passed", "reason"),
    [
        (None, {"validation:loss": 9.0}, True, "no quality gate requested"),
        ({"metric": "validation:loss", "max": 3.0, "min": None}, {"validation:loss": 2.9}, True, "meets <= 3.0"),
        ({"metric": "validation:loss", "max": 3.0, "min": None}, {"validation:loss": 3.1}, False, "does not meet"),
        ({"metric": "train:mfu", "max": None, "min": 0.5}, {"train:mfu": 0.55}, True, "meets >= 0.5"),
        ({"metric": "validation:loss", "max": 3.0, "min": None}, {"train:loss": 2.0}, False, "was not reported"),
    ],
)
def test_evaluate(quality: dict[str, Any] | None, metrics: dict[str, float], passed: bool, reason: str) -> None:
    result = evaluate(Quality.model_validate(quality) if quality is not None else None, metrics)
    assert result.passed is passed
    assert reason in result.reason


def test_principals_compare_by_account_kind_and_name_not_path() -> None:
    approver = Principal.parse("arn:aws:iam::123456789012:role/team/ml/MLLead")
    assert Principal.parse("arn:aws:sts::123456789012:assumed-role/MLLead/jane") == approver
    assert str(approver) == "arn:aws:iam::123456789012:role/MLLead"
    assert Principal.parse("arn:aws:sts::210987654321:assumed-role/MLLead/jane") != approver  # another account
    assert Principal.parse("arn:aws:iam::123456789012:user/MLLead") != approver  # a user is not the role
    assert Principal.parse("arn:aws-cn:sts::123456789012:assumed-role/R/s") == Principal(
        "aws-cn", "123456789012", "role", "R"
    )


def test_request_ids_are_stable_per_token_and_reveal_nothing() -> None:
    token = "AQCEAAAAKgAAAAMAAAAAAAAAAd"  # the shape of a task token
    assert request_id_for(token) == request_id_for(token)
    assert token not in request_id_for(token) and len(request_id_for(token)) == 32


def test_run_input_reference_page_is_current() -> None:
    from lambdas.validate.inputs import input_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "run-input.md").read_text()
    assert input_table() in page, "docs/reference/run-input.md is stale: regenerate it with `make docs`"


def test_monitor_knows_the_launchers_preflight_failure_type() -> None:
    from contract.layout import PREFLIGHT_FAILED
    from training.preflight import failure_line

    assert failure_line("GPUs missing").startswith(f"{PREFLIGHT_FAILED}: ")  # the word the monitor looks for
    reason = f"AlgorithmError: {failure_line('GPUs missing')}"
    assert (
        summarize(
            _describe(TrainingJobStatus="Failed", SecondaryStatus="Failed", FailureReason=reason),
            checkpoint=None,
            now=NOW,
            stale_minutes=90,
            hourly_usd=10.0,
        ).error
        == "PreflightFailed"
    )

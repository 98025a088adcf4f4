"""SageMaker training plans: the setting, the requests Validate resolves into the plan, and the variant's
create states and IAM (the Service Authorization Reference check runs on the variant in test_iam_reference)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from contract.execution_state import TrainingRequest
from lambdas.estimate.handler import estimate
from lambdas.sagemaker.capacity import next_cluster
from lambdas.validate.api_requests import PLACEHOLDERS, sent
from lambdas.validate.request import resolve
from stacks.settings import SettingsError, build_settings
from tests.conftest import TRAINING_PLAN_ARN, cdk_context
from tests.lambdas.test_handlers import LIMITS
from tests.support.iam import AssemblyIam

BASE = cdk_context()["platform"]
PLAN = {"arn": TRAINING_PLAN_ARN, "instance_type": "ml.p5.48xlarge"}


def _with_plan(**settings: str) -> Any:
    return build_settings(BASE, {"pipeline.training_plan": json.dumps(PLAN), **settings})


def test_the_setting_takes_a_training_plan_arn_of_the_stage_account_and_region() -> None:
    assert _with_plan().pipeline.training_plan.arn == TRAINING_PLAN_ARN  # type: ignore[union-attr]
    assert (
        _with_plan(region="eu-west-1", account="123456789012")
        .platform_limits(
            datasets_bucket="d",
            artifacts_bucket="a",
            fsx_file_system_id="fs-0",
            fsx_mount_name="m",
            tags={},
            backends=(),
        )
        .training_plan_instance_type
        == "ml.p5.48xlarge"
    )
    with pytest.raises(SettingsError, match="must be a training plan's ARN"):
        build_settings(BASE, {"pipeline.training_plan": json.dumps(PLAN | {"arn": "arn:aws:sagemaker:eu-west-1:1:x"})})
    with pytest.raises(SettingsError, match="is of region 'eu-west-1', not this stage's 'us-east-1'"):
        _with_plan(region="us-east-1")
    with pytest.raises(SettingsError, match="is of account '123456789012', not this stage's '210987654321'"):
        _with_plan(account="210987654321")
    with pytest.raises(SettingsError, match=r"not in pipeline\.allowed_instance_types"):
        _with_plan(**{"pipeline.allowed_instance_types": '["ml.p4d.24xlarge"]'})


def test_the_plan_name_is_checked_by_the_api_rule_of_training_plan_names() -> None:
    arn = TRAINING_PLAN_ARN.rsplit("/", 1)[0]
    for name in ("p", "a" * 64, "p4d--reserved-2"):
        assert _with_plan(**{"pipeline.training_plan": json.dumps(PLAN | {"arn": f"{arn}/{name}"})})
    for name in ("", "a" * 65, "p4d-", "-p4d", "p4d_reserved"):
        with pytest.raises(SettingsError, match="the name 1-64 letters, digits and '-'"):
            build_settings(BASE, {"pipeline.training_plan": json.dumps(PLAN | {"arn": f"{arn}/{name}"})})


PLANNED = dataclasses.replace(LIMITS, training_plan_instance_type="ml.p5.48xlarge")


def _request(**overrides: Any) -> TrainingRequest:
    base = {
        "run_name": "planned",
        "model": "tiny",
        "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
        "instance_type": "ml.p5.48xlarge",
        "instance_count": 2,
        "max_runtime_hours": 2,
    }
    return TrainingRequest.parse(resolve(base | overrides, execution_name="e", limits=PLANNED))


def test_an_on_demand_job_on_the_plan_type_runs_in_the_plan_and_says_so_in_its_request() -> None:
    request = _request()
    assert request.training_plan
    ((_, _, created),) = sent(request, 1)
    assert created["ResourceConfig"]["TrainingPlanArn"] == PLACEHOLDERS.training.training_plan_arn
    # Other types, spot and the AWS Batch backend do not.
    assert not _request(instance_type="ml.p4d.24xlarge").training_plan
    assert not _request(spot=True).training_plan
    ((_, _, spot),) = sent(_request(spot=True), 1)
    assert "TrainingPlanArn" not in spot["ResourceConfig"]
    assert not TrainingRequest.parse(
        resolve(
            {
                **_request().model_dump(include={"run_name"}),
                "model": "tiny",
                "backend": "batch",
                "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
                "instance_type": "ml.p5.48xlarge",
                "max_runtime_hours": 2,
            },
            execution_name="e",
            limits=PLANNED,
        )
    ).training_plan


def test_a_fallback_cluster_runs_in_the_plan_only_when_on_its_type() -> None:
    # 1 x p4d on demand first; then 1 x p5 in the plan (8 processes each).
    request = _request(
        instance_type="ml.p4d.24xlarge", instance_count=1, fallback=[{"instance_type": "ml.p5.48xlarge"}]
    )
    assert not request.training_plan
    priced = estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={})
    assert next_cluster(request, priced).request.training_plan


@pytest.fixture(scope="module")
def variant_iam(variant: Any) -> AssemblyIam:
    return AssemblyIam(Path(variant.assembly.directory))


def test_the_variant_creates_plan_jobs_with_the_plan_and_may_use_it(variant_iam: AssemblyIam) -> None:
    ((stack, logical),) = [
        (stack, logical)
        for stack, logical, _ in variant_iam.resources("AWS::StepFunctions::StateMachine")
        if logical.startswith("TrainingPipeline")
    ]
    states = variant_iam.definition(stack, logical)["States"]
    planned = {name: s for name, s in states.items() if "TrainingPlanArn" in json.dumps(s.get("Parameters", {}))}
    assert set(planned) == {
        "Create training job (training plan)",
        "Create training job (training plan, instance storage)",
    }
    assert {s["Parameters"]["ResourceConfig"]["TrainingPlanArn"] for s in planned.values()} == {TRAINING_PLAN_ARN}
    choice = json.dumps(states["Volume encryption?"])
    assert "$.request.training_plan" in choice
    create_statements = [
        statement
        for role in variant_iam.roles.values()
        for policy in role.policies
        for statement in policy.statements()
        if statement["Effect"] == "Allow" and "sagemaker:CreateTrainingJob" in _as_list(statement["Action"])
    ]
    assert create_statements and all(TRAINING_PLAN_ARN in _as_list(s["Resource"]) for s in create_statements)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]

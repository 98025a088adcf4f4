"""The tuning step in the template: a CreateHyperParameterTuningJob SageMaker accepts, and IAM that holds it
to the platform's fields."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from contract.service_requests import training_job_definition
from lambdas.validate.request import resolve
from localrun.aws.iam import Call, _create_tuning_job
from localrun.aws.iam_policy import evaluate
from stacks.settings import settings_from_context
from tests.conftest import cdk_context
from tests.support.iam import AssemblyIam, task_states

TUNING = {
    "ranges": {
        "lr": {"type": "continuous", "min": 0.0001, "max": 0.01, "scaling": "Logarithmic"},
        "batch_size": {"type": "categorical", "values": [4, 8]},
        "optim.warmup_steps": {"type": "integer", "min": 0, "max": 20},
    },
    "objective": {"metric": "validation:loss"},
    "strategy": "Hyperband",
    "hyperband": {"min_resource": 1, "max_resource": 10},
    "max_jobs": 4,
    "max_parallel_jobs": 2,
}


@pytest.fixture(scope="module")
def iam(platform: Any) -> AssemblyIam:
    return AssemblyIam(Path(platform.assembly.directory))


def _machine(iam: AssemblyIam) -> dict[str, Any]:
    ((stack, logical),) = [
        (stack, logical)
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        if stack.endswith("-pipeline")
    ]
    return iam.definition(stack, logical)


def _creates(iam: AssemblyIam, action: str) -> list[dict[str, Any]]:
    return [t for t in task_states(_machine(iam)) if t["Resource"].endswith(f":sagemaker:{action}")]


def _request() -> dict[str, Any]:
    """A request Validate resolved, for the JSONPaths of the definition to read."""
    settings = settings_from_context(
        cdk_context(
            pipeline={
                "max_runtime_hours": 10,
                "allowed_instance_types": ["ml.m5.xlarge"],
                "poll_interval_seconds": 60,
                "capacity_retries": 1,
                "volume_size_gb": 100,
            }
        )
    )
    limits = settings.platform_limits(
        datasets_bucket="datasets",
        artifacts_bucket="artifacts",
        fsx_file_system_id="fs-0123456789abcdef0",
        fsx_mount_name="abcdef",
        tags={"team": "ml"},
        backends=("sagemaker",),
    )
    execution_input = {
        "run_name": "a-run-name-long-enough-to-be-cut-for-it",
        "model": "tiny",
        "dataset": "fsx:///datasets/corpus/",
        "instance_type": "ml.m5.xlarge",
        "max_runtime_hours": 2,
        "spot": True,
        "hyperparameters": {"max_steps": 100},
        "tuning": TUNING,
    }
    return resolve(execution_input, execution_name="run-1", limits=limits, execution="arn:exec")


def _filled(parameters: Any, request: dict[str, Any]) -> Any:
    """The Parameters as SageMaker receives them: `$.request...` paths read, intrinsic functions stubbed."""
    if isinstance(parameters, list):
        return [_filled(p, request) for p in parameters]
    if not isinstance(parameters, dict):
        return parameters
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if not key.endswith(".$"):
            out[key] = _filled(value, request)
            continue
        if value.startswith("$.request."):
            found: Any = {"request": request}
            for part in value[2:].split("."):
                found = found[part]
            out[key[:-2]] = found
        else:  # States.Format(...): a string
            out[key[:-2]] = "stub"
    return out


def test_the_tuning_request_is_valid_for_sagemaker(iam: AssemblyIam) -> None:
    """botocore's own request validation: every field name, type and required member of the API."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateHyperParameterTuningJob").input_shape
    request = _request()
    creates = _creates(iam, "createHyperParameterTuningJob")
    assert len(creates) == 2  # EBS-backed and instance-store types
    for state in creates:
        params = _filled(state["Parameters"], request)
        report = ParamValidator().validate(params, shape)
        assert not report.has_errors(), report.generate_report()
        assert len(params["HyperParameterTuningJobName"]) <= 32
        assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}", params["HyperParameterTuningJobName"])


def test_every_trial_has_the_single_jobs_enforced_fields(iam: AssemblyIam) -> None:
    """The definition is CreateTrainingJob's constants, renamed: nothing enforced is lost on the way."""
    (single, *_) = _creates(iam, "createTrainingJob")
    tuning = {
        s["Parameters"]["TrainingJobDefinition"].get("ResourceConfig", {}).get("VolumeKmsKeyId"): s
        for s in _creates(iam, "createHyperParameterTuningJob")
    }
    definition = tuning[single["Parameters"]["ResourceConfig"].get("VolumeKmsKeyId")]["Parameters"][
        "TrainingJobDefinition"
    ]
    assert definition == training_job_definition(single["Parameters"])
    for field in (
        "RoleArn",
        "VpcConfig",
        "OutputDataConfig",
        "CheckpointConfig",
        "EnableNetworkIsolation",
        "EnableInterContainerTrafficEncryption",
        "EnableManagedSpotTraining.$",
        "InputDataConfig.$",
        "StoppingCondition.$",
        "Environment",
    ):
        assert definition[field] == single["Parameters"][field], field
    assert definition["StaticHyperParameters.$"] == single["Parameters"]["HyperParameters.$"]
    assert (
        definition["AlgorithmSpecification"]["TrainingImage"]
        == single["Parameters"]["AlgorithmSpecification"]["TrainingImage"]
    )


def _call(state: dict[str, Any], **changes: Any) -> Call:
    params = copy.deepcopy(_filled(state["Parameters"], _request()))
    definition = params["TrainingJobDefinition"]
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = definition
        for parent in parents:
            target = target[parent]
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return Call("sagemaker", "CreateHyperParameterTuningJob", params)


def test_the_state_machine_may_create_tuning_jobs_only_as_the_platform_configures_them(iam: AssemblyIam) -> None:
    (machine_role,) = [
        r for r in iam.roles.values() if "TrainingPipelineRole" in r.logical and "Events" not in r.logical
    ]
    (state,) = [
        s
        for s in _creates(iam, "createHyperParameterTuningJob")
        if "VolumeKmsKeyId" in s["Parameters"]["TrainingJobDefinition"]["ResourceConfig"]
    ]

    def allowed(call: Call) -> bool:
        return all(evaluate(machine_role.policies, request).allowed for request in _create_tuning_job(call))

    assert allowed(_call(state))
    for change in (
        {"VpcConfig__Subnets": ["subnet-elsewhere"]},
        {"VpcConfig": None},
        {"EnableNetworkIsolation": False},
        {"EnableInterContainerTrafficEncryption": False},
        {"OutputDataConfig__KmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/other"},
        {"ResourceConfig__VolumeKmsKeyId": None},
        {"ResourceConfig__InstanceType": "ml.p5.48xlarge.not-allowed"},
        {"StoppingCondition__MaxRuntimeInSeconds": 10**7},
    ):
        assert not allowed(_call(state, **change)), change


def test_the_budget_stop_also_denies_new_tuning_jobs(iam: AssemblyIam) -> None:
    (deny,) = [props for _, logical, props in iam.resources("AWS::IAM::ManagedPolicy") if "BudgetStopDeny" in logical]
    statements = {s["Sid"]: s for s in deny["PolicyDocument"]["Statement"]}
    assert statements["NoNewTuningJobs"]["Effect"] == "Deny"
    assert statements["NoNewTuningJobs"]["Action"] == "sagemaker:CreateHyperParameterTuningJob"

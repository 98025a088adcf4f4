"""The backend registry: every backend declares its limits, its check and its step, and its limits travel
through Validate's environment unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from lambdas.backends import BACKENDS, backend, deployed_backends, tuning_backends
from lambdas.backends.backend import Deployment, NoLimits
from lambdas.backends.batch import BatchLimits
from lambdas.validate.inputs import ExecutionInput
from lambdas.validate.limits import PlatformLimits
from tests.lambdas.test_handlers import LIMITS, _example

DEPLOYMENT = Deployment(largest_cluster_type="ml.p5.48xlarge", largest_cluster_count=4)


def test_an_unknown_backend_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="no training backend 'tpu'; the platform has sagemaker, batch, queue"):
        backend("tpu")
    assert backend("batch") is BACKENDS["batch"]


def test_every_backend_is_registered_under_its_own_name_with_a_step_and_what_starts_its_jobs() -> None:
    assert list(BACKENDS) == ["sagemaker", "batch", "queue"]
    for name, declared in BACKENDS.items():
        assert declared.name == name
        module, _, cls = declared.step.rpartition(".")
        assert module.startswith("stacks.pipeline.") and cls, declared.step
        assert declared.step_id and declared.denies, name
    assert tuning_backends() == ["sagemaker"]
    assert deployed_backends(teams=False) == ["sagemaker", "batch"]
    assert deployed_backends(teams=True) == ["sagemaker", "batch", "queue"]


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_backends_limits_travel_through_validates_environment(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = BACKENDS[name].limits.from_deployment(DEPLOYMENT)
    for variable, value in limits.environment().items():
        monkeypatch.setenv(variable, value)
    assert BACKENDS[name].limits.from_environment() == limits


def test_batch_limits_are_the_largest_cluster_and_none_where_the_environment_has_none() -> None:
    assert BatchLimits.from_deployment(DEPLOYMENT) == BatchLimits(instance_types=("ml.p5.48xlarge",), max_nodes=4)
    assert BatchLimits.from_deployment(DEPLOYMENT).environment() == {
        "BATCH_INSTANCE_TYPES": '["ml.p5.48xlarge"]',
        "BATCH_MAX_NODES": "4",
    }
    assert BatchLimits.from_environment() == BatchLimits()  # the variables are unset here


def test_platform_limits_read_back_what_the_stack_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in LIMITS.environment().items():
        monkeypatch.setenv(variable, value)
    assert PlatformLimits.from_environment() == LIMITS
    fewer = dataclasses.replace(LIMITS, backends=("sagemaker",))
    monkeypatch.setenv("TRAINING_BACKENDS", fewer.environment()["TRAINING_BACKENDS"])
    assert PlatformLimits.from_environment() == fewer


def test_a_backend_checks_a_request_against_its_own_limits_only() -> None:
    request = ExecutionInput.model_validate(_example("batch-multi-node"))
    assert BACKENDS["batch"].problems(request, LIMITS.backend_limits["batch"]) == []
    assert BACKENDS["sagemaker"].problems(request, NoLimits()) == []
    with pytest.raises(TypeError, match="backend 'batch' takes BatchLimits, not NoLimits"):
        BACKENDS["batch"].problems(request, NoLimits())

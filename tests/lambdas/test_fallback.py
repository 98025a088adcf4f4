"""Capacity fallback: the alternatives Validate resolves, and every bad one it refuses by its index."""

from __future__ import annotations

from typing import Any

import pytest

from lambdas.execution_state import TrainingRequest
from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

P4D_X4 = {"instance_type": "ml.p4d.24xlarge", "instance_count": 4}


def _input(**overrides: Any) -> dict[str, Any]:
    base = {
        "run_name": "fallback",
        "model": "tiny",
        "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
        "instance_type": "ml.p5.48xlarge",
        "instance_count": 2,
        "max_runtime_hours": 2,
        # 2 x 8 and 4 x 8 processes at 16 sequences each: 512 divides by both.
        "hyperparameters": {"batch_size": 16, "train.global_batch_size": 512},
        "fallback": [P4D_X4],
    }
    return base | overrides


def _problems(execution_input: dict[str, Any]) -> dict[str, Problem]:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="e", limits=LIMITS)
    return {p.field: p for p in raised.value.problems}


def test_alternatives_resolve_like_the_run_own_cluster_in_order() -> None:
    fallback = [P4D_X4, {"instance_type": "ml.g5.48xlarge", "instance_count": 4}]
    request = TrainingRequest.parse(resolve(_input(fallback=fallback), execution_name="e", limits=LIMITS))
    assert request.cluster == "2 x ml.p5.48xlarge" and request.alternative == 0 and request.fallback_left
    p4d, g5 = request.fallback
    assert (p4d.instance_type, p4d.instance_count, p4d.gpus, p4d.efa) == ("ml.p4d.24xlarge", 4, 8, True)
    assert p4d.allreduce_floor_gbps > 0
    assert (g5.instance_type, g5.instance_count, g5.gpus) == ("ml.g5.48xlarge", 4, 8)


def test_a_run_without_fallback_has_none_left() -> None:
    request = TrainingRequest.parse(resolve(_input(fallback=None), execution_name="e", limits=LIMITS))
    assert request.fallback == [] and not request.fallback_left


def test_each_bad_alternative_is_reported_by_its_index_in_one_pass() -> None:
    fallback = [{"instance_type": "ml.p4d.24xlarg"}, {"instance_type": "ml.p4d.24xlarge", "instance_count": 9999}]
    problems = _problems(_input(fallback=fallback, run_name="X"))
    assert set(problems) == {"run_name", "fallback[0].instance_type", "fallback[1].instance_count"}, problems
    assert "did you mean 'ml.p4d.24xlarge' or" in problems["fallback[0].instance_type"].message
    assert problems["fallback[0].instance_type"].value == "ml.p4d.24xlarg"
    assert "exceeds what the training subnet holds" in problems["fallback[1].instance_count"].message
    assert problems["fallback[1].instance_count"].value == 9999


def test_the_schema_names_an_alternative_by_its_index_and_allows_three() -> None:
    problems = _problems(_input(fallback=[P4D_X4, P4D_X4 | {"instance_count": 0}]))
    assert set(problems) == {"fallback[1].instance_count"}, problems
    assert "greater than or equal to 1" in problems["fallback[1].instance_count"].message
    assert set(_problems(_input(fallback=[P4D_X4] * 4))) == {"fallback"}


def test_an_alternative_is_held_to_the_run_efa_and_strategy() -> None:
    problems = _problems(_input(efa=True, fallback=[P4D_X4, {"instance_type": "ml.g5.2xlarge", "instance_count": 2}]))
    assert set(problems) == {"fallback[1]"}, problems
    assert "efa is true but ml.g5.2xlarge has no EFA" in problems["fallback[1]"].message


def test_an_alternative_whose_global_batch_differs_is_refused_with_the_batch_that_fits_both() -> None:
    # Without train.global_batch_size the global batch is micro_batch_size x processes: 256 on 16, 512 on 32.
    problems = _problems(_input(hyperparameters={"batch_size": 16}))
    assert set(problems) == {"fallback[0]"}, problems
    message = problems["fallback[0]"].message
    assert "global batch of 512 sequences" in message and "make 256" in message, message
    assert "train.global_batch_size to a multiple of 512" in message, message


def test_an_alternative_the_batch_does_not_divide_over_is_refused_by_the_trainer_rule() -> None:
    # 384 divides over 2 x 8 x 16 = 256? No: the run's own is refused too; 768 over 256 yes, over 4 x 8 x 16 = 512 no.
    problems = _problems(_input(hyperparameters={"batch_size": 16, "train.global_batch_size": 768}))
    assert set(problems) == {"fallback[0]"}, problems
    assert "with 32 processes x micro_batch_size 16 use a multiple of 512" in problems["fallback[0]"].message


def test_fallback_needs_the_single_group_form_and_a_backend_that_moves_attempts() -> None:
    groups = [{"name": "gpu", "instance_type": "ml.p4d.24xlarge", "instance_count": 2}] * 2
    hetero = _problems(_input(instance_type=None, instance_count=None, instance_groups=groups))
    assert "drop instance_groups or fallback" in hetero["fallback"].message
    batch = _problems(_input(backend="batch", instance_type="ml.p5.48xlarge"))
    assert "runs on the sagemaker backend only, not 'batch'" in batch["fallback"].message

"""Capacity fallback: the alternatives Validate resolves, and every bad one it refuses by its index."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from contract.catalog import INSTANCE_TYPES
from contract.execution_state import MAX_FALLBACK, NextCluster, TrainingRequest
from contract.layout import INSUFFICIENT_CAPACITY
from lambdas.estimate.handler import estimate
from lambdas.sagemaker import capacity
from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate import api_requests
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
    assert (
        "with 32 data-parallel processes x micro_batch_size 16 use a multiple of 512" in problems["fallback[0]"].message
    )


def test_fallback_needs_the_single_group_form_and_a_backend_that_moves_attempts() -> None:
    groups = [{"name": "gpu", "instance_type": "ml.p4d.24xlarge", "instance_count": 2}] * 2
    hetero = _problems(_input(instance_type=None, instance_count=None, instance_groups=groups))
    assert "drop instance_groups or fallback" in hetero["fallback"].message
    batch = _problems(_input(backend="batch", instance_type="ml.p5.48xlarge"))
    assert "runs on the sagemaker backend only, not 'batch'" in batch["fallback"].message


def _resolved(**overrides: Any) -> TrainingRequest:
    return TrainingRequest.parse(resolve(_input(**overrides), execution_name="e", limits=LIMITS))


def test_the_estimate_and_the_approval_are_on_the_dearest_cluster_which_it_names() -> None:
    # 4 x p4d first, then 2 x p5 (the same 32 ... 16 processes at 512 a step): the p5s cost more an hour.
    p5_x2 = {"instance_type": "ml.p5.48xlarge", "instance_count": 2}
    request = _resolved(max_runtime_hours=1, instance_type="ml.p4d.24xlarge", instance_count=4, fallback=[p5_x2])
    p5, p4d = (INSTANCE_TYPES[t].price_per_hour for t in ("ml.p5.48xlarge", "ml.p4d.24xlarge"))
    assert 2 * p5 > 4 * p4d
    threshold = 2 * p5 - 1
    result = estimate(request, threshold_usd=threshold, spot_fraction=(0.3, 0.7), price_overrides={})
    assert result.worst_case == "fallback[0]: 2 x ml.p5.48xlarge"
    assert result.max_cost_usd == round(2 * p5, 2) and result.approval_required
    # The run starts on its own cluster, at its own price; each fallback's is kept for when it is used.
    assert result.hourly_usd == round(4 * p4d, 4) and result.fallback_hourly_usd == [round(2 * p5, 4)]
    # Without the fallback the same run stays under the threshold.
    alone = estimate(
        request.model_copy(update={"fallback": []}),
        threshold_usd=threshold,
        spot_fraction=(0.3, 0.7),
        price_overrides={},
    )
    assert alone.worst_case == "the run's own cluster: 4 x ml.p4d.24xlarge" and not alone.approval_required


def test_the_worst_case_follows_the_prices_overrides_included() -> None:
    request = _resolved(
        max_runtime_hours=1,
        fallback=[{"instance_type": "ml.p4d.24xlarge", "instance_count": 2}],
        hyperparameters={"batch_size": 16, "train.global_batch_size": 256},
    )
    result = estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={"ml.p4d.24xlarge": 500.0})
    assert result.worst_case == "fallback[0]: 2 x ml.p4d.24xlarge" and result.max_cost_usd == 1000.0
    assert result.approval_required is False  # at the threshold, not above it
    result = estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={"ml.p4d.24xlarge": 1.0})
    assert result.worst_case == "the run's own cluster: 2 x ml.p5.48xlarge"
    assert result.price_source.startswith("settings override for ml.p4d.24xlarge; list price")


class _Context:
    function_name = "NextCluster"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:NextCluster"
    aws_request_id = "req-1"


def test_each_capacity_retry_moves_to_the_next_cluster_then_stays_on_the_last() -> None:
    fallback = [P4D_X4, {"instance_type": "ml.p4de.24xlarge", "instance_count": 4}]
    request = _resolved(fallback=fallback)
    priced = estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={})
    state: dict[str, Any] = {"request": request.model_dump(mode="json"), "estimate": priced.model_dump(mode="json")}
    seen = []
    for _ in range(3):
        moved = capacity.handler(state, _Context())
        state = {"request": moved["request"], "estimate": state["estimate"] | {"hourly_usd": moved["hourly_usd"]}}
        seen.append((moved["request"]["cluster"], moved["request"]["alternative"], moved["hourly_usd"]))
    assert seen == [
        ("4 x ml.p4d.24xlarge", 1, priced.fallback_hourly_usd[0]),
        ("4 x ml.p4de.24xlarge", 2, priced.fallback_hourly_usd[1]),
        ("4 x ml.p4de.24xlarge", 2, priced.fallback_hourly_usd[1]),  # none left: stays on the last one tried
    ]
    # What CreateTrainingJob and the launcher read is the new cluster's, and the run is the same run.
    final = TrainingRequest.parse(state["request"])
    assert (final.instance_type, final.instance_count, final.gpus, final.efa) == ("ml.p4de.24xlarge", 4, 8, True)
    assert final.job_name_base == request.job_name_base and final.fallback == request.fallback
    assert not final.fallback_left


def test_a_request_without_fallback_is_unchanged() -> None:
    request = _resolved(fallback=None)
    priced = estimate(request, threshold_usd=1000, spot_fraction=(0.3, 0.7), price_overrides={})
    assert capacity.next_cluster(request, priced) == NextCluster(request=request, hourly_usd=priced.hourly_usd)


def test_more_alternatives_than_capacity_retries_are_refused() -> None:
    # One retry can start one new job: a second alternative could never run, yet would set the estimate.
    fallback = [P4D_X4, {"instance_type": "ml.p4de.24xlarge", "instance_count": 4}]
    with pytest.raises(InvalidRequest) as raised:
        resolve(_input(fallback=fallback), execution_name="e", limits=dataclasses.replace(LIMITS, capacity_retries=1))
    problems = {p.field: p for p in raised.value.problems}
    assert set(problems) == {"fallback"}, problems
    assert problems["fallback"].message == (
        "fallback: 2 alternatives, but pipeline.capacity_retries allows 1 new job; list at most 1 "
        "(or raise pipeline.capacity_retries)"
    )
    assert resolve(
        _input(fallback=fallback[:1]), execution_name="e", limits=dataclasses.replace(LIMITS, capacity_retries=1)
    )


def test_an_alternative_the_schema_refuses_does_not_hide_the_others_problems() -> None:
    problems = _problems(_input(fallback=[{"instance_typ": "x"}, {"instance_type": "ml.p4d.24xlarg"}]))
    assert set(problems) == {"fallback[0].instance_typ", "fallback[0].instance_type", "fallback[1].instance_type"}
    assert "did you mean 'instance_type'?" in problems["fallback[0].instance_typ"].message
    assert "did you mean 'ml.p4d.24xlarge' or" in problems["fallback[1].instance_type"].message


def test_a_fallback_cluster_whose_create_request_the_service_would_refuse_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A documented limit that refuses the p4d cluster only: Validate sends each fallback's request to the checks too.
    refuse_p4d = api_requests.Limit(
        "sagemaker",
        "CreateTrainingJob",
        "no p4d (this test's)",
        "tests/lambdas/test_fallback.py",
        lambda params: "no p4d" if params["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge" else None,
        "ResourceConfig.InstanceType",
    )
    monkeypatch.setattr(api_requests, "LIMITS", (*api_requests.LIMITS, refuse_p4d))
    problems = _problems(_input())
    assert set(problems) == {"fallback[0].instance_type"}, problems
    message = problems["fallback[0].instance_type"].message
    assert "no p4d (tests/lambdas/test_fallback.py), in CreateTrainingJob.ResourceConfig.InstanceType" in message


def test_a_problem_of_the_run_settings_is_not_repeated_for_each_alternative() -> None:
    fallback = [P4D_X4, {"instance_type": "ml.p4de.24xlarge", "instance_count": 4}]
    problems = _problems(_input(distribution="nope", fallback=fallback))
    assert set(problems) == {"distribution"}, problems  # named once, under its own field


def test_an_alternative_that_is_the_run_own_cluster_or_repeats_another_is_refused() -> None:
    own = {"instance_type": "ml.p5.48xlarge", "instance_count": 2}
    problems = _problems(_input(fallback=[P4D_X4, own, P4D_X4]))
    assert set(problems) == {"fallback[1]", "fallback[2]"}, problems
    assert "2 x ml.p5.48xlarge is the run's own cluster" in problems["fallback[1]"].message
    assert "4 x ml.p4d.24xlarge repeats fallback[0]; drop it" in problems["fallback[2]"].message


def test_the_request_holds_an_alternative_in_range_and_at_most_max_fallback_clusters() -> None:
    data = _resolved().model_dump(mode="json")
    for bad in (
        {"alternative": -1},
        {"alternative": MAX_FALLBACK + 1},
        {"fallback": data["fallback"] * (MAX_FALLBACK + 1)},
    ):
        with pytest.raises(ValidationError):
            TrainingRequest.parse(data | bad)


def test_the_capacity_retry_cause_is_spelled_only_in_the_contract_layout() -> None:
    # The monitors return it and the state machine's Choice compares with it: one constant, INSUFFICIENT_CAPACITY.
    root = Path(__file__).parents[2]
    spelled = [
        str(path.relative_to(root))
        for folder in ("contract", "lambdas", "stacks", "training", "localrun", "tools")
        for path in sorted((root / folder).rglob("*.py"))
        if any(
            isinstance(node, ast.Constant) and node.value == INSUFFICIENT_CAPACITY
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert spelled == ["contract/layout.py"]

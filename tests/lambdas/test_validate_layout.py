"""Validate holds a run's parallel layout to its cluster and its memory plan to the GPUs, before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from contract.execution_state import TrainingRequest
from lambdas.estimate.handler import estimate
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

# GPT-2 tiny made wide enough that 2, 3, 4 and 6 processes split its heads, widths and vocabulary.
WIDE = {"seq_len": 48, "batch_size": 4, "model.dim": 96, "model.n_heads": 12, "model.vocab_size": 384}


def _input(**overrides: Any) -> dict[str, Any]:
    base = {
        "run_name": "layout",
        "model": "tiny",
        "dataset": f"s3://{LIMITS.datasets_bucket}/corpus/",
        "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2,
        "distribution": "fsdp",
        "max_runtime_hours": 2,
        "hyperparameters": WIDE,
    }
    return base | overrides


def _problems(execution_input: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="e", limits=LIMITS)
    return [p.message for p in raised.value.problems]


def test_a_tensor_parallel_group_must_fit_a_host() -> None:
    problems = _problems(_input(hyperparameters={**WIDE, "parallel.tp": 3}))
    assert problems == [
        "hyperparameters.parallel.tp: 16 processes cannot be tp=3: tp must divide 8, the GPUs per host (a "
        "tensor-parallel group stays on one host); use parallel.tp=2"
    ]


def test_a_fallback_cluster_is_held_to_the_layout_too() -> None:
    # tp=4 fits the run's own hosts of 8 GPUs, not a fallback's of 1.
    fallback = [{"instance_type": "ml.g5.2xlarge", "instance_count": 4}]
    problems = _problems(_input(hyperparameters={**WIDE, "parallel.tp": 4}, fallback=fallback))
    assert problems == [
        "fallback[0]: hyperparameters: 4 processes cannot be tp=4: tp must divide 1, the GPUs per host (a "
        "tensor-parallel group stays on one host); use parallel.tp=1"
    ]


# Llama-3.1-8B at Llama 3's context, two sequences per process, on one p5.
EIGHT_B = {"model": "llama-3.1-8b", "instance_type": "ml.p5.48xlarge", "instance_count": 1}
LLAMA_3_CONTEXT = {"seq_len": 8192, "batch_size": 2}
ONE_SEQUENCE = {"seq_len": 8192, "batch_size": 1}


def test_a_plan_over_the_gpus_memory_is_refused_with_the_cheapest_layout_that_fits() -> None:
    (problem,) = _problems(_input(**EIGHT_B, hyperparameters=LLAMA_3_CONTEXT))
    assert problem.startswith(
        "hyperparameters: the memory plan holds 130.4 GiB on a process (dp_shard=8: parameters 3.7 GiB, gradients "
        "3.7 GiB, optimizer states 7.5 GiB, activations 111.9 GiB, buffers 3.6 GiB), over the 72.0 GiB a process may "
        "use on ml.p5.48xlarge's 80 GiB H100 (10% kept free for CUDA, NCCL and fragmentation)"
    )
    assert problem.endswith(
        "the cheapest layout that fits: parallel.activation_checkpointing=true (42.4 GiB a process)"
    )


def test_the_layout_it_names_fits_and_the_estimate_shows_its_plan() -> None:
    checkpointed = {**LLAMA_3_CONTEXT, "parallel.activation_checkpointing": True}
    request = TrainingRequest.parse(
        resolve(_input(**EIGHT_B, hyperparameters=checkpointed), execution_name="e", limits=LIMITS)
    )
    assert request.hyperparameters["parallel.activation_checkpointing"] == "true"
    cost = estimate(request, threshold_usd=100, spot_fraction=(0.3, 0.5), price_overrides={})
    assert cost.gpu_memory is not None and cost.gpu_memory.startswith("42.4 GiB on a process (dp_shard=8: ")


def test_a_model_no_layout_of_the_cluster_holds_is_sent_to_more_instances() -> None:
    (problem,) = _problems(_input(**{**EIGHT_B, "model": "llama-3.1-70b"}, hyperparameters=ONE_SEQUENCE))
    assert "the memory plan holds 381.9 GiB on a process (dp_shard=8: " in problem
    assert problem.endswith(
        "the cheapest layout that fits on instance_count=2: parallel.tp=8 parallel.activation_checkpointing=true "
        "(69.6 GiB a process)"
    )


def test_a_fallback_cluster_whose_gpus_are_too_small_is_refused_by_its_index() -> None:
    fits_on_p5 = {**ONE_SEQUENCE, "parallel.activation_checkpointing": True, "parallel.tp": 8}
    seventy = {**EIGHT_B, "model": "llama-3.1-70b", "instance_count": 2}
    fallback = [{"instance_type": "ml.p4d.24xlarge", "instance_count": 2}]
    (problem,) = _problems(_input(**seventy, hyperparameters=fits_on_p5, fallback=fallback))
    assert problem.startswith(
        "fallback[0]: hyperparameters: the memory plan holds 69.6 GiB on a process (dp_shard=2 x tp=8"
    )
    assert "over the 36.0 GiB a process may use on ml.p4d.24xlarge's 40 GiB A100" in problem

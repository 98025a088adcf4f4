"""Validate holds a run's parallel layout to its cluster before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

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
        "hyperparameters: 16 processes cannot be tp=3: tp must divide 8, the GPUs per host (a tensor-parallel group "
        "stays on one host); use parallel.tp=2"
    ]


def test_a_fallback_cluster_is_held_to_the_layout_too() -> None:
    # tp=4 fits the run's own hosts of 8 GPUs, not a fallback's of 1.
    fallback = [{"instance_type": "ml.g5.2xlarge", "instance_count": 4}]
    problems = _problems(_input(hyperparameters={**WIDE, "parallel.tp": 4}, fallback=fallback))
    assert problems == [
        "fallback[0]: hyperparameters: 4 processes cannot be tp=4: tp must divide 1, the GPUs per host (a "
        "tensor-parallel group stays on one host); use parallel.tp=1"
    ]

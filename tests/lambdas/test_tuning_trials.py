"""The tuning job's joint space: ranges valid alone but not together are refused, so no trial fails on its values.

Each bad input is refused with the keys, the values and what to change; a good one passes unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lambdas.shared.errors import InvalidRequest
from lambdas.validate.request import resolve
from lambdas.validate.trials import MAX_CHECKS, MAX_COMBINATIONS, MAX_INTEGER_VALUES, TunedRange
from tests.lambdas.test_handlers import LIMITS

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tuning.json").read_text())


def _input(ranges: dict[str, Any], hyperparameters: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    execution_input = json.loads(json.dumps(EXAMPLE))
    execution_input["tuning"]["ranges"] = ranges
    if hyperparameters is not None:
        execution_input["hyperparameters"] = hyperparameters
    return {**execution_input, **top}


def _refusal(execution_input: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as raised:
        resolve(execution_input, execution_name="exec-1", limits=LIMITS)
    return str(raised.value)


def _integer(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "min": low, "max": high}


def _categorical(*values: Any) -> dict[str, Any]:
    return {"type": "categorical", "values": list(values)}


LR = {"type": "continuous", "min": 0.0005, "max": 0.01, "scaling": "Logarithmic"}


def test_two_ranges_of_one_trainer_field_are_refused_naming_both() -> None:
    message = _refusal(_input({"lr": LR, "optim.lr": LR}))
    assert "tuning.ranges.optim.lr: the same trainer field optim.lr as tuning.ranges.lr; keep one" in message


def test_a_range_of_a_field_fixed_under_another_name_is_refused_naming_both() -> None:
    message = _refusal(_input({"optim.lr": LR}, {"lr": 0.001, "max_steps": 120}))
    assert (
        "tuning.ranges.optim.lr: also fixed in `hyperparameters` (as 'lr', the same trainer field optim.lr)" in message
    )
    message = _refusal(_input({"train.max_steps": _integer(100, 200)}))  # the example fixes max_steps
    assert "tuning.ranges.train.max_steps: also fixed in `hyperparameters` (as 'max_steps'" in message


def test_a_field_the_platform_sets_is_not_tunable_under_any_name() -> None:
    # `checkpoints: false` sets checkpoint.interval_minutes; `model` is the top level's.
    message = _refusal(
        _input({"checkpoint.interval_minutes": _integer(5, 9)}, checkpoints=False, spot=False, max_wait_hours=None)
    )
    assert "tuning.ranges.checkpoint.interval_minutes: set to 0 for this request by the platform" in message
    assert "`model` is set at the top level" in _refusal(_input({"model.name": _categorical("tiny")}))


def test_ranges_whose_ends_contradict_a_cross_field_rule_are_refused() -> None:
    """max_steps 120-400 with warmup_steps 0-300: a trial of warmup 300 and 120 steps fails in the trainer."""
    message = _refusal(
        _input({"max_steps": _integer(120, 400), "optim.warmup_steps": _integer(0, 300)}, {"seq_len": 128})
    )
    assert "tuning.ranges: a trial of max_steps=120, optim.warmup_steps=300 is refused by the trainer" in message
    assert "use at most train.max_steps=120" in message and "narrow the ranges" in message
    resolve(
        _input({"max_steps": _integer(300, 400), "optim.warmup_steps": _integer(0, 300)}, {"seq_len": 128}),
        execution_name="exec-1",
        limits=LIMITS,
    )


def test_every_value_of_an_integer_range_meets_a_divisibility_rule() -> None:
    """batch_size 4-8 with a global batch of 24: both ends divide it, 5 and 7 do not."""
    message = _refusal(_input({"batch_size": _integer(4, 8)}, {"max_steps": 120, "train.global_batch_size": 24}))
    assert "tuning.ranges.batch_size: 5, 7 are refused by the trainer" in message
    assert "use 0 or a multiple of train.micro_batch_size=5" in message


def test_categorical_values_are_combined_with_every_other_range() -> None:
    message = _refusal(
        _input({"batch_size": _categorical(4, 16), "train.global_batch_size": _categorical(16, 24)}, {"max_steps": 120})
    )
    assert "a trial of batch_size=16, train.global_batch_size=24 is refused by the trainer" in message


def test_the_batch_must_split_over_the_clusters_processes() -> None:
    """4 hosts without GPUs run 4 processes: a global batch of 24 takes micro-batches of 2 or 6, not 4."""
    cluster = {"instance_type": "ml.m5.xlarge", "instance_count": 4}
    message = _refusal(
        _input({"batch_size": _categorical(2, 4)}, {"max_steps": 120, "train.global_batch_size": 24}, **cluster)
    )
    assert "tuning.ranges.batch_size: 4 is refused by the trainer" in message
    assert "with 4 data-parallel processes x micro_batch_size 4 use a multiple of 16" in message
    single = _input({}, {"max_steps": 120, "batch_size": 4, "train.global_batch_size": 24}, **cluster)
    del single["tuning"]
    assert (
        "hyperparameters.train.global_batch_size: hyperparameter train.global_batch_size=24 is invalid: with 4 "
        "data-parallel processes" in _refusal(single)
    )


def test_a_continuous_range_of_an_integer_field_is_refused() -> None:
    """Its trials would get values such as 151.37, which an integer field refuses."""
    message = _refusal(_input({"metrics.profile_steps": {"type": "continuous", "min": 32, "max": 64}}))
    assert "tuning.ranges.metrics.profile_steps: metrics.profile_steps takes int values" in message
    assert "use an integer range" in message
    message = _refusal(_input({"train.deterministic": _integer(0, 1)}))
    assert "train.deterministic takes bool values; use a categorical range" in message


def test_an_integer_range_too_wide_to_check_value_by_value_is_refused() -> None:
    message = _refusal(_input({"metrics.profile_steps": _integer(1, MAX_INTEGER_VALUES + 1)}))
    assert f"1 to {MAX_INTEGER_VALUES + 1} is more than the {MAX_INTEGER_VALUES} values Validate checks" in message


def test_many_ranges_are_checked_two_by_two() -> None:
    """Past MAX_COMBINATIONS the ranges are combined pairwise; the contradicting pair is still found."""
    ranges = {
        "max_steps": _integer(120, 400),
        "optim.warmup_steps": _integer(0, 300),
        "lr": LR,
        "batch_size": _categorical(*range(1, 31)),
        **{f"optim.{name}": {"type": "continuous", "min": 0.1, "max": 0.5} for name in ("beta1", "beta2")},
        "optim.weight_decay": {"type": "continuous", "min": 0.0, "max": 0.2},
    }
    candidates = [4, 4, 2, 30, 2, 2, 2]
    assert TunedRange("x", tuple("0123456789" * 4), integer=True).candidates == ("0", "9", "1", "8")
    combinations = 1
    for count in candidates:
        combinations *= count
    assert combinations > MAX_COMBINATIONS
    message = _refusal(_input(ranges, {"seq_len": 128}))
    assert "a trial of max_steps=120, optim.warmup_steps=300 is refused by the trainer" in message
    del ranges["optim.warmup_steps"]
    resolve(_input(ranges, {"seq_len": 128}), execution_name="exec-1", limits=LIMITS)


def test_every_problem_is_reported_at_once() -> None:
    message = _refusal(
        _input(
            {
                "lr": LR,
                "optim.lr": LR,
                "batch_size": _integer(4, 8),
                "max_steps": {"type": "continuous", "min": 1, "max": 2},
            },
            {"train.global_batch_size": 24},
        )
    )
    assert "the same trainer field optim.lr" in message
    assert "5, 7 are refused" in message
    assert "train.max_steps takes int values" in message


def test_ranges_needing_more_checks_than_validate_makes_are_refused_with_the_count() -> None:
    """12 ranges of 30 values: 66 pairs of 900 combinations each, past MAX_CHECKS."""
    fields = [
        "train.seed",
        "eval.max_sequences",
        "metrics.log_interval",
        "metrics.profile_steps",
        "metrics.profile_start_step",
        "checkpoint.keep_last",
        "eval.interval_steps",
        "checkpoint.interval_steps",
        "model.dim",
        "model.n_layers",
        "model.n_heads",
        "optim.warmup_steps",
    ]
    ranges = {name: _categorical(*range(1, 31)) for name in fields}
    assert MAX_CHECKS < 66 * 900
    message = _refusal(_input(ranges, {"max_steps": 120}))
    assert f"takes {66 * 900} combinations of tuned values, more than Validate checks ({MAX_CHECKS})" in message
    del ranges["optim.warmup_steps"], ranges["model.n_heads"]  # 45 pairs: checked
    resolve(_input(ranges, {"max_steps": 120}), execution_name="exec-1", limits=LIMITS)

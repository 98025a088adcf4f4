"""The metrics line format and SageMaker's MetricDefinitions (checked on real logs in test_multiprocess)."""

from __future__ import annotations

import re

import pytest

from contract.metrics import (
    METRIC_DEFINITIONS,
    PHASE_WALL,
    PHASES,
    PhaseClock,
    format_phases_line,
    format_train_line,
    format_validation_line,
    metric_series,
    parse_line,
    parse_metrics,
    phase_metric,
)

REQUIRED = {"train:loss", "validation:loss", "train:tokens_per_sec", "train:mfu", "train:grad_norm", "train:lr"}


def test_definitions_satisfy_create_training_job_limits() -> None:
    names = [d["Name"] for d in METRIC_DEFINITIONS]
    assert set(names) >= REQUIRED
    assert len(names) == len(set(names))
    for definition in METRIC_DEFINITIONS:
        assert set(definition) == {"Name", "Regex"}
        assert re.fullmatch(r"[^\s]{1,255}", definition["Name"])
        assert 1 <= len(definition["Regex"]) <= 500
        assert re.compile(definition["Regex"]).groups == 1


def test_train_line_round_trips_every_value_exactly() -> None:
    loss, lr, norm = 2.7182818284590455, 0.00030328853214923736, 1.2345678901234567
    line = format_train_line(step=42, loss=loss, lr=lr, grad_norm=norm, tokens_per_sec=12345.67, mfu=0.41234)
    assert line.startswith("step=42 loss=2.7182818284590455 ")
    parsed = parse_metrics(f"2026-01-01 12:00:00,000 INFO [rank0] training.trainer: {line}")
    assert parsed == {
        "train:loss": [loss],
        "train:lr": [lr],
        "train:grad_norm": [norm],
        "train:tokens_per_sec": [12345.7],
        "train:mfu": [0.4123],
    }


def test_mfu_is_omitted_when_unknown_and_then_not_reported() -> None:
    line = format_train_line(step=1, loss=5.0, lr=1e-05, grad_norm=3.0, tokens_per_sec=10.0)
    parsed = parse_metrics(line)
    assert "mfu" not in line
    assert "train:mfu" not in parsed
    assert parsed["train:lr"] == [1e-05]


def test_validation_line_is_not_a_train_loss() -> None:
    line = format_validation_line(step=100, val_loss=3.25)
    assert line == "step=100 val_loss=3.25"
    assert parse_metrics(line) == {"validation:loss": [3.25]}


def test_other_log_lines_are_not_metrics() -> None:
    noise = "\n".join(
        [
            'config {"optim": {"lr": 0.0006, "min_lr=": 1}} lr=0.5 grad_norm=3 mfu=0.9',
            "checkpoint step-20 committed in 0.10s",
            "loss=1.0 tokens_per_sec=5",
            "resumed from checkpoint step-20 (5120 tokens consumed)",
        ]
    )
    assert parse_metrics(noise) == {}


def test_the_last_match_is_the_final_value() -> None:
    log = "\n".join(
        format_train_line(step=s, loss=1.0 / s, lr=0.1, grad_norm=1.0, tokens_per_sec=1.0) for s in (1, 2, 3)
    )
    assert parse_metrics(log)["train:loss"] == [1.0, 0.5, 1.0 / 3]


def test_a_line_parses_to_its_step_and_metrics_and_other_lines_to_none() -> None:
    line = format_train_line(step=7, loss=2.5, lr=0.1, grad_norm=1.0, tokens_per_sec=99.0)
    assert parse_line(f"INFO [rank0] training.trainer: {line}") == (
        7,
        {"train:loss": 2.5, "train:lr": 0.1, "train:grad_norm": 1.0, "train:tokens_per_sec": 99.0},
    )
    assert parse_line(format_validation_line(step=8, val_loss=3.0)) == (8, {"validation:loss": 3.0})
    assert parse_line("resumed from checkpoint step-20 (5120 tokens consumed)") is None


def test_series_keep_the_last_value_of_a_step_logged_twice() -> None:
    log = "\n".join(
        [
            format_train_line(step=1, loss=4.0, lr=0.1, grad_norm=1.0, tokens_per_sec=1.0),
            format_train_line(step=2, loss=3.0, lr=0.1, grad_norm=1.0, tokens_per_sec=1.0),
            "resumed from checkpoint step-1 (32 tokens consumed)",
            format_train_line(step=2, loss=2.9, lr=0.1, grad_norm=1.0, tokens_per_sec=1.0),
            format_validation_line(step=2, val_loss=3.5),
        ]
    )
    series = metric_series(log)
    assert series["train:loss"] == {1: 4.0, 2: 2.9}
    assert series["validation:loss"] == {2: 3.5}


def test_non_finite_values_are_refused_rather_than_silently_unparsed() -> None:
    with pytest.raises(ValueError, match="not finite"):
        format_train_line(step=1, loss=float("nan"), lr=0.1, grad_norm=1.0, tokens_per_sec=1.0)


def test_the_phases_line_round_trips_and_sums_to_its_wall_time() -> None:
    line = format_phases_line(step=40, seconds={"startup": 3.5, "preflight": 0.25, "train": 100.125, "eval": 2.0})
    assert line == (
        "step=40 phases wall_s=105.875 startup_s=3.500 preflight_s=0.250 checkpoint_load_s=0.000 "
        "train_s=100.125 rework_s=0.000 checkpoint_s=0.000 eval_s=2.000 export_s=0.000"
    )
    step, values = parse_line(f"2026-01-01 12:00:00,000 INFO [rank0] training.trainer: {line}") or (0, {})
    assert step == 40
    assert values == {PHASE_WALL: 105.875} | {
        phase_metric(p): {"startup": 3.5, "preflight": 0.25, "train": 100.125, "eval": 2.0}.get(p, 0.0) for p in PHASES
    }
    # A phases line is no train metric, and no train line is a phase.
    assert "train:loss" not in values
    train = format_train_line(step=1, loss=1.0, lr=0.1, grad_norm=1.0, tokens_per_sec=1.0)
    assert not any(name.startswith("phases:") for name in parse_metrics(train))
    with pytest.raises(ValueError, match="not phases"):
        format_phases_line(step=1, seconds={"idle": 1.0})


def test_the_phase_clock_gives_every_moment_to_exactly_one_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([10.0, 12.0, 12.5, 15.0, 16.0, 16.25])
    monkeypatch.setattr("contract.metrics.time.monotonic", lambda: next(now))
    clock = PhaseClock(start=9.0)  # startup from 9.0
    clock.enter("train")  # 10.0: startup 1.0
    # 12.0: train 2.0 so far; 12.5: checkpoint 0.5; 15.0: eval 2.5, back to checkpoint
    with clock.phase("checkpoint"), clock.phase("eval"):
        pass
    # 16.0: checkpoint 1.0 more, back to train; 16.25: train 0.25 more
    assert clock.totals() == {
        "startup": 1.0,
        "preflight": 0.0,
        "checkpoint_load": 0.0,
        "train": 2.25,
        "rework": 0.0,
        "checkpoint": 1.5,
        "eval": 2.5,
        "export": 0.0,
    }
    assert sum(clock.seconds.values()) == 16.25 - 9.0
    with pytest.raises(ValueError, match="not a phase"):
        clock.enter("idle")

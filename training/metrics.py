"""The metrics log-line format and the SageMaker MetricDefinitions that parse it, kept side by side.

Torch-free: the CDK stacks import :data:`METRIC_DEFINITIONS` for CreateTrainingJob, and the tests
check these regexes against lines that a real training run printed.

Line formats (one line each, anywhere after a log prefix)::

    step=<int> loss=<float> lr=<float> grad_norm=<float> tokens_per_sec=<float>[ mfu=<float>]
    step=<int> val_loss=<float>
"""

from __future__ import annotations

import math
import re

# A float as Python's repr() writes it (3.25, 1e-05, 2.5e+20): SageMaker's parser needs a plain number.
_FLOAT = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
# Every train metric is anchored on the "step=N loss=" prefix so that no other log line (a config
# dump with "lr=", a validation line with "val_loss=") can ever be read as a train metric.
_TRAIN = r"\bstep=\d+ loss=\S+ .*?"

TRAIN_LOSS = "train:loss"
TOKENS_PER_SEC = "train:tokens_per_sec"
VALIDATION_LOSS = "validation:loss"

METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": TRAIN_LOSS, "Regex": rf"\bstep=\d+ loss={_FLOAT}"},
    {"Name": "train:lr", "Regex": rf"{_TRAIN}\blr={_FLOAT}"},
    {"Name": "train:grad_norm", "Regex": rf"{_TRAIN}\bgrad_norm={_FLOAT}"},
    {"Name": TOKENS_PER_SEC, "Regex": rf"{_TRAIN}\btokens_per_sec={_FLOAT}"},
    {"Name": "train:mfu", "Regex": rf"{_TRAIN}\bmfu={_FLOAT}"},
    {"Name": VALIDATION_LOSS, "Regex": rf"\bstep=\d+ val_loss={_FLOAT}"},
]

_COMPILED = [(d["Name"], re.compile(d["Regex"])) for d in METRIC_DEFINITIONS]
# Every definition matches after "step=N loss=" or "step=N val_loss=": the step of a line they match.
_STEP = re.compile(r"\bstep=(\d+) (?:val_)?loss=")


def format_train_line(
    *,
    step: int,
    loss: float,
    lr: float,
    grad_norm: float,
    tokens_per_sec: float,
    mfu: float | None = None,
) -> str:
    """The per-step metrics line; ``loss`` is written with repr() so resumed runs compare exactly."""
    line = (
        f"step={step} loss={_num(loss)} lr={_num(lr)} grad_norm={_num(grad_norm)} tokens_per_sec={tokens_per_sec:.1f}"
    )
    if mfu is not None:
        line += f" mfu={mfu:.4f}"
    return line


def format_validation_line(*, step: int, val_loss: float) -> str:
    """The validation metrics line (``val_loss`` in full precision)."""
    return f"step={step} val_loss={_num(val_loss)}"


def _num(value: float) -> str:
    value = float(value)
    if not math.isfinite(value):
        # A non-finite value would silently not match the regexes; the trainer fails on it instead.
        raise ValueError(f"metric value {value} is not finite")
    return repr(value)


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and the metrics :data:`METRIC_DEFINITIONS` read from one log line; None for any other line."""
    values = {name: float(match.group(1)) for name, pattern in _COMPILED if (match := pattern.search(line))}
    step = _STEP.search(line)
    if not values or step is None:
        return None
    return int(step.group(1)), values


def parse_metrics(log_text: str) -> dict[str, list[float]]:
    """Apply :data:`METRIC_DEFINITIONS` line by line like SageMaker; the last value is the final metric."""
    found: dict[str, list[float]] = {}
    for line in log_text.splitlines():
        _, values = parse_line(line) or (0, {})
        for name, value in values.items():
            found.setdefault(name, []).append(value)
    return found


def metric_series(log_text: str) -> dict[str, dict[int, float]]:
    """Each metric's value by step; a step logged again (a resumed run repeats steps) keeps its last value."""
    series: dict[str, dict[int, float]] = {}
    for line in log_text.splitlines():
        step, values = parse_line(line) or (0, {})
        for name, value in values.items():
            series.setdefault(name, {})[step] = value
    return series

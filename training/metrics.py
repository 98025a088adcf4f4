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

METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": "train:loss", "Regex": rf"\bstep=\d+ loss={_FLOAT}"},
    {"Name": "train:lr", "Regex": rf"{_TRAIN}\blr={_FLOAT}"},
    {"Name": "train:grad_norm", "Regex": rf"{_TRAIN}\bgrad_norm={_FLOAT}"},
    {"Name": "train:tokens_per_sec", "Regex": rf"{_TRAIN}\btokens_per_sec={_FLOAT}"},
    {"Name": "train:mfu", "Regex": rf"{_TRAIN}\bmfu={_FLOAT}"},
    {"Name": "validation:loss", "Regex": rf"\bstep=\d+ val_loss={_FLOAT}"},
]

_COMPILED = [(d["Name"], re.compile(d["Regex"])) for d in METRIC_DEFINITIONS]


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


def parse_metrics(log_text: str) -> dict[str, list[float]]:
    """Apply :data:`METRIC_DEFINITIONS` line by line like SageMaker; the last value is the final metric."""
    found: dict[str, list[float]] = {}
    for line in log_text.splitlines():
        for name, pattern in _COMPILED:
            match = pattern.search(line)
            if match:
                found.setdefault(name, []).append(float(match.group(1)))
    return found

"""The metrics log-line format and the SageMaker MetricDefinitions that parse it, kept side by side.

Torch-free: the CDK stacks import :data:`METRIC_DEFINITIONS` for CreateTrainingJob, and the tests
check these regexes against lines that a real training run printed.

Line formats (one line each, anywhere after a log prefix)::

    step=<int> loss=<float> lr=<float> grad_norm=<float> tokens_per_sec=<float>[ mfu=<float>]
    step=<int> val_loss=<float>
    step=<int> phases wall_s=<float> startup_s=<float> preflight_s=<float> ... (every name in PHASES)
    step=<int> stragglers=<int> slowdown=<float>
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

# A float as Python's repr() writes it (3.25, 1e-05, 2.5e+20): SageMaker's parser needs a plain number.
_FLOAT = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
# Every train metric is anchored on the "step=N loss=" prefix so that no other log line (a config
# dump with "lr=", a validation line with "val_loss=") can ever be read as a train metric.
_TRAIN = r"\bstep=\d+ loss=\S+ .*?"

TRAIN_LOSS = "train:loss"
# Where a worker's time went, from its start to the line (seconds, cumulative; they sum to wall_s):
# start-up (from the launcher's start: imports, process group, model, data), the pre-flight check, the
# checkpoint load (with its verification), training steps, training steps an earlier start of the run had
# already taken (rework after an interruption, contract/goodput.py), blocking checkpoint saves and waits,
# evaluations, the model export.
PHASES = ("startup", "preflight", "checkpoint_load", "train", "rework", "checkpoint", "eval", "export")
PHASE_WALL = "phases:wall_seconds"


def phase_metric(phase: str) -> str:
    """The metric name of one phase's seconds."""
    return f"phases:{phase}_seconds"


_PHASES = r"\bstep=\d+ phases .*?"
# Where ranks share their step times (training/stragglers.py): hosts found straggling so far, and how
# much slower than the median rank the slowest host computed in the last window.
STRAGGLER_HOSTS = "stragglers:hosts"
STRAGGLER_SLOWDOWN = "stragglers:slowdown"
TOKENS_PER_SEC = "train:tokens_per_sec"
VALIDATION_LOSS = "validation:loss"

_MODEL_DEFINITIONS: list[dict[str, str]] = [
    {"Name": TRAIN_LOSS, "Regex": rf"\bstep=\d+ loss={_FLOAT}"},
    {"Name": "train:lr", "Regex": rf"{_TRAIN}\blr={_FLOAT}"},
    {"Name": "train:grad_norm", "Regex": rf"{_TRAIN}\bgrad_norm={_FLOAT}"},
    {"Name": TOKENS_PER_SEC, "Regex": rf"{_TRAIN}\btokens_per_sec={_FLOAT}"},
    {"Name": "train:mfu", "Regex": rf"{_TRAIN}\bmfu={_FLOAT}"},
    {"Name": VALIDATION_LOSS, "Regex": rf"\bstep=\d+ val_loss={_FLOAT}"},
]
MODEL_METRIC_NAMES = tuple(d["Name"] for d in _MODEL_DEFINITIONS)
"""What the model did: the metrics a quality gate or a tuning objective can name (the phases are time)."""

METRIC_DEFINITIONS: list[dict[str, str]] = [
    *_MODEL_DEFINITIONS,
    {"Name": PHASE_WALL, "Regex": rf"{_PHASES}\bwall_s={_FLOAT}"},
    *({"Name": phase_metric(phase), "Regex": rf"{_PHASES}\b{phase}_s={_FLOAT}"} for phase in PHASES),
    {"Name": STRAGGLER_HOSTS, "Regex": r"\bstep=\d+ stragglers=(\d+)"},
    {"Name": STRAGGLER_SLOWDOWN, "Regex": rf"\bstep=\d+ stragglers=\d+ slowdown={_FLOAT}"},
]

_COMPILED = [(d["Name"], re.compile(d["Regex"])) for d in METRIC_DEFINITIONS]
# Every definition matches after "step=N loss=", "step=N val_loss=", "step=N phases " or "step=N stragglers=":
# the step of a line they match.
_STEP = re.compile(r"\bstep=(\d+) (?:(?:val_)?loss=|phases |stragglers=)")


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


def format_phases_line(*, step: int, seconds: dict[str, float]) -> str:
    """Where the worker's time went up to ``step``: ``seconds`` per name in PHASES, and their sum."""
    unknown = set(seconds) - set(PHASES)
    if unknown:
        raise ValueError(f"not phases: {sorted(unknown)}")
    parts = " ".join(f"{phase}_s={seconds.get(phase, 0.0):.3f}" for phase in PHASES)
    return f"step={step} phases wall_s={sum(seconds.values()):.3f} {parts}"


def format_stragglers_line(*, step: int, hosts: int, slowdown: float) -> str:
    """The straggler check's line at ``step``: hosts found straggling, the last window's worst slowdown."""
    return f"step={step} stragglers={hosts} slowdown={slowdown:.3f}"


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


class PhaseClock:
    """Splits the time since ``start`` (time.monotonic) into PHASES: every moment belongs to the phase
    last entered, so the parts always sum to the whole."""

    def __init__(self, start: float | None = None, phase: str = "startup") -> None:
        if phase not in PHASES:
            raise ValueError(f"not a phase: {phase!r}")
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.started = time.monotonic() if start is None else start
        self._phase, self._since = phase, self.started

    def enter(self, phase: str) -> str:
        """Count from now on towards `phase`; the phase left."""
        if phase not in PHASES:
            raise ValueError(f"not a phase: {phase!r}")
        now = time.monotonic()
        self.seconds[self._phase] += now - self._since
        left, self._phase, self._since = self._phase, phase, now
        return left

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """`phase` for the block, then back to the phase it interrupted."""
        left = self.enter(phase)
        try:
            yield
        finally:
            self.enter(left)

    def totals(self) -> dict[str, float]:
        """Seconds per phase up to now."""
        self.enter(self._phase)
        return dict(self.seconds)

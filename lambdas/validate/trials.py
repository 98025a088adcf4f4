"""The trainer's own checks over everything a job may be given: one job's hyperparameters, or every trial a tuning
job may pick from its ranges.

The rules are the trainer's (contract/config.py): `from_hyperparameters` with its field and cross-field checks, and
the layout and the batch split over the job's processes (contract/mesh.py), which the trainer checks when it starts.
Nothing here re-spells them; this module only chooses which combinations of tuned values to put to them:

- every value of a categorical range, and both ends of a continuous one (the trainer's rules on a real number
  are bounds, so a value between two accepted ends is accepted too);
- every value of an integer range (divisibility is not decided by the ends), up to MAX_INTEGER_VALUES of them;
- every combination of the candidates of all ranges when there are at most MAX_COMBINATIONS, else every
  combination of every two ranges (the trainer's cross-field rules each relate two fields that can be tuned);
  in these, an integer range of more than SMALL_INTEGER_RANGE values takes its ends and the ends' neighbours.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from contract.config import ALIASES, HYPERPARAMETERS, ConfigError, ConfigProblem, from_hyperparameters
from contract.execution_state import TRAIN_ROLE, InstanceGroup
from contract.mesh import layout_problems
from contract.user_code import CODE_PREFIX, NOT_THE_SCRIPTS, is_launcher_key

MAX_INTEGER_VALUES = 1024
"""The most values of an integer range Validate checks one by one; a wider range is refused."""
SMALL_INTEGER_RANGE = 32
"""An integer range of at most this many values is combined with the other ranges value by value."""
MAX_COMBINATIONS = 4096
"""Up to this many combinations of the ranges' candidates are checked all together."""
MAX_CHECKS = 50_000
"""The most combinations Validate puts to the trainer (a few seconds); ranges that need more are refused."""


def trainer_field(key: str) -> str:
    """The trainer's field a hyperparameter key sets (an alias names the same field as its target)."""
    return ALIASES.get(key, key)


@dataclass(frozen=True)
class Processes:
    """A cluster's training processes: all of them, and on each host (for unlike hosts, their greatest common
    divisor: what a tensor-parallel group must divide)."""

    total: int
    per_host: int


def training_processes(groups: Iterable[InstanceGroup]) -> Processes:
    """The job's torchrun processes: one per GPU, or one per host without GPUs, on the hosts that train."""
    training = [group for group in groups if group.role == TRAIN_ROLE]
    return Processes(
        total=sum(group.instance_count * max(group.gpus, 1) for group in training),
        per_host=math.gcd(*(max(group.gpus, 1) for group in training)),
    )


def launcher_settings(values: Mapping[str, str], *, own_code: bool) -> dict[str, str]:
    """What of a job's hyperparameters the platform's rules judge: all of them for the built-in trainer; for a run's
    own script, only the launcher's and the SDK's settings (`hang.*`, `preflight`, ...), never the script's own."""
    if not own_code:
        return dict(values)
    ours = {k: v for k, v in values.items() if is_launcher_key(k)}
    return {k: v for k, v in ours.items() if not k.startswith((CODE_PREFIX, *NOT_THE_SCRIPTS))}


def trainer_problems(values: Mapping[str, str], processes: Processes) -> list[ConfigProblem]:
    """Every reason the trainer refuses a job of these hyperparameters on these processes, each with its key."""
    try:
        config = from_hyperparameters(values)
    except ConfigError as exc:
        return exc.problems
    if not processes.total:
        return []
    return layout_problems(config, processes.total, processes.per_host)


def trainer_refusal(values: Mapping[str, str], processes: Processes) -> str | None:
    """Why the trainer refuses a job of these hyperparameters on these processes (every reason), or None."""
    return "; ".join(p.message for p in trainer_problems(values, processes)) or None


@dataclass(frozen=True)
class TunedRange:
    """One range as Validate checks it: its key, and the values a trial may be given (as SageMaker sends them)."""

    key: str
    values: tuple[str, ...]
    """Every value a trial may get (categorical, integer) or the two ends (continuous)."""
    integer: bool = False

    @property
    def candidates(self) -> tuple[str, ...]:
        """The values combined with other ranges' values."""
        if not self.integer or len(self.values) <= SMALL_INTEGER_RANGE:
            return self.values
        return (self.values[0], self.values[-1], self.values[1], self.values[-2])


def integer_values(low: int, high: int) -> tuple[str, ...] | None:
    """Every value of an integer range, or None when there are more than Validate checks."""
    return tuple(str(v) for v in range(low, high + 1)) if high - low < MAX_INTEGER_VALUES else None


def refused_alone(where: str, tuned: TunedRange, fixed: Mapping[str, str], processes: Processes) -> str | None:
    """What is wrong with the range's own values beside the fixed hyperparameters, or None."""
    refused: dict[str, str] = {}
    for value in tuned.values:
        reason = trainer_refusal({**fixed, tuned.key: value}, processes)
        if reason is not None:
            refused[value] = reason
    if not refused:
        return None
    shown = ", ".join(list(refused)[:8]) + (f" and {len(refused) - 8} more" if len(refused) > 8 else "")
    first = next(iter(refused.values()))
    return f"{where}: {shown} {'is' if len(refused) == 1 else 'are'} refused by the trainer: {first}"


def refused_together(ranges: Sequence[TunedRange], fixed: Mapping[str, str], processes: Processes) -> list[str]:
    """One problem per set of ranges whose values, each accepted alone, the trainer refuses together."""
    everything = math.prod(len(tuned.candidates) for tuned in ranges)
    groups = [tuple(ranges)] if everything <= MAX_COMBINATIONS else list(itertools.combinations(ranges, 2))
    groups = [group for group in groups if len(group) > 1]
    checks = sum(math.prod(len(tuned.candidates) for tuned in group) for group in groups)
    if checks > MAX_CHECKS:
        return [
            f"tuning.ranges: checking that every trial is valid takes {checks} combinations of tuned values, more "
            f"than Validate checks ({MAX_CHECKS}); tune fewer hyperparameters, or fewer values of each"
        ]
    problems = []
    for group in groups:
        for combination in itertools.product(*(tuned.candidates for tuned in group)):
            trial = dict(zip((tuned.key for tuned in group), combination, strict=True))
            reason = trainer_refusal({**fixed, **trial}, processes)
            if reason is not None:
                picked = ", ".join(f"{key}={value}" for key, value in trial.items())
                problems.append(
                    f"tuning.ranges: a trial of {picked} is refused by the trainer: {reason}; narrow the ranges so "
                    "that every combination the tuning job may pick is valid"
                )
                break
    return problems


def field_type_problem(where: str, key: str, kind: str) -> str | None:
    """A range whose kind gives values the field's type cannot take (a continuous range on an integer field)."""
    spec = HYPERPARAMETERS.get(trainer_field(key))
    if spec is None:
        return None  # unknown: the trainer's own check names it
    if kind == "continuous" and spec.type is not float:
        return f"{where}: {spec.name} takes {spec.type.__name__} values, which a continuous range does not give; " + (
            "use an integer range" if spec.type is int else "use a categorical range"
        )
    if kind == "integer" and spec.type not in (int, float):
        return f"{where}: {spec.name} takes {spec.type.__name__} values; use a categorical range"
    return None

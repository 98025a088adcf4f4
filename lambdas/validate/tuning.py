"""The execution input's `tuning` key, and its resolution into SageMaker's HyperParameterTuningJobConfig.

Every range names a trainer field no other key sets (aliases included), gives values of the field's type, and
every trial the tuning job may pick passes the trainer's own checks with the run's fixed hyperparameters and
cluster (lambdas/validate/trials.py says which combinations that takes), so no trial can fail on its values.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from contract.execution_state import InstanceGroup, Tuning
from contract.metrics import MODEL_METRIC_NAMES
from contract.user_code import is_launcher_key
from lambdas.validate.service_models import model_limit
from lambdas.validate.trials import (
    MAX_INTEGER_VALUES,
    Processes,
    TunedRange,
    field_type_problem,
    integer_values,
    refused_alone,
    refused_together,
    trainer_field,
    training_processes,
)

MAX_JOBS = 100
MAX_PARALLEL_JOBS = 10
MAX_CATEGORICAL_VALUES = model_limit("sagemaker", "ParameterValues")  # per categorical range
TUNING_JOB_NAME_LENGTH = model_limit("sagemaker", "HyperParameterTuningJobName")
HYPERBAND_MAX_RESOURCE = 20_000

Scaling = Literal["Auto", "Linear", "Logarithmic", "ReverseLogarithmic"]


class RangeInput(BaseModel):
    """One tuned hyperparameter: continuous or integer between `min` and `max`, or categorical `values`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["continuous", "integer", "categorical"]
    min: StrictInt | StrictFloat | None = None
    max: StrictInt | StrictFloat | None = None
    scaling: Scaling = "Auto"
    values: list[StrictStr | StrictInt | StrictFloat | StrictBool] | None = None


class ObjectiveInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    metric: str
    type: Literal["Minimize", "Maximize"] = "Minimize"


class HyperbandInput(BaseModel):
    """Hyperband's resource bounds (SageMaker counts them in the metric's reports, e.g. evaluations)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    min_resource: int = Field(ge=1)
    max_resource: int = Field(ge=1, le=HYPERBAND_MAX_RESOURCE)


class TuningInput(BaseModel):
    """The `tuning` key of the execution input."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ranges: dict[str, RangeInput] = Field(min_length=1)
    objective: ObjectiveInput
    strategy: Literal["Bayesian", "Random", "Hyperband"] = "Bayesian"
    hyperband: HyperbandInput | None = None
    early_stopping: bool = False
    max_jobs: int = Field(ge=1, le=MAX_JOBS)
    max_parallel_jobs: int = Field(1, ge=1, le=MAX_PARALLEL_JOBS)


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _categorical(where: str, spec: RangeInput, problems: list[str]) -> list[str] | None:
    if spec.min is not None or spec.max is not None or spec.scaling != "Auto":
        problems.append(f"{where}: a categorical range takes `values` only (no min, max or scaling)")
        return None
    if not spec.values or len(spec.values) > MAX_CATEGORICAL_VALUES:
        problems.append(f"{where}: give 1 to {MAX_CATEGORICAL_VALUES} `values`")
        return None
    values = [_text(v) for v in spec.values]
    if len(set(values)) != len(values):
        problems.append(f"{where}: `values` are repeated")
        return None
    return values


def _bounds(where: str, spec: RangeInput) -> str | None:  # noqa: PLR0911 - one answer per rule
    """What is wrong with a continuous or integer range's bounds, or None."""
    low, high = spec.min, spec.max
    if spec.values is not None:
        return f"{where}: a {spec.type} range takes min and max, not `values`"
    if low is None or high is None:
        return f"{where}: a {spec.type} range needs both `min` and `max`"
    if spec.type == "integer" and not (isinstance(low, int) and isinstance(high, int)):
        return f"{where}: an integer range needs integer min and max, not {low!r} and {high!r}"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{where}: min and max must be finite numbers"
    if not low < high:
        return f"{where}: min {low} must be below max {high}"
    if spec.scaling == "Logarithmic" and low <= 0:
        return f"{where}: Logarithmic scaling needs min > 0 (got {low})"
    if spec.scaling == "ReverseLogarithmic" and (spec.type == "integer" or not 0 <= low < high < 1):
        return f"{where}: ReverseLogarithmic scaling is for continuous ranges within [0, 1)"
    return None


def _check_range(
    name: str,
    spec: RangeInput,
    fixed: dict[str, str],
    processes: Processes,
    problems: list[str],
    *,
    trainer: bool = True,
) -> tuple[dict[str, object], TunedRange] | None:
    """The range as SageMaker takes it and as Validate checks it, or None (with the problems) if it is not valid.
    `trainer`: its values are judged by the built-in trainer's rules (a run's own script judges its own)."""
    where = f"tuning.ranges.{name}"
    sagemaker: dict[str, object]
    problem = field_type_problem(where, name, spec.type) if trainer else None
    if problem is not None:
        problems.append(problem)
        return None
    if spec.type == "categorical":
        values = _categorical(where, spec, problems)
        if values is None:
            return None
        sagemaker = {"Name": name, "Values": values}
        tuned = TunedRange(name, tuple(values))
    else:
        problem = _bounds(where, spec)
        if problem is not None:
            problems.append(problem)
            return None
        ends = (_text(spec.min), _text(spec.max))
        sagemaker = {"Name": name, "MinValue": ends[0], "MaxValue": ends[1], "ScalingType": spec.scaling}
        every = integer_values(int(ends[0]), int(ends[1])) if spec.type == "integer" else ends
        if every is None:
            problems.append(
                f"{where}: {spec.min} to {spec.max} is more than the {MAX_INTEGER_VALUES} values Validate checks one "
                "by one (the trainer's rules may refuse values between accepted ends); narrow it"
            )
            return None
        tuned = TunedRange(name, every, integer=spec.type == "integer")
    # The trainer's own checks, as each trial will run them.
    problem = refused_alone(where, tuned, fixed, processes) if trainer else None
    if problem is not None:
        problems.append(problem)
        return None
    return sagemaker, tuned


def _strategy(tuning: TuningInput, problems: list[str]) -> dict[str, object]:
    """Strategy, its configuration and the early-stopping type, as HyperParameterTuningJobConfig takes them."""
    config: dict[str, object] = {
        "Strategy": tuning.strategy,
        "TrainingJobEarlyStoppingType": "Auto" if tuning.early_stopping else "Off",
    }
    if tuning.strategy != "Hyperband":
        if tuning.hyperband is not None:
            problems.append(f"tuning.hyperband applies to the Hyperband strategy only, not {tuning.strategy}")
        return config
    # Hyperband stops under-performing trials itself; SageMaker takes no early-stopping type beside it.
    config["TrainingJobEarlyStoppingType"] = "Off"
    if tuning.early_stopping:
        problems.append("tuning.early_stopping: Hyperband stops trials early itself; drop early_stopping")
    if tuning.hyperband is None:
        problems.append('tuning.hyperband: Hyperband needs {"min_resource": ..., "max_resource": ...}')
    elif tuning.hyperband.min_resource > tuning.hyperband.max_resource:
        problems.append("tuning.hyperband: min_resource must not exceed max_resource")
    else:
        config["StrategyConfig"] = {
            "HyperbandStrategyConfig": {
                "MinResource": tuning.hyperband.min_resource,
                "MaxResource": tuning.hyperband.max_resource,
            }
        }
    return config


def _check_cluster(groups: list[InstanceGroup], warm_pool_minutes: int, problems: list[str]) -> None:
    if len(groups) > 1:
        problems.append(
            f"tuning needs one instance group (every trial runs the same cluster); this request has {len(groups)}"
        )
    if warm_pool_minutes:
        problems.append("warm_pool_minutes does not apply to tuning jobs; drop it or drop `tuning`")


def _taken(
    name: str,
    field: str,
    *,
    own_code: bool,
    top_level: dict[str, str],
    fields: dict[str, str],
    given: dict[str, object],
) -> str | None:
    """Why a range's key is not tuned: it is the launcher's, or set elsewhere in the input (None: it may be)."""
    if own_code and is_launcher_key(name):
        return "a setting of the platform's launcher, not your script's; not tuned"
    if name in top_level:
        return f"`{top_level[name]}` is set at the top level and is not tuned"
    if field in fields and fields[field] in given:
        also = fields[field]
        same = "" if also == name else f" (as {also!r}, the same trainer field {field})"
        return f"also fixed in `hyperparameters`{same}; tune it or fix it, not both"
    if field in fields:
        return f"the same trainer field {field} as tuning.ranges.{fields[field]}; keep one"
    return None


def resolve_tuning(
    tuning: TuningInput | None,
    *,
    run_name: str,
    suffix: str,
    fixed: dict[str, str],
    given: dict[str, object],
    top_level: dict[str, str],
    groups: list[InstanceGroup],
    warm_pool_minutes: int,
    problems: list[str],
    own_code: bool = False,
) -> Tuning | None:
    """The tuning job's settings, or None for a single job; problems are appended, not raised (whether the
    request's backend tunes at all is Validate's check, lambdas/validate/request.py). `own_code`: the run's own
    script takes the hyperparameters, which it judges itself (the platform's keys are not tuned)."""
    if tuning is None:
        return None
    _check_cluster(groups, warm_pool_minutes, problems)
    ranges: dict[str, list[dict[str, object]]] = {
        "ContinuousParameterRanges": [],
        "IntegerParameterRanges": [],
        "CategoricalParameterRanges": [],
    }
    processes = training_processes(groups)
    field_of = (lambda key: key) if own_code else trainer_field  # a script's keys have no aliases
    fields = {field_of(key): key for key in given} | {field_of(key): key for key in top_level}
    platform = {field_of(key): key for key in fixed}
    tuned: list[TunedRange] = []
    for name, spec in tuning.ranges.items():
        field = field_of(name)
        taken = _taken(name, field, own_code=own_code, top_level=top_level, fields=fields, given=given)
        if taken is None and field in platform:  # e.g. checkpoint intervals when `checkpoints` is false
            taken = f"set to {fixed[platform[field]]} for this request by the platform; not tunable"
        if taken is not None:
            problems.append(f"tuning.ranges.{name}: {taken}")
            continue
        fields[field] = name
        resolved = _check_range(name, spec, fixed, processes, problems, trainer=not own_code)
        if resolved is not None:
            ranges[f"{spec.type.title()}ParameterRanges"].append(resolved[0])
            tuned.append(resolved[1])
    if not own_code:
        problems.extend(refused_together(tuned, fixed, processes))
    if tuning.objective.metric not in MODEL_METRIC_NAMES:
        reporter = "the SDK's metric report" if own_code else "the trainer"
        problems.append(
            f"tuning.objective.metric {tuning.objective.metric!r} is not reported by {reporter}; use one of "
            f"{', '.join(MODEL_METRIC_NAMES)}"
        )
    if tuning.max_parallel_jobs > tuning.max_jobs:
        problems.append(
            f"tuning.max_parallel_jobs {tuning.max_parallel_jobs} exceeds max_jobs {tuning.max_jobs}; lower it"
        )
    config: dict[str, object] = {
        **_strategy(tuning, problems),
        "HyperParameterTuningJobObjective": {"Type": tuning.objective.type, "MetricName": tuning.objective.metric},
        "ResourceLimits": {
            "MaxNumberOfTrainingJobs": tuning.max_jobs,
            "MaxParallelTrainingJobs": tuning.max_parallel_jobs,
        },
        "ParameterRanges": ranges,
    }
    # <run>-<identity>: the run name is cut to fit SageMaker's 32 characters, the identity never is;
    # trials add -<NNN>-<8 hex> themselves.
    head = run_name[: TUNING_JOB_NAME_LENGTH - len(suffix) - 1].rstrip("-")
    return Tuning(
        job_name=f"{head}-{suffix}",
        max_jobs=tuning.max_jobs,
        max_parallel_jobs=tuning.max_parallel_jobs,
        config=config,
    )

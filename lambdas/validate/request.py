"""The resolution of the execution input (lambdas/validate/inputs.py) into a complete training request.

Every check runs before anything is created; all problems are reported at once, each with
what to change. The resolved request is the only thing later states read from the input.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from contract import model_folder as mf
from contract import user_code
from contract.catalog import INSTANCE_TYPES, InstanceType, suggestion
from contract.config import ConfigError, ConfigProblem, from_hyperparameters, packed_rows_problem
from contract.distributions import DISTRIBUTIONS
from contract.distributions import NAMES as DISTRIBUTION_NAMES
from contract.execution_state import (
    AUXILIARY_ROLE,
    TRAIN_ROLE,
    BaseModelSource,
    Code,
    Dataset,
    InstanceGroup,
    Quality,
    ResumeSource,
    Tag,
    TrainingRequest,
    Tuning,
)
from contract.layout import (
    FSX_DATASETS,
    FSX_SCHEME,
    LEDGER_CHANNEL,
    LocationError,
    dataset_prefix,
    run_ledger,
)
from contract.memory import memory_problem
from contract.metrics import MODEL_METRIC_NAMES
from contract.service_requests import EXECUTION_TAG, TEAM_TAG
from lambdas.backends import fallback_backends, training_plan_backends, tuning_backends
from lambdas.backends.queue import QUEUE
from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate import code as own_code
from lambdas.validate.api_requests import request_problems
from lambdas.validate.inputs import ExecutionInput, FallbackInput, GroupInput
from lambdas.validate.limits import PlatformLimits
from lambdas.validate.model_folder import FolderAt, check_records, inspect_model_folder, jsonl_files
from lambdas.validate.resume import PreviousRun, resume_check
from lambdas.validate.service_models import model_limit
from lambdas.validate.teams import Team, named_team, recipients, request_team_problems
from lambdas.validate.trials import Processes, launcher_settings, trainer_problems, trainer_refusal, training_processes
from lambdas.validate.tuning import resolve_tuning

RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")
HYPERPARAMETER_KEY_LIMIT = model_limit("sagemaker", "HyperParameterKey")
HYPERPARAMETER_VALUE_LIMIT = model_limit("sagemaker", "HyperParameterValue")
# A run's identity: 64 bits of SHA-256 over the execution ARN and its start time. An ARN names one
# execution only while Step Functions remembers it (names are reusable 90 days after an execution
# ends); with its start time it is unique for the account for ever.
RUN_ID_HEX = 16
# Set at the top level of the input, never inside `hyperparameters`.
TOP_LEVEL_HYPERPARAMETERS = {
    "model": "model",
    "model.name": "model",
    "distribution": "distribution",
    "model.init_from": "init_from",
}
# Of a run's own script, only `distribution` (which the launcher reads) is set at the top level.
SCRIPT_TOP_LEVEL = {"distribution": "distribution"}

GROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_INSTANCE_GROUPS = model_limit("sagemaker", "InstanceGroups")  # per training job
CHANNEL_NAMES = ("train", "validation", mf.BASE_MODEL_CHANNEL)
_DATASET_FIELDS = {"train": "dataset", "validation": "validation_dataset", mf.BASE_MODEL_CHANNEL: "init_from"}


# The schema's type errors as the value given and what to write instead (pydantic says "Input should be a valid
# boolean", neither naming the value nor saying that JSON writes true unquoted).
_TYPE_FIXES = {
    "bool_type": ("a boolean", "write true or false, without quotes"),
    "int_type": ("a whole number", "write one without quotes, e.g. 2"),
    "float_type": ("a number", "write one without quotes, e.g. 1.5"),
    "string_type": ("a string", "write it in double quotes"),
    "list_type": ("a list", 'write it in brackets, e.g. ["a"]'),
}


def _problems_from(exc: ValidationError) -> list[Problem]:
    problems: list[Problem] = []
    for err in exc.errors():
        # A list's item by its index, as the checks name it: `fallback[2].instance_count`.
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        if err["type"] == "extra_forbidden":
            known = _keys_at(err["loc"][:-1])
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else f"this level takes {', '.join(known)}"
            problem = Problem(loc, err["input"], f"unknown key; {fix}")
        elif err["loc"][0] == "hyperparameters" and len(err["loc"]) > 1:
            # One line per key, not one per member of the str | int | float | bool union.
            key = f"hyperparameters.{err['loc'][1]}"
            value = err["input"]
            problem = Problem(key, value, f"must be a string, number or boolean, not {type(value).__name__}")
        elif err["type"] in _TYPE_FIXES:
            kind, fix = _TYPE_FIXES[err["type"]]
            problem = Problem(loc, err["input"], f"{err['input']!r} is not {kind}; {fix}")
        else:
            problem = Problem(loc, err.get("input"), err["msg"].removeprefix("Value error, "))
        if str(problem) not in {str(p) for p in problems}:
            problems.append(problem)
    return problems


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys (field names and aliases) of the model found at `loc` in the input, for did-you-mean."""
    model: type[BaseModel] = ExecutionInput
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            continue  # a list index
        inner = _model_in(field.annotation)
        if inner is None:
            break
        model = inner
    return [key for name, f in model.model_fields.items() for key in (name, f.alias) if key]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _dataset_channel(channel: str, prefix: str, limits: PlatformLimits, *, fsx: bool) -> dict[str, Any]:
    """The InputDataConfig entry of a dataset, from its datasets-bucket key prefix in normal form (`dataset_prefix`):
    a mount of the file system's link to it (`fsx`), or the S3 prefix itself."""
    if fsx:
        source = {
            "FileSystemDataSource": {
                "FileSystemId": limits.fsx_file_system_id,
                "FileSystemAccessMode": "ro",
                "FileSystemType": "FSxLustre",
                "DirectoryPath": f"/{limits.fsx_mount_name}{FSX_DATASETS}{prefix.removesuffix('/')}",
            }
        }
    else:
        s3_uri = f"s3://{limits.datasets_bucket}/{prefix}"
        source = {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": s3_uri, "S3DataDistributionType": "FullyReplicated"}
        }
    return {"ChannelName": channel, "DataSource": source, "InputMode": "File"}


def dataset_prefixes(request: ExecutionInput, limits: PlatformLimits, problems: list[str]) -> dict[str, str]:
    """Each dataset and model folder the request names (by input key), as the datasets-bucket key prefix it reads
    in normal form: the one reading of a location that every later check and the channels use. A location not
    written in its normal form, or naming a root, or outside the datasets locations, is a problem and left out."""
    found = {}
    for field in _DATASET_FIELDS.values():
        uri = getattr(request, field)
        if uri is None:
            continue
        try:
            found[field] = dataset_prefix(uri, datasets_bucket=limits.datasets_bucket)
        except LocationError as exc:
            problems.append(
                f"{field} {exc}: a dataset or model is a folder fsx:///datasets/<path>/ or "
                f"s3://{limits.datasets_bucket}/<prefix>/, written as it is read (only the platform's datasets "
                "locations can be read)"
            )
    return found


def ledger_channel(artifacts_bucket: str, run: str) -> dict[str, Any]:
    """The input channel that brings every host the run's checkpoint ledger (contract/ledger.py); a few small
    files, which hosts that do not train receive too rather than spend a channel list on them."""
    source = {
        "S3DataType": "S3Prefix",
        "S3Uri": f"s3://{artifacts_bucket}/{run_ledger(run)}",
        "S3DataDistributionType": "FullyReplicated",
    }
    return {"ChannelName": LEDGER_CHANNEL, "DataSource": {"S3DataSource": source}, "InputMode": "File"}


def _asked_groups(request: ExecutionInput, problems: list[str]) -> list[GroupInput]:
    """The groups the input names: `instance_type` x `instance_count` as one, or `instance_groups`."""
    if request.instance_groups is None:
        if request.instance_type is None:
            problems.append(
                "instance_type: Field required; name an instance type, or give instance_groups for a heterogeneous"
                " cluster"
            )
            return []
        return [
            GroupInput(name=TRAIN_ROLE, instance_type=request.instance_type, instance_count=request.instance_count or 1)
        ]
    groups = request.instance_groups
    if request.instance_type is not None or request.instance_count is not None:
        problems.append(
            "instance_groups names each group's instance_type and instance_count; drop instance_type and"
            " instance_count from the top level"
        )
    if not 2 <= len(groups) <= MAX_INSTANCE_GROUPS:
        problems.append(
            f"instance_groups: give 2 to {MAX_INSTANCE_GROUPS} groups (SageMaker's limit); for one, use"
            " instance_type and instance_count"
        )
    names = [group.name for group in groups]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"instance_groups: the name {name!r} is used twice; each group needs its own")
    for group in groups:
        where = f"instance_groups[{group.name}]"
        if not GROUP_NAME.match(group.name):
            problems.append(
                f"{where}: name {group.name!r} must be 1-63 of a-z, 0-9, '-', starting with a letter or digit"
            )
        if group.role not in (TRAIN_ROLE, AUXILIARY_ROLE):
            problems.append(f"{where}: role {group.role!r} must be {TRAIN_ROLE!r} or {AUXILIARY_ROLE!r}")
        for channel in group.channels or []:
            if channel not in CHANNEL_NAMES:
                problems.append(f"{where}: channel {channel!r} is not one of {', '.join(CHANNEL_NAMES)}")
    if not any(group.role == TRAIN_ROLE for group in groups):
        problems.append(f"instance_groups: no group has role {TRAIN_ROLE!r}; name the group(s) that train")
    return groups


def _check_cluster(request: ExecutionInput, limits: PlatformLimits, problems: list[str]) -> list[InstanceGroup] | None:
    """Every group's type, EFA and strategy checked; the groups resolved, or None when a type is unknown."""
    asked = _asked_groups(request, problems)
    resolved: list[InstanceGroup] = []
    for group in asked:
        field = "instance_type" if request.instance_groups is None else f"instance_groups[{group.name}].instance_type"
        instance = _instance_type(group.instance_type, field, limits, problems)
        if instance is None:
            continue
        training = group.role == TRAIN_ROLE
        if request.efa and training and not instance.supports_efa:
            efa_types = ", ".join(sorted(t.name for t in INSTANCE_TYPES.values() if t.supports_efa))
            problems.append(f"efa is true but {instance.name} has no EFA; use one of {efa_types} or drop `efa`")
        strategy = DISTRIBUTIONS.get(request.distribution)
        allowed = strategy.instance_types if strategy is not None and training else None
        if strategy is not None and allowed is not None and instance.name not in allowed:
            problems.append(
                f"distribution {strategy.name!r} runs on {', '.join(sorted(allowed))} only, not {instance.name}"
            )
        # Hosts that do not train never join NCCL: no EFA, no GPUs or bandwidth expected of them.
        efa = training and (instance.supports_efa if request.efa is None else request.efa)
        resolved.append(
            InstanceGroup(
                name=group.name,
                instance_type=instance.name,
                instance_count=group.instance_count,
                efa=efa,
                local_storage=instance.local_storage,
                gpus=instance.cuda_gpus if training else 0,
                # The floor is EFA's: over TCP sockets the pre-flight has none to hold a run to.
                allreduce_floor_gbps=instance.allreduce_floor_gbps if efa else 0.0,
                role=group.role,
                channels=group.channels,
            )
        )
    if request.distribution not in DISTRIBUTIONS:
        problems.append(f"distribution {request.distribution!r} is not one of {', '.join(DISTRIBUTION_NAMES)}")
    if len(resolved) != len(asked) or not resolved:
        return None
    if _in_training_plan(request, resolved, limits):
        resolved = [resolved[0].model_copy(update={"training_plan": True})]
    _check_capacity(resolved, limits, problems)
    if len(resolved) > 1:
        gpus = {g.gpus for g in resolved if g.role == TRAIN_ROLE}
        if len(gpus) > 1:
            problems.append(
                "instance_groups: the groups that train must have as many GPUs per instance as each other "
                f"(one torchrun job); these have {', '.join(str(n) for n in sorted(gpus))}"
            )
        if request.warm_pool_minutes:
            problems.append("warm_pool_minutes: SageMaker warm pools do not support heterogeneous clusters; drop it")
    return resolved


def _check_fallback(
    request: ExecutionInput,
    alternatives: list[FallbackInput | None],
    *,
    groups: list[InstanceGroup] | None,
    hyperparameters: dict[str, str],
    limits: PlatformLimits,
    problems: list[str],
) -> tuple[list[InstanceGroup], dict[str, list[InstanceGroup]]]:
    """Each `fallback` cluster checked as the run's own is (type, EFA, strategy, subnet, the trainer's batch split),
    and held to the run's global batch. Returns the clusters resolved, each one group, and those that can run the
    trainer by their key (`fallback[0]`): a model folder's memory plan (`init_from`) waits for it to be read.
    `alternatives` are the input's, None where the schema refused one (its problems are the schema's)."""
    if not alternatives:
        return [], {}
    if request.instance_groups is not None:
        problems.append(
            "fallback: each alternative is one instance_type and instance_count, so the run's own cluster must be too;"
            " drop instance_groups or fallback"
        )
        return [], {}
    if request.backend not in fallback_backends():
        problems.append(
            f"fallback: runs on the {' or '.join(fallback_backends())} backend only, not {request.backend!r}"
        )
    if request.tuning is not None:
        problems.append("fallback: a tuning job's trials are not moved to other clusters; drop fallback or tuning")
    # Each alternative is tried by a new job, and every new job is one of the run's retries.
    retries = limits.capacity_retries
    if len(alternatives) > retries:
        problems.append(
            f"fallback: {len(alternatives)} alternatives, but pipeline.capacity_retries allows {retries} new "
            f"job{'' if retries == 1 else 's'}; list at most {retries} (or raise pipeline.capacity_retries)"
        )
    redundant = _redundant(request, alternatives)
    problems.extend(f"fallback[{index}]: {problem}" for index, problem in redundant.items())
    resolved: list[InstanceGroup] = []
    runnable: dict[str, list[InstanceGroup]] = {}
    for index, alternative in enumerate(alternatives):
        if alternative is None or index in redundant:
            continue
        where = f"fallback[{index}]"
        found: list[str] = []
        shaped = request.model_copy(
            update={"instance_type": alternative.instance_type, "instance_count": alternative.instance_count}
        )
        cluster = _check_cluster(shaped, limits, found)
        # The checks name the top-level keys they judge: here they judge this alternative's. The others judge the
        # run's settings (e.g. `distribution`): one already said of the run's own cluster is not said again.
        problems.extend(
            _on_fallback(index, p)
            for p in found
            if p.startswith(("instance_type", "instance_count")) or p not in problems
        )
        if cluster is None:
            continue
        resolved.extend(cluster)
        if found or request.code is not None:
            # Its batch judged on a cluster that cannot run would only repeat the problem; a run's own script splits
            # its batch itself.
            continue
        processes = training_processes(cluster)
        refusal = trainer_refusal(hyperparameters, processes)
        runnable[where] = cluster
        if refusal is None and request.init_from is None:  # a model folder's plan waits for it to be read
            refusal = memory_problem(hyperparameters, cluster)
        if refusal is not None:
            problems.append(f"{where}: hyperparameters: {refusal}")
        elif groups is not None:
            problems.extend(_batch_mismatch(where, hyperparameters, groups, cluster))
    return resolved, runnable


def _redundant(request: ExecutionInput, alternatives: list[FallbackInput | None]) -> dict[int, str]:
    """Why an alternative adds nothing, by its index: it is the run's own cluster, or one listed before it."""
    own = (request.instance_type, request.instance_count or 1)
    first: dict[tuple[str | None, int], int] = {}
    found: dict[int, str] = {}
    for index, alternative in enumerate(alternatives):
        if alternative is None:
            continue
        shape = (alternative.instance_type, alternative.instance_count)
        cluster = f"{alternative.instance_count} x {alternative.instance_type}"
        if shape == own:
            found[index] = f"{cluster} is the run's own cluster, which a retry uses anyway; drop it"
        elif shape in first:
            found[index] = f"{cluster} repeats fallback[{first[shape]}]; drop it"
        else:
            first[shape] = index
    return found


def _batch_mismatch(
    where: str, hyperparameters: dict[str, str], groups: list[InstanceGroup], cluster: list[InstanceGroup]
) -> list[str]:
    """The alternative's global batch against the run's own: an alternative must train with the same one."""
    try:
        config = from_hyperparameters(hyperparameters)
    except ConfigError:
        return []  # the trainer's refusal is reported already
    train = config.train
    own_dp, dp = (config.data_parallel(training_processes(g).total) for g in (groups, cluster))
    own, batch = train.global_batch(own_dp), train.global_batch(dp)
    if own == batch:
        return []
    per_step = [train.micro_batch_size * own_dp, train.micro_batch_size * dp]
    return [
        f"{where}: its {dp} data-parallel processes make a global batch of {batch} sequences, the run's own "
        f"cluster's {own_dp} make {own}; set hyperparameters.train.global_batch_size to a multiple of "
        f"{math.lcm(*per_step)} (micro_batch_size x data-parallel processes of both) so that every cluster trains "
        "alike"
    ]


def _in_training_plan(request: ExecutionInput, groups: list[InstanceGroup], limits: PlatformLimits) -> bool:
    """Whether the job runs in the stage's training plan: one group on the plan's type, on demand, on a backend
    whose jobs take plans, one job (tuning jobs' trials do not)."""
    return (
        len(groups) == 1
        and groups[0].instance_type == limits.training_plan_instance_type
        and not request.spot
        and request.tuning is None
        and request.backend in training_plan_backends()
    )


def _instance_type(name: str, field: str, limits: PlatformLimits, problems: list[str]) -> InstanceType | None:
    instance = INSTANCE_TYPES.get(name)
    if instance is None:
        problems.append(f"{field} {name!r} is not a known training type; {suggestion(name)}")
        return None
    if instance.name not in limits.allowed_instance_types:
        problems.append(
            f"instance_type {instance.name!r} is not allowed on this platform; use one of "
            f"{', '.join(limits.allowed_instance_types)} (settings: pipeline.allowed_instance_types)"
        )
    return instance


def _check_capacity(groups: list[InstanceGroup], limits: PlatformLimits, problems: list[str]) -> None:
    """The whole cluster's interfaces must fit in the training subnet, every group's together."""
    needs = {g.name: INSTANCE_TYPES[g.instance_type].private_ips_needed for g in groups}
    if len(groups) == 1:
        (group,) = groups
        capacity = limits.training_subnet_ips // needs[group.name]
        if group.instance_count > capacity:
            problems.append(
                f"instance_count {group.instance_count} exceeds what the training subnet holds for "
                f"{group.instance_type} ({capacity}, at {needs[group.name]} private IPs each)"
            )
        return
    total = sum(g.instance_count * needs[g.name] for g in groups)
    if total > limits.training_subnet_ips:
        parts = ", ".join(f"{g.name}: {g.instance_count} x {needs[g.name]}" for g in groups)
        problems.append(
            f"instance_groups need {total} private IPs ({parts}); the training subnet holds "
            f"{limits.training_subnet_ips}: make the groups smaller"
        )


def _check_schedule(request: ExecutionInput, limits: PlatformLimits, problems: list[str]) -> dict[str, int]:
    if request.max_runtime_hours > limits.max_runtime_hours:
        problems.append(
            f"max_runtime_hours {request.max_runtime_hours} exceeds the platform limit of {limits.max_runtime_hours}"
        )
    runtime = math.ceil(request.max_runtime_hours * 3600)
    stopping = {"MaxRuntimeInSeconds": runtime}
    if request.spot:
        if not request.checkpoints:
            problems.append("spot needs checkpoints: an interrupted spot job resumes only from a checkpoint")
        wait_hours = request.max_wait_hours if request.max_wait_hours is not None else 2 * request.max_runtime_hours
        wait = math.ceil(wait_hours * 3600)
        if wait_hours > 2 * limits.max_runtime_hours:
            problems.append(
                f"max_wait_hours {wait_hours} exceeds the platform limit of {2 * limits.max_runtime_hours}"
                " (twice the longest runtime)"
            )
        if wait <= runtime:
            problems.append(
                f"max_wait_hours {wait_hours} must be greater than max_runtime_hours {request.max_runtime_hours}:"
                " it bounds waiting for spot capacity plus the training time"
            )
        stopping["MaxWaitTimeInSeconds"] = wait
        if request.warm_pool_minutes:
            problems.append("warm_pool_minutes needs on-demand instances: SageMaker warm pools do not support spot")
    elif request.max_wait_hours is not None:
        problems.append("max_wait_hours applies to spot runs only; set spot to true or drop max_wait_hours")
    return stopping


def _check_straggler_replacement(
    hyperparameters: Mapping[str, str], groups: list[InstanceGroup], problems: list[str]
) -> None:
    """`stragglers.action=replace` needs training groups of one instance type: the slower type's hosts would lag
    the others on every attempt, and each attempt would replace them until the retries ran out."""
    types = sorted({group.instance_type for group in groups if group.role == TRAIN_ROLE})
    if len(types) < 2:
        return
    try:
        action = from_hyperparameters(hyperparameters).stragglers.action
    except ConfigError:
        return  # the trainer's refusal is reported already
    if action == "replace":
        problems.append(
            f"hyperparameters.stragglers.action: 'replace' needs the training groups on one instance type, not "
            f"{', '.join(types)} (the slower type would be replaced on every attempt); use 'warn' or one type"
        )


def _hyperparameters(request: ExecutionInput, processes: Processes, problems: list[str]) -> dict[str, str]:
    """The job's hyperparameters: the trainer's, judged by its rules; or a run's own script's, beside the code's
    description and the launcher's settings (contract/user_code.py), which alone the platform's rules judge."""
    script = request.code
    top_level = TOP_LEVEL_HYPERPARAMETERS if script is None else SCRIPT_TOP_LEVEL
    values: dict[str, str] = {}
    for key, value in request.hyperparameters.items():
        if key in top_level:
            problems.append(f"hyperparameters.{key}: set `{top_level[key]}` at the top level instead")
            continue
        if script is not None and key.startswith(user_code.CODE_PREFIX):
            problems.append(
                f"hyperparameters.{key}: `{user_code.CODE_PREFIX}` keys describe your code; set it in `code`"
            )
            continue
        text = (str(value).lower() if isinstance(value, bool) else str(value)).strip()
        if len(key) > HYPERPARAMETER_KEY_LIMIT or len(text) > HYPERPARAMETER_VALUE_LIMIT:
            problems.append(
                f"hyperparameters.{key}: keys take at most {HYPERPARAMETER_KEY_LIMIT} characters and values "
                f"{HYPERPARAMETER_VALUE_LIMIT}"
            )
            continue
        values[key] = text
    if script is not None:
        values |= {"distribution": request.distribution, **own_code.hyperparameters(script)}
        refusal = trainer_refusal(launcher_settings(values, own_code=True), Processes(total=0, per_host=1))
        if refusal is not None:
            problems.append(f"hyperparameters: {refusal}")
        return values
    if not request.checkpoints:
        values.setdefault("checkpoint.interval_steps", "0")
        values.setdefault("checkpoint.interval_minutes", "0")
    if request.model is not None:
        values["model"] = request.model
    if request.init_from is not None:
        values["model.init_from"] = mf.BASE_MODEL_CHANNEL
        if request.model is not None:
            problems.append("model: init_from's config.json sets the architecture and sizes; drop model")
    values["distribution"] = request.distribution
    # The trainer's own checks, before any instance starts: each problem under the input's key that set it.
    problems.extend(_under_its_field(p) for p in trainer_problems(values, processes))
    return values


def _under_its_field(problem: ConfigProblem) -> str:
    """A trainer's problem under the input's field that set its key: `model` and `distribution` are set at the top
    level (`hyperparameters` refuses them), the rest in `hyperparameters`."""
    if problem.key in ("model", "distribution"):
        return f"{problem.key}: {problem.message.removeprefix('hyperparameter ')}"
    return f"hyperparameters{'.' + problem.key if problem.key else ''}: {problem.message}"


def _check_quality(request: ExecutionInput, problems: list[str]) -> Quality | None:
    gate = request.quality
    if gate is None:
        return None
    if gate.metric not in MODEL_METRIC_NAMES:
        names = ", ".join(MODEL_METRIC_NAMES)
        problems.append(f"quality.metric {gate.metric!r} is not reported by the trainer; use one of {names}")
    if (gate.max is None) == (gate.min is None):
        problems.append("quality needs exactly one of `max` (lower is better) or `min` (higher is better)")
        return None
    return Quality(metric=gate.metric, max=gate.max, min=gate.min)


def _check_notify(request: ExecutionInput, limits: PlatformLimits, team: Team | None, problems: list[str]) -> None:
    """`notify` names subscribers of run notifications: notifications.run_emails, or the run's team's e-mails."""
    unknown = sorted(set(request.notify) - set(limits.run_emails) - set(team.notification_emails if team else ()))
    if unknown:
        problems.append(
            f"notify: {unknown} are not subscribed to run notifications; ask the platform team to add them"
            " to notifications.run_emails"
        )


def _check_queue_wait(request: ExecutionInput, limits: PlatformLimits, problems: list[str]) -> None:
    """`max_queue_wait_minutes`: a queued run's, within the platform's."""
    wait = request.max_queue_wait_minutes
    if wait is None:
        return
    if request.backend != QUEUE:
        problems.append(f'max_queue_wait_minutes applies to backend "{QUEUE}" only; drop it')
    elif wait > limits.max_queue_wait_minutes:
        problems.append(
            f"max_queue_wait_minutes {wait} exceeds the platform's {limits.max_queue_wait_minutes} "
            "(service_environment.max_queue_wait_minutes); ask for at most that"
        )


def run_identity(execution: str, started: str) -> str:
    """The run's identity (RUN_ID_HEX hex digits) from its execution ARN and start time ($$.Execution.StartTime)."""
    return hashlib.sha256(f"{execution}\n{started}".encode()).hexdigest()[:RUN_ID_HEX]


def start_time(epoch_ms: int) -> str:
    """An execution's start as $$.Execution.StartTime writes it (`2026-11-23T21:00:00.000Z`), from the epoch
    milliseconds its EventBridge events give (`startDate`)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Checked:
    """What the checks made of a parsed input: the pieces the request is assembled from (None: refused)."""

    groups: list[InstanceGroup] | None
    stopping: dict[str, int]
    hyperparameters: dict[str, str]
    fallback: list[InstanceGroup]
    quality: Quality | None
    channels: list[dict[str, Any]]
    dataset: Dataset | None
    team: Team | None
    suffix: str
    tuning: Tuning | None
    code: Code | None
    base_model: BaseModelSource | None = None


def resolve(
    event: Any,
    *,
    limits: PlatformLimits,
    execution_name: str = "",
    requested_by: str | None = None,
    requester_tag: str | None = None,
    check_membership: bool = True,
    execution: str | None = None,
    started: str = "",
    continues: PreviousRun | None = None,
    folder_at: FolderAt | None = None,
    packed_code: own_code.PackedCode | None = None,
) -> dict[str, Any]:
    """Validate the execution input and return the complete request (JSON), or raise InvalidRequest.

    The one entry for Validate and offline callers (`resolve(input_dict, limits=limits)`): the schema's
    and every other problem in one InvalidRequest. `continues` is the run `resume_from` names, as
    resume.find found it. `requester_tag` is the requester's `platform-team` tag as IAM proved it
    (teams.tag_to_prove); `check_membership` False leaves who starts a team's run unjudged, for offline checks that
    know no requester. `folder_at` reads the folder at an s3:// prefix: with it, a fine-tuning run's model folder and
    the dataset's first records are read and judged too (Validate's S3; offline callers may pass none, or a local
    copy). `packed_code` is what was found of the archive `code.source` names (None: not looked at).
    """
    request, schema, rejected, alternatives = _parse(event, limits)
    problems: list[str] = []
    # Stable for one execution (Lambda retries resolve the same names), unique across executions for ever.
    suffix = run_identity(execution or execution_name, started)
    checked = _check(
        request,
        alternatives,
        limits=limits,
        suffix=suffix,
        requested_by=requested_by,
        requester_tag=requester_tag,
        check_membership=check_membership,
        continues=continues,
        folder_at=folder_at,
        packed_code=packed_code,
        problems=problems,
    )
    if problems or schema or checked.groups is None or checked.dataset is None:
        raise _rejection(event, schema, [p for p in problems if not _depends_on(p, rejected)])
    resolved = _assemble(
        request, checked, limits=limits, execution=execution, requested_by=requested_by, continues=continues
    )
    # What the state machine will send for it, as the services check it, before anything is estimated or approved;
    # on each fallback cluster too.
    refused = request_problems(resolved, attempts=limits.capacity_retries + 1)
    for index in range(len(checked.fallback)):
        found = request_problems(resolved.on_fallback(index), attempts=limits.capacity_retries + 1)
        refused += [_on_fallback(index, p) for p in found if p not in refused]
    if refused:
        raise _rejection(event, [], refused)
    return resolved.model_dump(mode="json")


def _on_fallback(index: int, problem: str) -> str:
    """A problem of the request on fallback cluster `index`: of the alternative's own field where it names one."""
    if problem.startswith(("instance_type", "instance_count")):
        return f"fallback[{index}].{problem}"
    return f"fallback[{index}]: {problem}"


def _check(
    request: ExecutionInput,
    alternatives: list[FallbackInput | None],
    *,
    limits: PlatformLimits,
    suffix: str,
    requested_by: str | None,
    requester_tag: str | None,
    check_membership: bool,
    continues: PreviousRun | None,
    folder_at: FolderAt | None,
    packed_code: own_code.PackedCode | None,
    problems: list[str],
) -> _Checked:
    """Every check of the parsed input, each problem appended to `problems` with its fix."""
    if not RUN_NAME.match(request.run_name):
        problems.append(
            f"run_name {request.run_name!r}: use 3-40 lowercase letters, digits and '-', starting and ending"
            " with a letter or digit"
        )
    groups = _check_cluster(request, limits, problems)
    stopping = _check_schedule(request, limits, problems)
    code = _check_code(request, packed_code, limits, problems)
    hyperparameters = _hyperparameters(request, training_processes(groups or []), problems)
    launcher = launcher_settings(hyperparameters, own_code=request.code is not None)
    _check_straggler_replacement(launcher, groups or [], problems)
    fallback, fallback_clusters = _check_fallback(
        request, alternatives, groups=groups, hyperparameters=hyperparameters, limits=limits, problems=problems
    )
    quality = _check_quality(request, problems)
    clusters = {"": groups or [], **fallback_clusters}
    prefixes, channels, dataset, base_model = _check_data(
        request, clusters, hyperparameters, limits=limits, folder_at=folder_at, problems=problems
    )
    if request.backend not in limits.backends:
        problems.append(f"backend {request.backend!r}: this platform deploys {', '.join(limits.backends)}")
    else:
        problems.extend(limits.problems(request.backend, request))
    team = named_team(request.team, limits.teams)
    _check_notify(request, limits, team, problems)
    _check_queue_wait(request, limits, problems)
    types = {group.instance_type for group in groups or []}
    problems.extend(
        request_team_problems(
            request,
            teams=limits.teams,
            service_capacity=limits.service_capacity,
            datasets=prefixes,
            instance_type=next(iter(types)) if len(types) == 1 else None,
            instance_count=sum(group.instance_count for group in groups or []),
            requested_by=requested_by,
            requester_tag=requester_tag,
            check_membership=check_membership,
            resumes_team=continues.request.team if continues is not None else None,
        )
    )
    tuning = _check_tuning(request, groups, hyperparameters, suffix=suffix, problems=problems)
    if continues is not None and groups is not None:
        problems.extend(
            resume_check(
                continues,
                hyperparameters,
                groups,
                requested_by=requested_by,
                tuned=request.tuning is not None,
                own_code=request.code is not None,
            )
        )
    return _Checked(
        groups, stopping, hyperparameters, fallback, quality, channels, dataset, team, suffix, tuning, code, base_model
    )


def _check_data(
    request: ExecutionInput,
    clusters: dict[str, list[InstanceGroup]],
    hyperparameters: dict[str, str],
    *,
    limits: PlatformLimits,
    folder_at: FolderAt | None,
    problems: list[str],
) -> tuple[dict[str, str], list[dict[str, Any]], Dataset | None, BaseModelSource | None]:
    """The run's locations in their normal form, its channels, dataset and base model, and what its data and model
    need of the GPUs' memory: of the run's own cluster (under "" in `clusters`), and of its fallback clusters (under
    their keys) when the plan needs the model folder."""
    groups = clusters[""]
    # Every location once, in its normal form, before any check reads it (contract/layout.py).
    prefixes = dataset_prefixes(request, limits, problems)
    channels, dataset, base_model = _channels(request, prefixes, limits)
    own_code = request.code is not None  # a script's hyperparameters and data are its own
    if base_model is None and not own_code and (too_big := memory_problem(hyperparameters, groups)) is not None:
        problems.append(f"hyperparameters: {too_big}")
    if folder_at is not None and dataset is not None and not own_code:
        base_model = _check_fine_tuning(
            request,
            base_model,
            dataset,
            clusters=clusters,
            hyperparameters=hyperparameters,
            folder_at=folder_at,
            problems=problems,
        )
    if len(groups) > 1:
        channels = _channels_for_groups(channels, groups, problems)
    return prefixes, channels, dataset, base_model


def _check_code(
    request: ExecutionInput, packed: own_code.PackedCode | None, limits: PlatformLimits, problems: list[str]
) -> Code | None:
    """The run's own code checked, archive and all (None: the built-in trainer runs, or the code was refused)."""
    if request.code is None:
        return None
    if request.model is not None:
        problems.append(
            "model: a preset of the platform's trainer, which a run of your own code does not run; drop it (your "
            "script builds its model: give it in `hyperparameters` or code.args)"
        )
    return own_code.check(
        request.code,
        packed,
        run_name=request.run_name,
        team=request.team,
        artifacts_bucket=limits.artifacts_bucket,
        python=limits.code_python,
        platform=limits.code_platform,
        problems=problems,
    )


def _check_tuning(
    request: ExecutionInput,
    groups: list[InstanceGroup] | None,
    hyperparameters: dict[str, str],
    *,
    suffix: str,
    problems: list[str],
) -> Tuning | None:
    """The resolved tuning job of a request that tunes (None: it does not, or its cluster was refused)."""
    tunes = tuning_backends()
    if request.tuning is not None and groups is not None and request.backend not in tunes:
        problems.append(f"tuning runs on the {' or '.join(tunes)} backend only, not {request.backend!r}")
    if groups is None:
        return None
    return resolve_tuning(
        request.tuning,
        run_name=request.run_name,
        suffix=suffix,
        fixed=hyperparameters,
        given=dict(request.hyperparameters),
        top_level=TOP_LEVEL_HYPERPARAMETERS if request.code is None else SCRIPT_TOP_LEVEL,
        groups=groups,
        warm_pool_minutes=request.warm_pool_minutes,
        problems=problems,
        own_code=request.code is not None,
    )


def _assemble(
    request: ExecutionInput,
    checked: _Checked,
    *,
    limits: PlatformLimits,
    execution: str | None,
    requested_by: str | None,
    continues: PreviousRun | None,
) -> TrainingRequest:
    """The complete request from an input every check passed."""
    assert checked.groups is not None and checked.dataset is not None
    resume_source = None
    if continues is not None:
        before = continues.request.resume_from
        resume_source = ResumeSource(
            execution=continues.execution,
            run=continues.request.job_name_base,
            earlier=[before.execution, *before.earlier] if before else [],
        )
    tags = {
        **limits.tags,
        "run": request.run_name,
        **({EXECUTION_TAG: execution} if execution else {}),
        **({TEAM_TAG: request.team} if request.team else {}),  # cost allocation: the team's budget filters on it
    }
    job_name_base = f"{request.run_name}-{checked.suffix}"
    code_channel = [own_code.channel(checked.code.uri)] if checked.code is not None else []
    return TrainingRequest(
        run_name=request.run_name,
        job_name_base=job_name_base,
        instance_groups=checked.groups,
        volume_size_gb=limits.volume_size_gb,
        backend=request.backend,
        distribution=request.distribution,
        spot=request.spot,
        stopping_condition=checked.stopping,
        # However long the run, the platform's interval: an execution that made its polls hands the run over.
        poll_seconds=limits.poll_interval_seconds,
        keep_alive_seconds=request.warm_pool_minutes * 60,
        hyperparameters=checked.hyperparameters,
        channels=[*checked.channels, ledger_channel(limits.artifacts_bucket, job_name_base), *code_channel],
        dataset=checked.dataset,
        base_model=checked.base_model,
        quality=checked.quality,
        notify=request.notify,
        recipients=recipients(request.notify, checked.team) or ["(none)"],  # SNS rejects an empty String.Array
        requested_by=requested_by,
        tags=[Tag(Key=k, Value=v) for k, v in tags.items()],
        tuning=checked.tuning,
        resume_from=resume_source,
        fallback=checked.fallback,
        team=request.team,
        priority=request.priority,
        code=checked.code,
        max_queue_wait_seconds=60 * (request.max_queue_wait_minutes or limits.max_queue_wait_minutes)
        if request.backend == QUEUE
        else None,
    )


def _parse(
    event: Any, limits: PlatformLimits
) -> tuple[ExecutionInput, list[Problem], set[str], list[FallbackInput | None]]:
    """The input as the model reads it, the schema's problems, the top-level keys they reject, and the input's
    `fallback` clusters (None where the schema refused one).

    A rejected key is left out (a required one given a stand-in) so that the other checks still run;
    their problems that name a rejected key are dropped (`_depends_on`). A refused `fallback` item is left
    out alone, so that the checks still judge the others.
    """
    if not isinstance(event, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(event), "a number")
        raise InvalidRequest.listing(
            [
                Problem(
                    "",
                    event,
                    "the execution input must be a JSON object of the keys in docs/reference/run-input.md"
                    f' (e.g. {{"run_name": "...", "dataset": "...", ...}}), not {kind}',
                )
            ]
        )
    try:
        request = ExecutionInput.model_validate(event)
        return request, [], set(), list(request.fallback or [])
    except ValidationError as exc:
        schema = _problems_from(exc)
        errors = [err["loc"] for err in exc.errors() if err["loc"]]
    in_items = [loc for loc in errors if loc[0] == "fallback" and len(loc) > 1 and isinstance(loc[1], int)]
    refused_items = {loc[1] for loc in in_items}
    rejected = {str(loc[0]) for loc in errors if loc not in in_items}
    stand_ins: dict[str, Any] = {
        "run_name": "rejected",
        "dataset": f"s3://{limits.datasets_bucket}/rejected/",
        "max_runtime_hours": min(1.0, limits.max_runtime_hours),
    }
    kept = {k: v for k, v in event.items() if k not in rejected}
    listed = kept.get("fallback")
    if refused_items and isinstance(listed, list):
        kept["fallback"] = [item for index, item in enumerate(listed) if index not in refused_items]
    try:
        request = ExecutionInput.model_validate({**{k: stand_ins[k] for k in stand_ins if k not in kept}, **kept})
    except ValidationError:  # not expected: every rejected key is gone; report the schema's problems alone
        raise InvalidRequest.listing(schema) from None
    accepted = iter(request.fallback or [])
    if not isinstance(listed, list):
        return request, schema, rejected, list(accepted)
    return request, schema, rejected, [None if i in refused_items else next(accepted) for i in range(len(listed))]


def _depends_on(problem: str, rejected: set[str]) -> bool:
    """Whether a check's problem names a key the schema rejected (it judged a default or a stand-in)."""
    return any(re.search(rf"\b{re.escape(key)}\b", problem) for key in rejected)


def _rejection(event: Any, schema: list[Problem], problems: list[str]) -> InvalidRequest:
    """One InvalidRequest of the schema's problems and the checks' (each check's text read as field: message)."""
    return InvalidRequest.listing([*schema, *(_structured(p, event) for p in problems)])


_LEADING_FIELD = re.compile(r"^([A-Za-z_]\w*(?:\.[\w-]+|\[[^\]]+\])*)(?::\s*|\s+)(.*)$", re.DOTALL)


def _structured(text: str, event: dict[str, Any]) -> Problem:
    """A check's problem as (field, value, message): the checks begin their text with the input key they judge."""
    match = _LEADING_FIELD.match(text)
    if match is None or re.split(r"[.\[]", match[1])[0] not in ExecutionInput.model_fields:
        return Problem("", None, text)
    return Problem(match[1], _value_at(event, [part for part in re.split(r"\.|\[|\]\.?", match[1]) if part]), text)


def _value_at(value: Any, parts: list[str]) -> Any:
    """The input's value at a field's parts; a key may hold dots itself (`hyperparameters.train.seed`,
    `tuning.ranges.model.factory`): the longest key that matches is taken. None where the input has none."""
    if not parts:
        return value
    if isinstance(value, list) and parts[0].isdigit() and int(parts[0]) < len(value):
        return _value_at(value[int(parts[0])], parts[1:])
    if isinstance(value, dict):
        for end in range(len(parts), 0, -1):
            key = ".".join(parts[:end])
            if key in value:
                return _value_at(value[key], parts[end:])
    return None


def _channels(
    request: ExecutionInput, prefixes: Mapping[str, str], limits: PlatformLimits
) -> tuple[list[dict[str, Any]], Dataset | None, BaseModelSource | None]:
    """The InputDataConfig channels of the locations' normal prefixes, and the training dataset and base model as
    lineage records them."""
    channels = []
    for channel, field in _DATASET_FIELDS.items():
        uri = getattr(request, field)
        if field in prefixes:
            channels.append(_dataset_channel(channel, prefixes[field], limits, fsx=uri.startswith(FSX_SCHEME)))
    read = {field: f"s3://{limits.datasets_bucket}/{prefix}" for field, prefix in prefixes.items()}
    dataset = Dataset(uri=request.dataset, s3_uri=read["dataset"]) if "dataset" in read else None
    base_model = None
    if request.init_from is not None and "init_from" in read:
        base_model = BaseModelSource(uri=request.init_from, s3_uri=read["init_from"])
    return channels, dataset, base_model


def _check_fine_tuning(
    request: ExecutionInput,
    base_model: BaseModelSource | None,
    dataset: Dataset,
    *,
    clusters: dict[str, list[InstanceGroup]],
    hyperparameters: dict[str, str],
    folder_at: FolderAt,
    problems: list[str],
) -> BaseModelSource | None:
    """The model folder and the dataset's records read and judged as the trainer judges them, and the run's memory
    plan against the GPUs of each of `clusters` (its own, under "", and its fallback clusters); the base model with
    what was read of it."""
    records = jsonl_files(folder_at(dataset.s3_uri))
    problems.extend(f"dataset: {problem}" for problem in check_records(folder_at(dataset.s3_uri), records))
    if records and base_model is None:
        problems.append(
            f"dataset: {records[0]} holds fine-tuning records, which are tokenized with a model folder's tokenizer;"
            " give init_from"
        )
    if base_model is None:
        return None
    facts = inspect_model_folder(folder_at(base_model.s3_uri))
    problems.extend(f"init_from {base_model.uri!r}: {problem}" for problem in facts.problems)
    if facts.args is None or facts.problems:
        return base_model
    try:
        config = from_hyperparameters(hyperparameters)
    except ConfigError:
        return base_model  # the trainer's refusal is reported already
    problems.extend(
        f"hyperparameters: {problem} (init_from's config.json)" for problem in config.split_problems(facts.args)
    )
    if records and (pipelined := packed_rows_problem(config.parallel.pp)) is not None:
        problems.append(f"hyperparameters: {pipelined} ({records[0]} holds fine-tuning records)")
    if config.seq_len > facts.args.max_seq_len:
        problems.append(
            f"hyperparameters.seq_len: {config.seq_len} tokens is over the model's limit of {facts.args.max_seq_len}"
            " (init_from's config.json); use at most that"
        )
    parameters = mf.parameter_count(facts.args)
    trained = parameters
    if config.lora.rank:
        try:
            trained = mf.lora_parameters(facts.args, config.lora.target_modules, config.lora.rank)
        except ValueError as exc:
            problems.append(f"hyperparameters.{exc}")
    source = base_model.model_copy(
        update={
            "architecture": facts.architecture,
            "parameters": parameters,
            "trained_parameters": trained,
            "shape": facts.args,
        }
    )
    adapters = trained if config.lora.rank else None
    for where, cluster in clusters.items():
        too_big = memory_problem(hyperparameters, cluster, args=facts.args, trained=adapters)
        if too_big is not None:
            on = f"{where}: " if where else ""
            problems.append(f"{on}hyperparameters: fine-tuning {parameters / 1e9:.2f}B parameters: {too_big}")
    return source


def _channels_for_groups(
    channels: list[dict[str, Any]], groups: list[InstanceGroup], problems: list[str]
) -> list[dict[str, Any]]:
    """Each channel limited to the groups that take it (S3DataSource.InstanceGroupNames)."""
    names = [channel["ChannelName"] for channel in channels]
    for group in groups:
        taken = names if group.channels is None else group.channels
        for channel in taken:
            if channel not in names:
                problems.append(
                    f"instance_groups[{group.name}]: channel {channel!r} is not in this run (it has {', '.join(names)})"
                )
        if group.role == TRAIN_ROLE and (missing := [n for n in names if n not in taken]):
            problems.append(
                f"instance_groups[{group.name}]: a group that trains reads every channel; add {', '.join(missing)}"
            )
    limited = []
    for channel in channels:
        name = channel["ChannelName"]
        receivers = [g.name for g in groups if g.channels is None or name in g.channels]
        if len(receivers) == len(groups):
            limited.append(channel)
            continue
        source = channel["DataSource"]
        if "S3DataSource" not in source:
            problems.append(
                f"channel {name!r} reads FSx, which every host of the job mounts: only s3:// datasets can be limited"
                " to some instance groups (give every group this channel, or use an s3:// dataset)"
            )
            continue
        s3_source = {**source["S3DataSource"], "InstanceGroupNames": receivers}
        limited.append({**channel, "DataSource": {"S3DataSource": s3_source}})
    return limited

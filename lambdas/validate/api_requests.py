"""The requests the state machine sends for a resolved request, checked against the services' own definitions
before anything is estimated or approved.

Each request is defined once (contract/service_requests.py); the stacks render its Step Functions form, Validate
its values for the request at its last attempt. The deployment's constants (role, image, network, keys, buckets,
queues) are not Validate's to know: it builds the requests with `PLACEHOLDERS`, of the forms the stacks give and,
where a length adds up, the longest (S3 bucket names of 63 characters).

`refusals` checks a built request with botocore's validator (types, required members, minimums) and then with
what botocore's model holds but does not check (maximum lengths and counts, patterns), and `LIMITS`: the
services' documented limits that their models do not encode, each with its source. `request_problems` names, for
each, the input field the refused member comes from (`_FROM_INPUT`) and the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from botocore.model import Shape
from botocore.validate import ParamValidator

from contract.execution_state import TrainingRequest
from contract.service_requests import (
    TEAM_TAG,
    BatchJobConstants,
    RunState,
    ServiceJobConstants,
    ServiceRequest,
    TrainingJobConstants,
    create_training_job,
    create_tuning_job,
    submit_job,
    submit_service_job,
)
from lambdas.backends.batch import BATCH
from lambdas.backends.queue import QUEUE
from lambdas.validate.service_models import model_limit, service_model


@dataclass(frozen=True)
class Deployment:
    """The constants of the state machine's requests: what the stacks, not the request, decide."""

    training: TrainingJobConstants
    batch: BatchJobConstants
    queue: ServiceJobConstants
    execution: str
    """$$.Execution.Id, which the jobs' execution tag carries."""


class Sent(NamedTuple):
    """One SDK call: its service, operation and parameters."""

    service: str
    operation: str
    params: dict[str, Any]


_ACCOUNT = "arn:aws:{}:us-east-1:123456789012:{}"
_CHECKPOINTS, _ARTIFACTS = "c" * 63, "a" * 63
PLACEHOLDERS = Deployment(
    training=TrainingJobConstants(
        role_arn="arn:aws:iam::123456789012:role/training-platform-pipeline-TrainingStepJobExecutionRole",
        training_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/training-platform:0123456789abcdef",
        key_arn=_ACCOUNT.format("kms", "key/01234567-89ab-cdef-0123-456789abcdef"),
        subnet="subnet-0123456789abcdef0",
        security_group="sg-0123456789abcdef0",
        checkpoints_bucket=_CHECKPOINTS,
        artifacts_bucket=_ARTIFACTS,
        inter_container_encryption=True,
        network_isolation=False,
        training_plan_arn=_ACCOUNT.format("sagemaker", "training-plan/" + "t" * 63),
    ),
    batch=BatchJobConstants(
        job_queue=_ACCOUNT.format("batch", "job-queue/training-platform"),
        job_definition=_ACCOUNT.format("batch", "job-definition/training-platform:1"),
        checkpoints_bucket=_CHECKPOINTS,
        artifacts_bucket=_ARTIFACTS,
    ),
    queue=ServiceJobConstants(
        team_queue=_ACCOUNT.format("batch", "job-queue/TeamsQueue-0123456789ab"), preemption_retries=20
    ),
    execution=_ACCOUNT.format("states", "execution:" + "p" * 80 + ":" + "e" * 80),
)


def sent(request: TrainingRequest, attempt: int, deployment: Deployment = PLACEHOLDERS) -> list[Sent]:
    """What the state machine sends to start this attempt of the request, as the SDK calls receive it."""
    state = RunState(request, attempt, deployment.execution)
    call: ServiceRequest
    if request.tuning is not None:
        call = create_tuning_job(deployment.training)
    elif request.backend == BATCH.name:
        call = submit_job(deployment.batch)
    elif request.backend == QUEUE and request.team is not None:
        call = submit_service_job(deployment.queue, deployment.training)
        params = call.values(state)
        # The payload as SageMaker will take it, and the submission as Batch does.
        payload = json.loads(params["serviceRequestPayload"])
        return [Sent("sagemaker", "CreateTrainingJob", payload), Sent(call.service, call.operation, params)]
    else:
        call = create_training_job(deployment.training)
    return [Sent(call.service, call.operation, call.values(state))]


@dataclass(frozen=True)
class Limit:
    """A documented limit of a service that its botocore model does not encode."""

    service: str
    operation: str
    what: str
    source: str
    check: Callable[[dict[str, Any]], str | None]
    """What is wrong with the operation's parameters, or None."""
    member: str
    """The request's member it judges (`Refused.member`)."""


def _total_ranges(params: dict[str, Any]) -> str | None:
    ranges = params["HyperParameterTuningJobConfig"].get("ParameterRanges", {})
    names = [r["Name"] for kind in ranges.values() for r in kind]
    if len(names) > TUNING_RANGES:
        return f"{len(names)} ranges ({', '.join(names)}); SageMaker tunes at most {TUNING_RANGES} at once"
    return None


def _batch_job_name(params: dict[str, Any]) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", params["jobName"]):
        return f"jobName {params['jobName']!r}: up to 128 letters, digits, '-' and '_', starting with a letter or digit"
    return None


def _batch_payload(params: dict[str, Any]) -> str | None:
    size = len(json.dumps(params).encode())
    if size > BATCH_PAYLOAD_BYTES:
        return (
            f"the job's request is {size} bytes (its environment carries the hyperparameters and channels); "
            f"AWS Batch takes at most {BATCH_PAYLOAD_BYTES}: shorten the hyperparameters"
        )
    return None


# "the sum of the number of hyperparameters for all the ranges can't exceed the maximum number specified" for
# each kind of range (API_ParameterRanges): the model's bound on one list bounds all of them together.
TUNING_RANGES = model_limit("sagemaker", "ContinuousParameterRanges")
BATCH_PAYLOAD_BYTES = 30 * 1024
LIMITS: tuple[Limit, ...] = (
    Limit(
        "sagemaker",
        "CreateHyperParameterTuningJob",
        f"at most {TUNING_RANGES} ranges across ParameterRanges' lists together",
        "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ParameterRanges.html",
        _total_ranges,
        "HyperParameterTuningJobConfig.ParameterRanges",
    ),
    Limit(
        "batch",
        "SubmitJob",
        "jobName: up to 128 letters, numbers, hyphens and underscores, the first alphanumeric",
        "https://docs.aws.amazon.com/batch/latest/APIReference/API_SubmitJob.html",
        _batch_job_name,
        "jobName",
    ),
    Limit(
        "batch",
        "SubmitJob",
        f"a job's payload of at most {BATCH_PAYLOAD_BYTES // 1024} KiB",
        "https://docs.aws.amazon.com/batch/latest/userguide/service_limits.html",
        _batch_payload,
        "nodeOverrides",
    ),
)


# The Java character classes the models' patterns use, in Python's `re` (inside a character class): \w is Unicode's
# letters and numbers (and `_`), the rest is Unicode's separators (Zs, Zl, Zp).
_JAVA_CLASSES = {
    r"\p{L}\p{Z}\p{N}": "\\w \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000",
    r"\p{Alnum}": "a-zA-Z0-9",
}


@cache
def python_pattern(java: str) -> re.Pattern[str]:
    """A model's (Java) pattern as a Python one; ValueError for a construct not translated here."""
    pattern = java
    for construct, python in _JAVA_CLASSES.items():
        pattern = pattern.replace(construct, python)
    if "\\p{" in pattern:
        raise ValueError(f"pattern {java!r} uses a Java character class not translated for Python")
    return re.compile(pattern)


@cache
def _input_shape(service: str, operation: str) -> Shape:
    return service_model(service).operation_model(operation).input_shape


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}")


_ITEM_NAMES = ("Name", "Key", "ChannelName", "InstanceGroupName")
"""The members that name a list's item: a path says `Tags[run]`, `InputDataConfig[train]`, not an index."""


def _item(item: Any, index: int) -> str:
    named = next((item[key] for key in _ITEM_NAMES if key in item), None) if isinstance(item, dict) else None
    return str(index if named is None else named)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unchecked(shape: Shape, value: Any, path: str) -> Iterator[tuple[str, str]]:
    """What the model holds and botocore's validator does not check, maximums and patterns: (member, problem)."""
    meta = shape.metadata
    size = len(value) if isinstance(value, (str, list, dict)) else None
    if size is not None and "max" in meta and size > meta["max"]:
        unit = "characters" if isinstance(value, str) else "entries"
        yield path, f"{_shown(value)} has {size} {unit}; at most {meta['max']}"
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and "max" in meta and value > meta["max"]:
        yield path, f"{value} is above the maximum {meta['max']}"
    if isinstance(value, str) and "pattern" in meta and not python_pattern(meta["pattern"]).fullmatch(value):
        yield path, f"{_shown(value)} does not match {meta['pattern']}"
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                yield from _unchecked(shape.members[name], member, _join(path, name))
    elif shape.type_name == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unchecked(shape.member, item, f"{path}[{_item(item, index)}]")
    elif shape.type_name == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from _unchecked(shape.key, key, f"{path} key")
            yield from _unchecked(shape.value, item, _join(path, key))


_INDEX = re.compile(r"\[(\d+)\]")


def _named(path: str, params: dict[str, Any]) -> str:
    """botocore's parameter path (items by index: `Tags[0]`) as `_unchecked` names members (`Tags[run]`)."""
    value: Any = params
    named: list[str] = []
    for part in re.split(r"(\.|\[\d+\])", path):
        if not part or part == ".":
            continue
        index = _INDEX.fullmatch(part)
        if index is None:
            named.append(f".{part}" if named else part)
            value = value.get(part) if isinstance(value, dict) else None
            continue
        position = int(index[1])
        item = value[position] if isinstance(value, list) and position < len(value) else None
        named.append(f"[{_item(item, position)}]")
        value = item
    return "".join(named)


@dataclass(frozen=True)
class Refused:
    """One reason a service would refuse a request: the operation, the member of its parameters (dotted, list
    items by name where they have one; "" for the request as a whole) and what is wrong."""

    operation: str
    member: str
    problem: str

    def __str__(self) -> str:
        return f"{self.operation}{'.' + self.member if self.member else ''}: {self.problem}"


def refusals(service: str, operation: str, params: dict[str, Any]) -> list[Refused]:
    """Why the service would refuse these parameters: botocore's validation, the model's maximums and patterns,
    and `LIMITS`."""
    shape = _input_shape(service, operation)
    report = ParamValidator().validate(params, shape)
    # botocore's report keeps each error's parameter path beside its text; the text alone would have to be parsed.
    found = [
        Refused(operation, _named(name, params), report._format_error((kind, name, details)))
        for kind, name, details in report._errors
    ]
    found += [Refused(operation, member, problem) for member, problem in _unchecked(shape, params, "")]
    for limit in LIMITS:
        if (limit.service, limit.operation) == (service, operation) and (problem := limit.check(params)):
            found.append(Refused(operation, limit.member, f"{problem} ({limit.source})"))
    return found


def api_problems(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """`refusals`, one line each, naming the operation and the member."""
    return [str(refused) for refused in refusals(service, operation, params)]


_DEFINITION = re.compile(r"^TrainingJobDefinition\.(Static)?")
"""A tuning job's training-job definition holds CreateTrainingJob's members (HyperParameters as
StaticHyperParameters): they come from the same input fields."""

# Which input field each member of the requests comes from, and how to change it: (member pattern, field, fix).
# The first pattern that matches the whole member (after _DEFINITION) decides; a member none matches comes from
# the platform's settings or the platform itself.
_FROM_INPUT: tuple[tuple[str, str, str], ...] = (
    (
        r"HyperParameterTuningJobConfig\.ParameterRanges\.\w+\[(?P<name>[^\]]+)\].*",
        "tuning.ranges.{name}",
        "shorten or drop what SageMaker refuses of this range",
    ),
    (
        r"HyperParameterTuningJobConfig\.ParameterRanges(\..*)?",
        "tuning.ranges",
        "tune fewer hyperparameters in one run (split the search over several runs)",
    ),
    (r"HyperParameterTuningJobConfig\.ResourceLimits\.MaxNumberOfTrainingJobs", "tuning.max_jobs", "lower it"),
    (r"HyperParameterTuningJobConfig\.ResourceLimits\.MaxParallelTrainingJobs", "tuning.max_parallel_jobs", "lower it"),
    (r"HyperParameterTuningJobConfig\.HyperParameterTuningJobObjective\..*", "tuning.objective", "change it"),
    (
        r"HyperParameterTuningJobConfig\.StrategyConfig\.HyperbandStrategyConfig\.(?P<bound>Min|Max)Resource",
        "tuning.hyperband",
        "change min_resource or max_resource",
    ),
    (r"HyperParameterTuningJobConfig\.Strategy.*", "tuning.strategy", "choose another strategy"),
    (r"HyperParameters\.(?P<key>.+)", "hyperparameters.{key}", "shorten or drop it"),
    (r"HyperParameters( key)?", "hyperparameters", "set fewer or shorter hyperparameters"),
    (r"TrainingJobName|HyperParameterTuningJobName|jobName|clientToken", "run_name", "use a shorter run_name"),
    (r"[Tt]ags\[run\].*", "run_name", "use a shorter run_name"),
    (rf"[Tt]ags\[{TEAM_TAG}\].*", "team", "ask the platform team about the team's name"),
    (r"InputDataConfig\[train\].*", "dataset", "use a shorter dataset location"),
    (r"InputDataConfig\[validation\].*", "validation_dataset", "use a shorter validation_dataset location"),
    (r"ResourceConfig\.InstanceType", "instance_type", "choose another instance type"),
    (r"ResourceConfig\.InstanceCount|nodeOverrides\.numNodes", "instance_count", "choose another instance_count"),
    (r"ResourceConfig\.InstanceGroups.*", "instance_groups", "change the instance groups"),
    (r"ResourceConfig\.KeepAlivePeriodInSeconds", "warm_pool_minutes", "lower it"),
    (r"StoppingCondition\.MaxRuntimeInSeconds|timeout\..*", "max_runtime_hours", "lower it"),
    (r"StoppingCondition\.MaxWaitTimeInSeconds", "max_wait_hours", "lower it"),
    (r"EnableManagedSpotTraining", "spot", "change it"),
    (
        r"nodeOverrides.*|serviceRequestPayload",
        "hyperparameters",
        "shorten the hyperparameters (the job's request carries them, beside the channels)",
    ),
    (r"schedulingPriority", "priority", "choose another priority"),
    (r"quotaShareName", "team", "ask the platform team about the team's name"),
)


def input_field(refused: Refused) -> tuple[str, str] | None:
    """(the input field a refused member comes from, how to change it); None for a member the input does not set."""
    member = _DEFINITION.sub("", refused.member)
    for pattern, field, fix in _FROM_INPUT:
        match = re.fullmatch(pattern, member)
        if match is not None:
            return field.format(**match.groupdict()), fix
    return None


def in_words(refused: Refused) -> str:
    """A refusal as Validate reports it: the input field it comes from first, what the service refuses and where in
    its request, then the fix."""
    found = input_field(refused)
    if found is None:
        return (
            f"the platform's settings make a request the service refuses ({refused}); ask the platform team to "
            "change them (e.g. settings `tags`)"
        )
    field, fix = found
    where = f"{refused.operation}.{refused.member}" if refused.member else refused.operation
    return f"{field}: {refused.problem}, in {where}; {fix}"


def request_problems(request: TrainingRequest, attempts: int, deployment: Deployment = PLACEHOLDERS) -> list[str]:
    """Why a request the state machine sends for this request would be refused, each naming the input field it
    comes from and what to change; checked at its last attempt, whose name is the longest."""
    found = [
        refused
        for call in sent(request, attempts, deployment)
        for refused in refusals(call.service, call.operation, call.params)
    ]
    return list(dict.fromkeys(in_words(refused) for refused in found))

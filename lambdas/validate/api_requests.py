"""The requests the state machine sends for a resolved request, checked against the services' own definitions
before anything is estimated or approved.

Each request is defined once (contract/service_requests.py); the stacks render its Step Functions form, Validate
its values for the request at its last attempt. The deployment's constants (role, image, network, keys, buckets,
queues) are not Validate's to know: it builds the requests with `PLACEHOLDERS`, of the forms the stacks give and,
where a length adds up, the longest (S3 bucket names of 63 characters).

`api_problems` checks a built request with botocore's validator (types, required members, minimums) and then with
what botocore's model holds but does not check (maximum lengths and counts, patterns), and `LIMITS`: the
services' documented limits that their models do not encode, each with its source.
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
    ),
    Limit(
        "batch",
        "SubmitJob",
        "jobName: up to 128 letters, numbers, hyphens and underscores, the first alphanumeric",
        "https://docs.aws.amazon.com/batch/latest/APIReference/API_SubmitJob.html",
        _batch_job_name,
    ),
    Limit(
        "batch",
        "SubmitJob",
        f"a job's payload of at most {BATCH_PAYLOAD_BYTES // 1024} KiB",
        "https://docs.aws.amazon.com/batch/latest/userguide/service_limits.html",
        _batch_payload,
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


def _unchecked(shape: Shape, value: Any, path: str) -> Iterator[str]:
    """What the model holds and botocore's validator does not check: maximums and patterns."""
    meta = shape.metadata
    size = len(value) if isinstance(value, (str, list, dict)) else None
    if size is not None and "max" in meta and size > meta["max"]:
        unit = "characters" if isinstance(value, str) else "entries"
        yield f"{path}: {_shown(value)} has {size} {unit}; at most {meta['max']}"
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and "max" in meta and value > meta["max"]:
        yield f"{path}: {value} is above the maximum {meta['max']}"
    if isinstance(value, str) and "pattern" in meta and not python_pattern(meta["pattern"]).fullmatch(value):
        yield f"{path}: {_shown(value)} does not match {meta['pattern']}"
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                yield from _unchecked(shape.members[name], member, f"{path}.{name}")
    elif shape.type_name == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            named = item.get("Name", item.get("Key")) if isinstance(item, dict) else None
            yield from _unchecked(shape.member, item, f"{path}[{index if named is None else named}]")
    elif shape.type_name == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from _unchecked(shape.key, key, f"{path} key")
            yield from _unchecked(shape.value, item, f"{path}.{key}")


def api_problems(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """Why the service would refuse these parameters: botocore's validation, the model's maximums and patterns,
    and `LIMITS`; each line names the operation and the field."""
    shape = _input_shape(service, operation)
    report = ParamValidator().validate(params, shape)
    problems = [f"{operation}: {line}" for line in report.generate_report().splitlines()] if report.has_errors() else []
    problems += list(_unchecked(shape, params, operation))
    for limit in LIMITS:
        if (limit.service, limit.operation) == (service, operation) and (problem := limit.check(params)):
            problems.append(f"{operation}: {problem} ({limit.source})")
    return problems


def request_problems(request: TrainingRequest, attempts: int, deployment: Deployment = PLACEHOLDERS) -> list[str]:
    """Why a request the state machine sends for this request would be refused, each with what to change; checked
    at its last attempt, whose name is the longest."""
    found = [
        problem
        for call in sent(request, attempts, deployment)
        for problem in api_problems(call.service, call.operation, call.params)
    ]
    return [f"{problem}; change the input so that the request fits" for problem in found]

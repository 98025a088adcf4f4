"""The requests the state machine sends for a resolved request, built here, and checked against the services' own
definitions before anything is estimated or approved.

The state machine builds CreateTrainingJob (stacks/pipeline/create_training_job.py), CreateHyperParameterTuningJob
(stacks/pipeline/tuning_step.py) and SubmitJob (stacks/pipeline/batch_step.py) from the request with intrinsic
functions; the functions here build the same parameters, as the SDK call receives them, in Python (a local-platform
test compares the two). The deployment's constants (role, image, network, keys, buckets, queue) are not Validate's
to know: it builds the requests with `PLACEHOLDERS`, of the forms the stacks give and, where a length adds up, the
longest (S3 bucket names of 63 characters).

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
from typing import Any

from botocore.model import Shape
from botocore.validate import ParamValidator

from contract.execution_state import TrainingRequest
from contract.layout import (
    CHANNELS_ENV,
    CHECKPOINTS_ENV,
    CHECKPOINTS_FORMAT,
    EFA_ENV,
    EXPECTED_GPUS_ENV,
    HYPERPARAMETERS_ENV,
    JOB_NAME_ENV,
    MIN_BUSBW_ENV,
    OUTPUT_ENV,
    OUTPUT_FORMAT,
    PROFILER,
    RUNS,
    TENSORBOARD_FORMAT,
    TRAINING_GROUPS_ENV,
)
from contract.metrics import METRIC_DEFINITIONS
from lambdas.backends.batch import BATCH
from lambdas.backends.queue import QUEUE
from lambdas.validate.service_models import model_limit, service_model

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
MAX_RETRY_ATTEMPTS = 2
"""CreateTrainingJob's RetryStrategy: SageMaker retries a job's internal failures this often."""
EXECUTION_TAG = "execution"
"""The tag that names the execution a job belongs to: what stops orphaned jobs looks for, and what a create step
checks before it adopts a job of its own name."""
TEAM_TAG = "platform-team"
"""The tag naming a team on its quota share, service jobs and training jobs, and its cost-allocation tag (activate
it once in Billing): each team's budget filters on it."""

# CreateTrainingJob fields a tuning job's definition does not take: the tuning job names and tags its
# trials, and SageMaker's profiler, TensorBoard and warm-pool settings are not part of the definition.
_NOT_IN_DEFINITION = ("TrainingJobName", "Tags", "ProfilerConfig", "TensorBoardOutputConfig")
_RENAMED = {"HyperParameters": "StaticHyperParameters"}
_ALGORITHM_KEYS = ("TrainingImage", "TrainingInputMode", "MetricDefinitions")
_RESOURCE_KEYS_DROPPED = ("KeepAlivePeriodInSeconds",)


@dataclass(frozen=True)
class Deployment:
    """The constants of the state machine's requests: what the stacks, not the request, decide."""

    role_arn: str
    training_image: str
    key_arn: str
    subnet: str
    security_group: str
    checkpoints_bucket: str
    artifacts_bucket: str
    inter_container_encryption: bool
    network_isolation: bool
    job_queue: str
    job_definition: str
    execution: str
    """$$.Execution.Id, which SubmitJob's execution tag carries."""
    training_plan_arn: str = ""
    """The stage's training plan (pipeline.training_plan), which a request on its type runs in."""
    team_queue: str = ""
    """The teams' SageMaker Training job queue (backend "queue")."""
    preemption_retries: int = 0
    """service_environment.preemption_retries: how often a team's job may be preempted before it fails."""


_ACCOUNT = "arn:aws:{}:us-east-1:123456789012:{}"
PLACEHOLDERS = Deployment(
    role_arn="arn:aws:iam::123456789012:role/training-platform-pipeline-TrainingStepJobExecutionRole",
    training_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/training-platform:0123456789abcdef",
    key_arn=_ACCOUNT.format("kms", "key/01234567-89ab-cdef-0123-456789abcdef"),
    subnet="subnet-0123456789abcdef0",
    security_group="sg-0123456789abcdef0",
    checkpoints_bucket="c" * 63,
    artifacts_bucket="a" * 63,
    inter_container_encryption=True,
    network_isolation=False,
    job_queue=_ACCOUNT.format("batch", "job-queue/training-platform"),
    job_definition=_ACCOUNT.format("batch", "job-definition/training-platform:1"),
    execution=_ACCOUNT.format("states", "execution:" + "p" * 80 + ":" + "e" * 80),
    training_plan_arn=_ACCOUNT.format("sagemaker", "training-plan/" + "t" * 63),
    team_queue=_ACCOUNT.format("batch", "job-queue/TeamsQueue-0123456789ab"),
    preemption_retries=20,
)


def _format(value: object) -> str:
    """A value as States.Format('{}', value) writes it."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def job_name(request: TrainingRequest, attempt: int) -> str:
    """An attempt's job name (stacks/pipeline/polled_job.py JOB_NAME)."""
    return f"{request.job_name_base}-{attempt}"


def create_training_job(request: TrainingRequest, attempt: int, deployment: Deployment) -> dict[str, Any]:
    """CreateTrainingJob's parameters for one attempt of the request."""
    if request.heterogeneous:
        cluster: dict[str, Any] = {"InstanceGroups": request.sagemaker_instance_groups}
    else:
        cluster = {"InstanceType": request.instance_type, "InstanceCount": request.instance_count}
    resource = {
        **cluster,
        "VolumeSizeInGB": request.volume_size_gb,
        "KeepAlivePeriodInSeconds": request.keep_alive_seconds,
        **({} if request.local_storage else {"VolumeKmsKeyId": deployment.key_arn}),
        **({"TrainingPlanArn": deployment.training_plan_arn} if request.training_plan else {}),
    }
    artifacts = f"s3://{deployment.artifacts_bucket}/"
    return {
        "TrainingJobName": job_name(request, attempt),
        "RoleArn": deployment.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": deployment.training_image,
            "TrainingInputMode": "File",
            "MetricDefinitions": METRIC_DEFINITIONS,
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "HyperParameters": request.hyperparameters,
        "Environment": {
            "PYTHONUNBUFFERED": "1",
            "NCCL_DEBUG": "WARN",
            EFA_ENV: _format(request.efa),
            EXPECTED_GPUS_ENV: _format(request.gpus),
            MIN_BUSBW_ENV: _format(request.allreduce_floor_gbps),
            TRAINING_GROUPS_ENV: request.training_groups,
        },
        "InputDataConfig": request.channels,
        "OutputDataConfig": {"S3OutputPath": f"{artifacts}{RUNS}", "KmsKeyId": deployment.key_arn},
        "ResourceConfig": resource,
        "StoppingCondition": request.stopping_condition,
        "EnableManagedSpotTraining": request.spot,
        "CheckpointConfig": {
            "S3Uri": f"s3://{deployment.checkpoints_bucket}/{CHECKPOINTS_FORMAT.format(request.job_name_base)}",
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        },
        "VpcConfig": {"Subnets": [deployment.subnet], "SecurityGroupIds": [deployment.security_group]},
        "EnableInterContainerTrafficEncryption": deployment.inter_container_encryption,
        "EnableNetworkIsolation": deployment.network_isolation,
        "RetryStrategy": {"MaximumRetryAttempts": MAX_RETRY_ATTEMPTS},
        "ProfilerConfig": {"S3OutputPath": f"{artifacts}{PROFILER}"},
        "TensorBoardOutputConfig": {
            "LocalPath": TENSORBOARD_LOCAL_PATH,
            "S3OutputPath": f"{artifacts}{TENSORBOARD_FORMAT.format(request.job_name_base)}",
        },
        "Tags": [tag.model_dump() for tag in request.tags],
    }


def _key(name: str) -> str:
    return name.removesuffix(".$")


def training_job_definition(create_parameters: dict[str, Any]) -> dict[str, Any]:
    """HyperParameterTrainingJobDefinition from CreateTrainingJob's parameters: the state machine's (with `.$`
    keys) or a built request's."""
    definition: dict[str, Any] = {}
    for name, value in create_parameters.items():
        key = _key(name)
        if key in _NOT_IN_DEFINITION:
            continue
        suffix = name[len(key) :]
        kept = value
        if key == "AlgorithmSpecification":
            kept = {k: v for k, v in value.items() if _key(k) in _ALGORITHM_KEYS}
        elif key == "ResourceConfig":
            kept = {k: v for k, v in value.items() if _key(k) not in _RESOURCE_KEYS_DROPPED}
        definition[_RENAMED.get(key, key) + suffix] = kept
    return definition


def create_tuning_job(request: TrainingRequest, deployment: Deployment) -> dict[str, Any]:
    """CreateHyperParameterTuningJob's parameters for a request with `tuning`."""
    if request.tuning is None:
        raise ValueError("the request has no tuning job")
    return {
        "HyperParameterTuningJobName": request.tuning.job_name,
        "HyperParameterTuningJobConfig": request.tuning.config,
        "TrainingJobDefinition": training_job_definition(create_training_job(request, 1, deployment)),
        "Tags": [tag.model_dump() for tag in request.tags],
    }


def submit_job(request: TrainingRequest, attempt: int, deployment: Deployment) -> dict[str, Any]:
    """AWS Batch SubmitJob's parameters for one attempt of the request."""
    name = job_name(request, attempt)
    environment = {
        JOB_NAME_ENV: name,
        HYPERPARAMETERS_ENV: _json(request.hyperparameters),
        CHANNELS_ENV: _json(request.channels),
        CHECKPOINTS_ENV: f"s3://{deployment.checkpoints_bucket}/{CHECKPOINTS_FORMAT.format(request.job_name_base)}",
        OUTPUT_ENV: f"s3://{deployment.artifacts_bucket}/{OUTPUT_FORMAT.format(name)}",
        EFA_ENV: _format(request.efa),
        EXPECTED_GPUS_ENV: _format(request.gpus),
        MIN_BUSBW_ENV: _format(request.allreduce_floor_gbps),
    }
    return {
        "jobName": name,
        "jobQueue": deployment.job_queue,
        "jobDefinition": deployment.job_definition,
        "nodeOverrides": {
            "numNodes": request.instance_count,
            "nodePropertyOverrides": [
                {
                    "targetNodes": "0:",
                    "containerOverrides": {
                        "environment": [{"name": key, "value": value} for key, value in environment.items()]
                    },
                }
            ],
        },
        "timeout": {"attemptDurationSeconds": request.max_runtime_seconds},
        "tags": {EXECUTION_TAG: deployment.execution, "run": request.run_name},
        "propagateTags": True,
    }


SERVICE_JOB_TYPE = "SAGEMAKER_TRAINING"


def submit_service_job(request: TrainingRequest, attempt: int, deployment: Deployment) -> dict[str, Any]:
    """AWS Batch SubmitServiceJob's parameters for one attempt of a team's request: the SageMaker step's
    CreateTrainingJob as its payload, under the team's quota share."""
    if request.team is None:
        raise ValueError("a service job is a team's: the request names no team")
    name = job_name(request, attempt)
    return {
        "jobName": name,
        "clientToken": name,
        "jobQueue": deployment.team_queue,
        "serviceJobType": SERVICE_JOB_TYPE,
        "quotaShareName": request.team,
        "schedulingPriority": request.priority,
        "preemptionConfiguration": {"preemptionRetriesBeforeTermination": deployment.preemption_retries},
        "retryStrategy": {"attempts": 1},
        "serviceRequestPayload": _json(create_training_job(request, attempt, deployment)),
        "tags": {TEAM_TAG: request.team, EXECUTION_TAG: deployment.execution, "run": request.run_name},
    }


def _json(value: object) -> str:
    """States.JsonToString's text: compact JSON."""
    return json.dumps(value, separators=(",", ":"))


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
    if request.tuning is not None:
        params = create_tuning_job(request, deployment)
        found = api_problems("sagemaker", "CreateHyperParameterTuningJob", params)
    elif request.backend == BATCH.name:
        found = api_problems("batch", "SubmitJob", submit_job(request, attempts, deployment))
    elif request.backend == QUEUE and request.team is not None:
        # The payload as SageMaker will take it, and the submission as Batch does.
        found = api_problems("sagemaker", "CreateTrainingJob", create_training_job(request, attempts, deployment))
        found += api_problems("batch", "SubmitServiceJob", submit_service_job(request, attempts, deployment))
    else:
        found = api_problems("sagemaker", "CreateTrainingJob", create_training_job(request, attempts, deployment))
    return [f"{problem}; change the input so that the request fits" for problem in found]

"""The requests the state machine sends to SageMaker and AWS Batch, each defined once, and both of its forms.

A definition is the request's parameters as the service's API names them: the deployment's constants (role,
image, network, keys, buckets, queues) as plain values, what the execution's state decides as expressions
(`Ref`, `Format`, `JsonToString`, `EXECUTION_ID`, `Staged`). The stacks render it as a Task state's Parameters
(`ServiceRequest.states_parameters`: JSONPath and intrinsic functions, member names in PascalCase as AWS SDK
integrations take them); Validate renders it as the parameters the SDK call receives for one attempt of one
request (`ServiceRequest.values`), which it checks against botocore's model before anything starts
(lambdas/validate/api_requests.py). A request the state machine sends in several shapes is built for one
`Variant`: a Choice state picks the Task by the request's fields of the same names.

Nomenclature: a *definition* is the nested parameters with expressions; its *states form* is what a Task's
`Parameters` hold; its *values* are what the SDK call receives.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from contract.execution_state import REQUEST, TRAIN, Path, TrainingRequest
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
SERVICE_JOB_TYPE = "SAGEMAKER_TRAINING"


@dataclass(frozen=True)
class RunState:
    """What a request's expressions read for one attempt of one request: the execution's state as its Task sees
    it (the request as Validate handed it on), and the execution's ARN."""

    request: TrainingRequest
    attempt: int
    execution: str

    @cached_property
    def _state(self) -> dict[str, Any]:
        return {"request": self.request.model_dump(mode="json"), "train": {"attempt": self.attempt}}

    def read(self, path: Path) -> Any:
        """The value at a JSONPath of the state (`$.request.instance_type`)."""
        node: Any = self._state
        for part in str(path).removeprefix("$.").split("."):
            node = node[part]
        return node


class Expression(ABC):
    """A value the execution's state decides."""

    @abstractmethod
    def states(self) -> str:
        """The value as a Task's Parameters write it (under a key ending in `.$`)."""

    @abstractmethod
    def value(self, state: RunState) -> Any:
        """The value the SDK call receives."""


@dataclass(frozen=True)
class Ref(Expression):
    """The value at a path of the execution's state."""

    path: Path

    def states(self) -> str:
        return str(self.path)

    def value(self, state: RunState) -> Any:
        return state.read(self.path)


class Format(Expression):
    """States.Format: `template` with each `{}` replaced by an argument's text."""

    def __init__(self, template: str, *args: Expression) -> None:
        self.template, self.args = template, args

    def states(self) -> str:
        return f"States.Format('{self.template}', {', '.join(arg.states() for arg in self.args)})"

    def value(self, state: RunState) -> str:
        return self.template.format(*(_text(arg.value(state)) for arg in self.args))


@dataclass(frozen=True)
class JsonToString(Expression):
    """States.JsonToString of a path: compact JSON."""

    of: Ref | Staged

    def states(self) -> str:
        return f"States.JsonToString({self.of.states()})"

    def value(self, state: RunState) -> str:
        return json.dumps(self.of.value(state), separators=(",", ":"))


class _ExecutionId(Expression):
    def states(self) -> str:
        return "$$.Execution.Id"

    def value(self, state: RunState) -> str:
        return state.execution


EXECUTION_ID = _ExecutionId()
"""The execution's ARN."""


@dataclass(frozen=True)
class Staged(Expression):
    """A value an earlier Pass state puts at `path` (an intrinsic function takes paths, not objects): the Task
    reads the path; `ServiceRequest.staged_parameters` gives the Pass its Parameters."""

    path: Path
    definition: Any

    def states(self) -> str:
        return str(self.path)

    def value(self, state: RunState) -> Any:
        return _values(self.definition, state)


class Map(dict[str, Any]):
    """A map of the API (tags, environment variables): its keys are data, kept as written in both forms."""


def _text(value: Any) -> str:
    """A value as States.Format writes it."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _states(definition: Any) -> Any:
    if isinstance(definition, dict):
        rendered = {}
        for key, item in definition.items():
            name = key if isinstance(definition, Map) else key[:1].upper() + key[1:]
            if isinstance(item, Expression):
                rendered[f"{name}.$"] = item.states()
            else:
                rendered[name] = _states(item)
        return rendered
    if isinstance(definition, list):
        return [_states(item) for item in definition]
    if isinstance(definition, Expression):
        raise TypeError(f"{definition!r}: Step Functions takes a path or an intrinsic function only as a field's value")
    return definition


def _values(definition: Any, state: RunState) -> Any:
    if isinstance(definition, Expression):
        return definition.value(state)
    if isinstance(definition, dict):
        return {key: _values(item, state) for key, item in definition.items()}
    if isinstance(definition, list):
        return [_values(item, state) for item in definition]
    return definition


def _staged(definition: Any) -> Iterator[Staged]:
    if isinstance(definition, Staged):
        yield definition
    elif isinstance(definition, JsonToString):
        yield from _staged(definition.of)
    elif isinstance(definition, Format):
        for arg in definition.args:
            yield from _staged(arg)
    elif isinstance(definition, dict):
        for item in definition.values():
            yield from _staged(item)
    elif isinstance(definition, list):
        for item in definition:
            yield from _staged(item)


@dataclass(frozen=True)
class Variant:
    """One shape of a request, by the request's fields of the same names (a Choice state tests them)."""

    local_storage: bool = False
    """An instance-store type: SageMaker takes no volume KMS key."""
    heterogeneous: bool = False
    """Instance groups instead of one type and count."""
    training_plan: bool = False
    """In the stage's training plan."""

    @classmethod
    def of(cls, request: TrainingRequest) -> Variant:
        return cls(**{field.name: getattr(request, field.name) for field in fields(cls)})


@dataclass(frozen=True)
class ServiceRequest:
    """One request the state machine sends: its service, its operation and its definition per variant."""

    service: str
    operation: str
    definition: Callable[[Variant], dict[str, Any]]

    @property
    def action(self) -> str:
        """The AWS SDK integration's action (`createTrainingJob`)."""
        return self.operation[:1].lower() + self.operation[1:]

    def states_parameters(self, variant: Variant = Variant()) -> dict[str, Any]:
        """The Task state's Parameters for this variant."""
        rendered: dict[str, Any] = _states(self.definition(variant))
        return rendered

    def staged_parameters(self, under: Path, variant: Variant = Variant()) -> dict[str, Any]:
        """The Parameters of the Pass state that puts the request's `Staged` values in place (its ResultPath:
        `under`, the parent of each staged path)."""
        staged = {}
        for value in _staged(self.definition(variant)):
            name = str(value.path).removeprefix(f"{under}.")
            if "." in name or name == str(value.path):
                raise ValueError(f"{value.path} is not a field of {under}")
            if isinstance(value.definition, Expression):
                staged[f"{name}.$"] = value.definition.states()
            else:
                staged[name] = _states(value.definition)
        return staged

    def values(self, state: RunState) -> dict[str, Any]:
        """The parameters the SDK call receives for this attempt of this request."""
        values: dict[str, Any] = _values(self.definition(Variant.of(state.request)), state)
        return values


ATTEMPT_JOB_NAME = Format("{}-{}", Ref(REQUEST.job_name_base), Ref(TRAIN.attempt))
"""One name per attempt: a create retried after it had in fact succeeded finds its own job and adopts it."""


@dataclass(frozen=True)
class TrainingJobConstants:
    """What the stacks, not the request, decide of every SageMaker training job."""

    role_arn: str
    training_image: str
    key_arn: str
    subnet: str
    security_group: str
    checkpoints_bucket: str
    artifacts_bucket: str
    inter_container_encryption: bool
    network_isolation: bool
    training_plan_arn: str = ""
    """The stage's training plan (pipeline.training_plan), which a request on its type runs in; empty: none."""


def _checkpoints_uri(bucket: str) -> Format:
    return Format(f"s3://{bucket}/{CHECKPOINTS_FORMAT}", Ref(REQUEST.job_name_base))


def _resource_config(job: TrainingJobConstants, variant: Variant) -> dict[str, Any]:
    cluster: dict[str, Any] = (
        {"InstanceGroups": Ref(REQUEST.sagemaker_instance_groups)}
        if variant.heterogeneous
        else {"InstanceType": Ref(REQUEST.instance_type), "InstanceCount": Ref(REQUEST.instance_count)}
    )
    resource = {
        **cluster,
        "VolumeSizeInGB": Ref(REQUEST.volume_size_gb),
        "KeepAlivePeriodInSeconds": Ref(REQUEST.keep_alive_seconds),
    }
    if not variant.local_storage:
        resource["VolumeKmsKeyId"] = job.key_arn
    if variant.training_plan:
        if not job.training_plan_arn:
            raise ValueError("a request in a training plan, and the stage has none (pipeline.training_plan)")
        resource["TrainingPlanArn"] = job.training_plan_arn
    return resource


def create_training_job(job: TrainingJobConstants) -> ServiceRequest:
    """SageMaker CreateTrainingJob: every security-relevant field (role, image, VPC, KMS keys, encryption flag,
    output and checkpoint locations) is a constant; the request reaches only the fields Validate resolved."""

    def definition(variant: Variant) -> dict[str, Any]:
        artifacts = f"s3://{job.artifacts_bucket}/"
        return {
            # A retried create that had in fact succeeded finds a job of this name ("name already in use") and adopts
            # it once the adoption check finds it the job asked for (lambdas/jobs/adoption.py).
            "TrainingJobName": ATTEMPT_JOB_NAME,
            "RoleArn": job.role_arn,
            "AlgorithmSpecification": {
                "TrainingImage": job.training_image,
                "TrainingInputMode": "File",
                "MetricDefinitions": METRIC_DEFINITIONS,
                "EnableSageMakerMetricsTimeSeries": True,
            },
            "HyperParameters": Ref(REQUEST.hyperparameters),
            "Environment": Map(
                {
                    "PYTHONUNBUFFERED": "1",
                    "NCCL_DEBUG": "WARN",
                    # The request's `efa`: the launcher requires EFA devices, or keeps NCCL on TCP sockets.
                    EFA_ENV: Format("{}", Ref(REQUEST.efa)),
                    # What the launcher's pre-flight check holds every host to (from the instance catalog).
                    EXPECTED_GPUS_ENV: Format("{}", Ref(REQUEST.gpus)),
                    MIN_BUSBW_ENV: Format("{}", Ref(REQUEST.allreduce_floor_gbps)),
                    # Which instance groups' hosts train; the others are auxiliary (one group: all train).
                    TRAINING_GROUPS_ENV: Ref(REQUEST.training_groups),
                }
            ),
            "InputDataConfig": Ref(REQUEST.channels),
            "OutputDataConfig": {"S3OutputPath": f"{artifacts}{RUNS}", "KmsKeyId": job.key_arn},
            "ResourceConfig": _resource_config(job, variant),
            "StoppingCondition": Ref(REQUEST.stopping_condition),
            "EnableManagedSpotTraining": Ref(REQUEST.spot),
            "CheckpointConfig": {
                "S3Uri": _checkpoints_uri(job.checkpoints_bucket),
                "LocalPath": CHECKPOINT_LOCAL_PATH,
            },
            "VpcConfig": {"Subnets": [job.subnet], "SecurityGroupIds": [job.security_group]},
            "EnableInterContainerTrafficEncryption": job.inter_container_encryption,
            "EnableNetworkIsolation": job.network_isolation,
            "RetryStrategy": {"MaximumRetryAttempts": MAX_RETRY_ATTEMPTS},
            "ProfilerConfig": {"S3OutputPath": f"{artifacts}{PROFILER}"},
            "TensorBoardOutputConfig": {
                "LocalPath": TENSORBOARD_LOCAL_PATH,
                "S3OutputPath": Format(f"{artifacts}{TENSORBOARD_FORMAT}", Ref(REQUEST.job_name_base)),
            },
            "Tags": Ref(REQUEST.tags),
        }

    return ServiceRequest("sagemaker", "CreateTrainingJob", definition)


# CreateTrainingJob fields a tuning job's definition does not take: the tuning job names and tags its
# trials, and SageMaker's profiler, TensorBoard and warm-pool settings are not part of the definition.
_NOT_IN_DEFINITION = ("TrainingJobName", "Tags", "ProfilerConfig", "TensorBoardOutputConfig")
_RENAMED = {"HyperParameters": "StaticHyperParameters"}
_ALGORITHM_KEYS = ("TrainingImage", "TrainingInputMode", "MetricDefinitions")
_RESOURCE_KEYS_DROPPED = ("KeepAlivePeriodInSeconds",)


def _key(name: str) -> str:
    return name.removesuffix(".$")


def training_job_definition(create_parameters: dict[str, Any]) -> dict[str, Any]:
    """HyperParameterTrainingJobDefinition from CreateTrainingJob's parameters: its definition, its states form
    (with `.$` keys) or its values."""
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


def create_tuning_job(job: TrainingJobConstants) -> ServiceRequest:
    """SageMaker CreateHyperParameterTuningJob: every trial is the single job's definition with tuned values (one
    cluster of one type, outside the training plan), so it carries the same enforced fields."""
    single = create_training_job(job)

    def definition(variant: Variant) -> dict[str, Any]:
        return {
            "HyperParameterTuningJobName": Ref(REQUEST.tuning.job_name),
            "HyperParameterTuningJobConfig": Ref(REQUEST.tuning.config),
            "TrainingJobDefinition": training_job_definition(
                single.definition(Variant(local_storage=variant.local_storage))
            ),
            # SageMaker adds a tuning job's tags to every training job it launches (the cleanup finds them).
            "Tags": Ref(REQUEST.tags),
        }

    return ServiceRequest("sagemaker", "CreateHyperParameterTuningJob", definition)


@dataclass(frozen=True)
class BatchJobConstants:
    """What the stacks decide of every AWS Batch multi-node parallel job."""

    job_queue: str
    job_definition: str
    checkpoints_bucket: str
    artifacts_bucket: str


def submit_job(batch: BatchJobConstants) -> ServiceRequest:
    """AWS Batch SubmitJob: the run's variables on every node carry what CreateTrainingJob's own fields do."""
    environment = {
        JOB_NAME_ENV: ATTEMPT_JOB_NAME,
        HYPERPARAMETERS_ENV: JsonToString(Ref(REQUEST.hyperparameters)),
        CHANNELS_ENV: JsonToString(Ref(REQUEST.channels)),
        CHECKPOINTS_ENV: _checkpoints_uri(batch.checkpoints_bucket),
        OUTPUT_ENV: Format(f"s3://{batch.artifacts_bucket}/{OUTPUT_FORMAT}", ATTEMPT_JOB_NAME),
        EFA_ENV: Format("{}", Ref(REQUEST.efa)),
        EXPECTED_GPUS_ENV: Format("{}", Ref(REQUEST.gpus)),
        MIN_BUSBW_ENV: Format("{}", Ref(REQUEST.allreduce_floor_gbps)),
    }

    def definition(variant: Variant) -> dict[str, Any]:
        return {
            # One name per attempt; Batch does not refuse a second job of the same name, the adoption path finds it.
            "jobName": ATTEMPT_JOB_NAME,
            "jobQueue": batch.job_queue,
            "jobDefinition": batch.job_definition,
            "nodeOverrides": {
                "numNodes": Ref(REQUEST.instance_count),
                "nodePropertyOverrides": [
                    {
                        "targetNodes": "0:",
                        "containerOverrides": {
                            "environment": [{"name": name, "value": value} for name, value in environment.items()]
                        },
                    }
                ],
            },
            "timeout": {"attemptDurationSeconds": Ref(REQUEST.max_runtime_seconds)},
            # The request's tags: the execution's (how StopBatchJobs finds the jobs of an execution that ended), the
            # run's, and a team's cost tag, which the team's budget stop matches.
            "tags": Ref(REQUEST.tag_map),
            "propagateTags": True,
        }

    return ServiceRequest("batch", "SubmitJob", definition)


@dataclass(frozen=True)
class ServiceJobConstants:
    """What the stacks decide of every team's service job."""

    team_queue: str
    """The teams' SageMaker Training job queue (backend "queue")."""
    preemption_retries: int
    """service_environment.preemption_retries: how often a team's job may be preempted before it fails."""


def submit_service_job(queue: ServiceJobConstants, job: TrainingJobConstants) -> ServiceRequest:
    """AWS Batch SubmitServiceJob: the SageMaker step's CreateTrainingJob (outside the training plan) as its
    payload, under the team's quota share at the request's priority."""
    payload = create_training_job(job)

    def definition(variant: Variant) -> dict[str, Any]:
        shape = Variant(local_storage=variant.local_storage, heterogeneous=variant.heterogeneous)
        return {
            "jobName": ATTEMPT_JOB_NAME,
            # The attempt's name: a retried submit whose answer was lost returns the job it queued.
            "clientToken": ATTEMPT_JOB_NAME,
            "jobQueue": queue.team_queue,
            "serviceJobType": SERVICE_JOB_TYPE,
            "quotaShareName": Ref(REQUEST.team),
            "schedulingPriority": Ref(REQUEST.priority),
            "preemptionConfiguration": {"preemptionRetriesBeforeTermination": queue.preemption_retries},
            # A failed training job comes back to the pipeline, which replaces it when fresh nodes may help.
            "retryStrategy": {"attempts": 1},
            "serviceRequestPayload": JsonToString(Staged(TRAIN.submission.payload, payload.definition(shape))),
            # The team's tag is what its budget stop denies; the execution's is how cleanup finds the job.
            "tags": Staged(
                TRAIN.submission.tags,
                Map({TEAM_TAG: Ref(REQUEST.team), EXECUTION_TAG: EXECUTION_ID, "run": Ref(REQUEST.run_name)}),
            ),
        }

    return ServiceRequest("batch", "SubmitServiceJob", definition)

"""Adoption: a job found under an attempt's name is followed only when it is the job the platform asked for.

A create whose answer was lost, or a retried one, finds a job of its attempt's name (SageMaker's "name in use", a
Batch job listed by name, a service job's client token): the run may follow that job instead of starting a second. A
name is predictable and a tag is anyone's to set, so neither says whose the job is; what does is the job itself.
This handler describes the job found and compares it with the request the platform would have sent for this attempt,
from the definition the state machine sends and Validate checks (contract/service_requests.py): role, image, input
and output locations, hyperparameters, environment, cluster, network, keys, flags, tags. Every field of the
service's create request is compared, those the platform leaves unset included, so a job with an entrypoint, a
debugger or a remote session of someone else's choosing is not the platform's; a service's own defaults (`DEFAULTS`)
are the only values allowed beyond the request. A job that differs fails the run with the differences as its cause.

Invoked by each backend's create step after it found a job: {"request", "execution", "attempt", "kind", "job"}
(`kind`: training-job, tuning-job, batch-job or service-job; `job`: the name or the ID the step found).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from botocore.model import Shape

from contract.execution_state import Adoption, ExistingJob
from contract.service_requests import (
    RunState,
    create_training_job,
    create_tuning_job,
    submit_job,
    submit_service_job,
)
from lambdas.jobs.environment import AdoptionEnvironment
from lambdas.shared.errors import classified
from lambdas.validate.api_requests import Deployment
from lambdas.validate.service_models import service_model

logger = Logger(service="training-platform")

UNSET: tuple[Any, ...] = (None, False, "", [], {})
DEFAULTS: dict[str, tuple[Any, ...]] = {
    # What SageMaker's Describe* answer for a field its create request left out (the API reference's defaults).
    "InputDataConfig[].CompressionType": ("None",),
    "InputDataConfig[].RecordWrapperType": ("None",),
    "OutputDataConfig.CompressionType": ("GZIP",),
    "ProfilerConfig.ProfilingIntervalInMilliseconds": (500,),
    "TrainingJobDefinition.InputDataConfig[].CompressionType": ("None",),
    "TrainingJobDefinition.InputDataConfig[].RecordWrapperType": ("None",),
    "TrainingJobDefinition.OutputDataConfig.CompressionType": ("GZIP",),
    "HyperParameterTuningJobConfig.TrainingJobEarlyStoppingType": ("Off",),
}
RESERVED_HYPERPARAMETERS = ("_tuning_objective_metric",)
"""What SageMaker adds to a tuning job's static hyperparameters itself."""
SHOWN = 120
Check = Callable[[Any, ExistingJob, Deployment], tuple[dict[str, Any], list[str]]]
"""Describe the job found with a service's client, and how it differs from the request asked for."""


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}..."


def _unset(value: Any) -> bool:
    return any(value == empty and type(value) is type(empty) for empty in UNSET) or value is None


def differences(asked: Any, found: Any, shape: Shape, path: str = "") -> list[str]:
    """Where `found` (a Describe* answer) is not what `asked` (a create request of `shape`) asked: every member of
    the shape compared, those left unset included (only a service default, `DEFAULTS`, may stand there)."""
    kind = shape.type_name
    where = path or "the request"
    if asked is None:
        return [] if _unset(found) or found in DEFAULTS.get(path, ()) else [f"{where} is {_shown(found)}, asked none"]
    if kind == "structure" and isinstance(asked, dict) and isinstance(found, dict):
        return [
            difference
            for name, member in shape.members.items()
            for difference in differences(asked.get(name), found.get(name), member, f"{path}.{name}".lstrip("."))
        ]
    if kind == "list" and isinstance(asked, list) and isinstance(found, list) and len(asked) == len(found):
        return [d for a, f in zip(asked, found, strict=True) for d in differences(a, f, shape.member, f"{path}[]")]
    if kind == "map" and isinstance(asked, dict) and isinstance(found, dict):
        extra = sorted(set(found) - set(asked) - set(RESERVED_HYPERPARAMETERS))
        return [f"{where} has {', '.join(extra)}, not asked"] * bool(extra) + [
            d for key in asked for d in differences(asked[key], found.get(key), shape.value, f"{path}.{key}")
        ]
    if kind not in ("structure", "list", "map") and _same(asked, found):
        return []
    return [f"{where} is {_shown(found)}, asked {_shown(asked)}"]


def _same(asked: Any, found: Any) -> bool:
    if isinstance(asked, bool) or isinstance(found, bool):
        return asked is found
    if isinstance(asked, int | float) and isinstance(found, int | float):
        return float(asked) == float(found)
    return bool(asked == found)


def _tag_differences(asked: dict[str, str], found: dict[str, str]) -> list[str]:
    """The tags asked for must all be on the job, with their values (the service or its owner may add others)."""
    return [
        f"tag {key} is {found.get(key)!r}, asked {value!r}" for key, value in asked.items() if found.get(key) != value
    ]


def _state(found: ExistingJob) -> RunState:
    """The execution's state as the create step that found the job saw it."""
    return RunState(found.request, found.attempt, found.execution)


def _shape(service: str, operation: str) -> Shape:
    return service_model(service).operation_model(operation).input_shape


def _sagemaker_differences(
    asked: dict[str, Any], described: dict[str, Any], tags: list[dict[str, str]], operation: str, name: str
) -> list[str]:
    """How a SageMaker Describe* answer (and the job's tags) differs from the create request `asked`."""
    shape = _shape("sagemaker", operation)
    skipped = (name, "Tags")
    asked_fields = {k: v for k, v in asked.items() if k not in skipped}
    found_fields = {k: v for k, v in described.items() if k in shape.members and k not in skipped}
    tag_maps = ({t["Key"]: t["Value"] for t in listed} for listed in (asked["Tags"], tags))
    return differences(asked_fields, found_fields, shape) + _tag_differences(*tag_maps)


def training_job(sagemaker: Any, found: ExistingJob, deployment: Deployment) -> tuple[dict[str, Any], list[str]]:
    """The SageMaker training job of that name, and how it differs from this attempt's CreateTrainingJob."""
    asked = create_training_job(deployment.training).values(_state(found))
    described = sagemaker.describe_training_job(TrainingJobName=found.job)
    tags = sagemaker.list_tags(ResourceArn=described["TrainingJobArn"])["Tags"]
    return described, _sagemaker_differences(asked, described, tags, "CreateTrainingJob", "TrainingJobName")


def tuning_job(sagemaker: Any, found: ExistingJob, deployment: Deployment) -> tuple[dict[str, Any], list[str]]:
    """The tuning job of that name, and how it differs from the run's CreateHyperParameterTuningJob."""
    asked = create_tuning_job(deployment.training).values(_state(found))
    described = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=found.job)
    tags = sagemaker.list_tags(ResourceArn=described["HyperParameterTuningJobArn"])["Tags"]
    operation, name = "CreateHyperParameterTuningJob", "HyperParameterTuningJobName"
    return described, _sagemaker_differences(asked, described, tags, operation, name)


def service_job(batch: Any, found: ExistingJob, deployment: Deployment) -> tuple[dict[str, Any], list[str]]:
    """The service job of that ID, and how it differs from this attempt's SubmitServiceJob (its payload, this
    attempt's CreateTrainingJob, compared as SageMaker would read it)."""
    asked = submit_service_job(deployment.queue, deployment.training).values(_state(found))
    described = batch.describe_service_job(jobId=found.job)
    shape = _shape("batch", "SubmitServiceJob")
    skipped = ("jobName", "clientToken", "tags", "serviceRequestPayload")
    asked_fields = {k: v for k, v in asked.items() if k not in skipped}
    found_fields = {k: v for k, v in described.items() if k in shape.members and k not in skipped}
    problems = differences(asked_fields, found_fields, shape) + _tag_differences(asked["tags"], described.get("tags"))
    if described.get("jobName") != asked["jobName"]:
        problems.append(f"jobName is {described.get('jobName')!r}, asked {asked['jobName']!r}")
    try:
        payload = json.loads(described.get("serviceRequestPayload") or "")
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return described, [*problems, "serviceRequestPayload is not a CreateTrainingJob request"]
    training = json.loads(asked["serviceRequestPayload"])
    problems += [
        f"serviceRequestPayload.{d}" for d in differences(training, payload, _shape("sagemaker", "CreateTrainingJob"))
    ]
    return described, problems


def batch_job(batch: Any, found: ExistingJob, deployment: Deployment) -> tuple[dict[str, Any], list[str]]:
    """The AWS Batch job of that ID, and how it differs from this attempt's SubmitJob: its queue, job definition,
    nodes, timeout and tags, and every node range's container as the job definition's with this attempt's
    environment (no other command, image, role, type or resources)."""
    asked = submit_job(deployment.batch).values(_state(found))
    (described,) = batch.describe_jobs(jobs=[found.job])["jobs"]
    (definition,) = batch.describe_job_definitions(jobDefinitions=[asked["jobDefinition"]])["jobDefinitions"]
    problems = _tag_differences(asked["tags"], described.get("tags") or {})
    for field in ("jobName", "jobQueue", "jobDefinition"):
        if described.get(field) != asked[field]:
            problems.append(f"{field} is {described.get(field)!r}, asked {asked[field]!r}")
    nodes = described.get("nodeProperties") or {}
    if nodes.get("numNodes") != asked["nodeOverrides"]["numNodes"]:
        problems.append(
            f"nodeProperties.numNodes is {nodes.get('numNodes')!r}, asked {asked['nodeOverrides']['numNodes']}"
        )
    timeout = (described.get("timeout") or {}).get("attemptDurationSeconds")
    if timeout != asked["timeout"]["attemptDurationSeconds"]:
        problems.append(
            f"timeout.attemptDurationSeconds is {timeout!r}, asked {asked['timeout']['attemptDurationSeconds']}"
        )
    overrides = {
        e["name"]: e["value"]
        for o in asked["nodeOverrides"]["nodePropertyOverrides"]
        for e in o["containerOverrides"]["environment"]
    }
    ranges = nodes.get("nodeRangeProperties") or []
    if not ranges:
        problems.append("nodeProperties.nodeRangeProperties is missing: its nodes' containers cannot be compared")
    expected_ranges = {r["targetNodes"]: r["container"] for r in definition["nodeProperties"]["nodeRangeProperties"]}
    for index, node_range in enumerate(ranges):
        where = f"nodeProperties.nodeRangeProperties[{index}].container"
        defined = expected_ranges.get(node_range.get("targetNodes"))
        if defined is None:
            problems.append(f"{where}: node range {node_range.get('targetNodes')!r} is not the job definition's")
            continue
        environment = {e["name"]: e["value"] for e in defined.get("environment", [])} | overrides
        expected = {**defined, "environment": environment}
        container = node_range.get("container") or {}
        container = {**container, "environment": {e["name"]: e["value"] for e in container.get("environment", [])}}
        for key in sorted(set(expected) | set(container)):
            if key in CONTAINER_FIELDS and not _same_container_field(expected.get(key), container.get(key)):
                problems.append(f"{where}.{key} is {_shown(container.get(key))}, asked {_shown(expected.get(key))}")
    return described, problems


CONTAINER_FIELDS = (
    "image",
    "command",
    "jobRoleArn",
    "executionRoleArn",
    "environment",
    "instanceType",
    "resourceRequirements",
    "privileged",
    "user",
    "volumes",
    "mountPoints",
    "secrets",
    "linuxParameters",
)
"""What a job's container runs as and with: a submit's overrides may change some of these; none may differ."""


def _same_container_field(expected: Any, found: Any) -> bool:
    return (_unset(expected) and _unset(found)) or expected == found


def verdict(found: ExistingJob, *, sagemaker: Any, batch: Any, deployment: Deployment) -> Adoption:
    """Adopt the job found, or the cause that fails the run."""
    checks: dict[str, tuple[Check, Any]] = {
        "training-job": (training_job, sagemaker),
        "tuning-job": (tuning_job, sagemaker),
        "batch-job": (batch_job, batch),
        "service-job": (service_job, batch),
    }
    check, client = checks[found.kind]
    described, problems = check(client, found, deployment)
    name = str(described.get("TrainingJobName") or described.get("HyperParameterTuningJobName") or described["jobName"])
    arn = str(
        described.get("TrainingJobArn") or described.get("HyperParameterTuningJobArn") or described.get("jobArn") or ""
    )
    if not problems:
        return Adoption(adopt=True, job_name=name, arn=arn)
    label = found.kind.replace("-", " ")
    cause = (
        f"A {label} named {name} already exists, but it is not the one this run asked for ({'; '.join(problems)}). "
        "Someone else made it under this run's name; the run does not adopt it. Start the run again (a new "
        "execution has a new identity), and find out who made that job."
    )
    return Adoption(adopt=False, job_name=name, arn=arn, cause=cause)


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: an `ExistingJob`; answers an `Adoption`."""
    found = ExistingJob.model_validate(event)
    deployment = AdoptionEnvironment.from_environ().deployment(found.execution)
    result = verdict(found, sagemaker=boto3.client("sagemaker"), batch=boto3.client("batch"), deployment=deployment)
    logger.info(
        "existing job judged",
        extra={"job": result.job_name, "kind": found.kind, "adopted": result.adopt, "cause": result.cause},
    )
    return result.model_dump()

"""Register handler: a model package (pending approval) with the run's full lineage.

Lineage: the dataset location and the S3 version ID of every object read, the image digest,
the platform's git revision, the run's own code (its archive and SHA-256) where it brought one, hyperparameters,
checkpoint location, metrics and cost, and the model archive's S3 version and SHA-256. The full
record is written to the artifacts bucket; the model package points at it and carries a summary, and pins the
model archive and the lineage record to the versions and digests read here (lambdas/register/pin.py), which
promotion checks (lambdas/register/verify.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from contract import goodput
from contract.execution_state import RegisterEvent, Registration
from contract.layout import LINEAGE_RECORD, run_lineage, split_s3_uri
from contract.metrics import MODEL_METRIC_NAMES
from contract.model_folder import FINE_TUNED_FOLDER
from lambdas.register.environment import RegisterEnvironment
from lambdas.register.pin import LINEAGE, MODEL, Pinned, pin
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Metric, Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.REGISTRATION)

_MAX_METADATA_VALUE = 256  # SageMaker's limit on CustomerMetadataProperties values


def dataset_versions(s3: Any, s3_uri: str) -> list[dict[str, str]]:
    """The current version of every object under the dataset prefix: what this run could have read."""
    bucket, prefix = split_s3_uri(s3_uri)
    versions: list[dict[str, str]] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        versions.extend(
            {"key": v["Key"], "version_id": v["VersionId"], "etag": v["ETag"].strip('"')}
            for v in page.get("Versions", [])
            if v["IsLatest"]
        )
    return sorted(versions, key=lambda v: v["key"])


def model_metrics(final: dict[str, float]) -> dict[str, float]:
    """The model's own final metrics (the registry's quality figures), without the job's time phases or
    straggler figures, which the lineage keeps."""
    return {name: value for name, value in final.items() if name in MODEL_METRIC_NAMES}


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _MAX_METADATA_VALUE else text[: _MAX_METADATA_VALUE - 1] + "…"


@dataclass(frozen=True)
class Destination:
    """Where registration writes: the artifacts bucket, the model package group, the image and revision."""

    artifacts_bucket: str
    group: str
    image_uri: str
    revision: str


def _lineage(
    event: RegisterEvent,
    versions: list[dict[str, str]],
    manifest: str,
    versions_uri: str,
    where: Destination,
    *,
    model: Pinned,
) -> dict[str, Any]:
    """The lineage record: what was trained, on what, with what, and what it cost."""
    request, job = event.request, event.job
    run_cost = job.run_cost
    lineage = {
        "run_name": request.run_name,
        "team": request.team,  # what `tp cost` totals by team (None: the run is no team's)
        "execution": event.execution,
        "training_job": job.job_name,
        "dataset": {
            "uri": request.dataset.uri,
            "s3_uri": request.dataset.s3_uri,
            "objects": len(versions),
            "versions_sha256": hashlib.sha256(manifest.encode()).hexdigest(),
            "versions_uri": versions_uri,
        },
        "image": where.image_uri,
        "platform_revision": where.revision,
        # What ran in the image: the run's own code, by the digest Validate checked (None: the platform's trainer).
        "code": request.code.model_dump(mode="json") if request.code else None,
        "hyperparameters": request.hyperparameters,
        "cluster": {
            "instance_type": request.instance_type,
            "instance_count": request.instance_count,
            "groups": [
                group.model_dump(include={"name", "instance_type", "instance_count", "role"})
                for group in request.instance_groups
            ],
            "spot": request.spot,
            "interruptions": job.interruptions,
        },
        "checkpoints": job.checkpoint,
        # The run this one resumed (resume_from), the checkpoint it started from, and the runs before it.
        "continued_from": (
            {**event.resumed.model_dump(), "earlier": request.resume_from.earlier}
            if event.resumed and request.resume_from
            else None
        ),
        "model_artifacts": job.model_artifacts,
        # The archive's version and digest: promotion refuses other bytes under model_artifacts.
        "model": {"uri": model.uri, "version_id": model.version_id, "sha256": model.sha256},
        # A fine-tuning run's model folder, inside model_artifacts, and the base model it started from.
        "fine_tuned_model": f"{job.model_artifacts} ({FINE_TUNED_FOLDER}/)" if request.base_model else None,
        "metrics": job.final_metrics,
        "evaluation": event.evaluation.reason,
        "cost": {
            "estimate_usd": event.estimate.max_cost_usd,
            "billable_seconds": job.billable_seconds,
            "training_seconds": job.training_seconds,
            # At list price: billable seconds already net out spot savings (lambdas/sagemaker/monitor.py job_cost).
            # Every job the run was billed for: the replaced attempts' too (JobProgress.run_cost).
            "actual_usd": run_cost.actual_usd if run_cost else None,
            "on_demand_usd": run_cost.on_demand_usd if run_cost else None,
            "spot_savings_usd": run_cost.spot_savings_usd if run_cost else None,
        },
    }
    if job.tuning is not None:
        # The best trial of a tuning job: which tuning job and trial, what it tuned, how it scored.
        lineage["tuning"] = job.tuning.model_dump(mode="json")
        lineage["hyperparameters"] = {**request.hyperparameters, **job.tuning.hyperparameters}
    return lineage


def _create_package(
    sagemaker: Any,
    event: RegisterEvent,
    lineage: dict[str, Any],
    uris: dict[str, str],
    where: Destination,
    *,
    pins: dict[str, Pinned],
) -> str:
    """A model package pending approval that points at the lineage and carries its summary."""
    request, job = event.request, event.job
    package = sagemaker.create_model_package(
        ModelPackageGroupName=where.group,
        ModelPackageDescription=f"{request.run_name}: {event.evaluation.reason}"[:1000],
        ModelApprovalStatus="PendingManualApproval",
        ClientToken=job.job_name,  # a retried registration returns the same package
        InferenceSpecification={
            "Containers": [{"Image": where.image_uri, "ModelDataUrl": job.model_artifacts}],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
        },
        ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json", "S3Uri": uris["metrics"]}}},
        MetadataProperties={
            "CommitId": where.revision,
            "GeneratedBy": event.execution,
            "ProjectId": request.run_name,
        },
        CustomerMetadataProperties={
            "lineage": uris["lineage"],
            **{k: v for name, pinned in pins.items() for k, v in pinned.metadata(name).items()},
            "training_job": job.job_name,
            "dataset": _clip(request.dataset.uri),
            "dataset_versions_sha256": lineage["dataset"]["versions_sha256"],
            "image": _clip(where.image_uri),
            "platform_revision": where.revision,
            **({"code_sha256": request.code.sha256} if request.code else {}),
            "checkpoints": _clip((job.checkpoint or {}).get("uri", "none")),
            "hyperparameters": _clip(lineage["hyperparameters"]),
            "metrics": _clip(model_metrics(job.final_metrics)),
            "cost_estimate_usd": str(event.estimate.max_cost_usd),
            "cost_actual_usd": str(lineage["cost"]["actual_usd"]),
            "spot_savings_usd": str(lineage["cost"]["spot_savings_usd"]),
            **({"tuning_job": job.tuning.tuning_job} if job.tuning else {}),
            **(
                {
                    "base_model": _clip(request.base_model.uri),
                    "base_model_versions_sha256": lineage["base_model"]["versions_sha256"],
                    "fine_tuned_model": _clip(lineage["fine_tuned_model"]),
                }
                if request.base_model
                else {}
            ),
        },
        Tags=[tag.model_dump() for tag in request.tags],
    )
    return str(package["ModelPackageArn"])


def _base_model(s3: Any, event: RegisterEvent, prefix: str, bucket: str) -> dict[str, Any]:
    """The model folder a fine-tuning run started from: where, what, and the digest of its files' versions."""
    base = event.request.base_model
    assert base is not None
    listed = "".join(json.dumps(v, sort_keys=True) + "\n" for v in dataset_versions(s3, base.s3_uri))
    listed = _write_once(
        s3, bucket, f"{prefix}base-model-versions.jsonl", listed.encode(), execution=event.execution
    ).decode()
    return {
        **base.model_dump(mode="json"),
        "objects": len(listed.splitlines()),
        "versions_sha256": hashlib.sha256(listed.encode()).hexdigest(),
        "versions_uri": f"s3://{bucket}/{prefix}base-model-versions.jsonl",
    }


class LineageExistsError(Exception):
    """A run's lineage file is already written: lineage is written once and never replaced."""


def _write_once(s3: Any, bucket: str, key: str, body: bytes, *, execution: str) -> bytes:
    """Put `key` only if no object has it (S3 If-None-Match: *), marked with the execution that wrote it.

    An object this execution wrote before (a retried Register) stands, and its body is returned; an
    object of any other writer is an error and is never rewritten.
    """
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*", Metadata={"execution": execution})
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise
        existing = s3.get_object(Bucket=bucket, Key=key)
        if existing.get("Metadata", {}).get("execution") == execution:
            return bytes(existing["Body"].read())
        raise LineageExistsError(
            f"s3://{bucket}/{key} already exists: a run's lineage is written once, by the execution whose identity"
            " names its prefix, and is never replaced"
        ) from None
    return body


def register(event: RegisterEvent, *, s3: Any, sagemaker: Any, where: Destination) -> Registration:
    """Write the dataset versions, the lineage and the metrics; register the model pending approval."""
    prefix = run_lineage(event.request.job_name_base)
    versions = dataset_versions(s3, event.request.dataset.s3_uri)
    manifest = "".join(json.dumps(v, sort_keys=True) + "\n" for v in versions)
    bucket, execution = where.artifacts_bucket, event.execution
    # After a retry, the lineage describes the dataset versions the first attempt recorded.
    manifest = _write_once(
        s3, bucket, f"{prefix}dataset-versions.jsonl", manifest.encode(), execution=execution
    ).decode()
    versions = [json.loads(line) for line in manifest.splitlines()]
    if event.job.model_artifacts is None:
        raise ValueError(f"{event.job.job_name} ended without a model archive: there is no model to register")
    model = pin(s3, event.job.model_artifacts)
    lineage = _lineage(event, versions, manifest, f"s3://{bucket}/{prefix}dataset-versions.jsonl", where, model=model)
    if event.request.base_model is not None:
        lineage["base_model"] = _base_model(s3, event, prefix, bucket)
    # Where the run's billed time went, every job of it (contract/goodput.py).
    lineage["goodput"] = goodput.stored_ledgers(s3, bucket, event.request.job_name_base).to_json()
    lineage_body = json.dumps(lineage, indent=2, sort_keys=True).encode()
    lineage = json.loads(_write_once(s3, bucket, f"{prefix}{LINEAGE_RECORD}", lineage_body, execution=execution))
    metrics_body = json.dumps(model_metrics(event.job.final_metrics), sort_keys=True).encode()
    _write_once(s3, bucket, f"{prefix}metrics.json", metrics_body, execution=execution)
    uris = {"lineage": f"s3://{bucket}/{prefix}{LINEAGE_RECORD}", "metrics": f"s3://{bucket}/{prefix}metrics.json"}
    pins = {MODEL: model, LINEAGE: pin(s3, uris["lineage"])}
    package = _create_package(sagemaker, event, lineage, uris, where, pins=pins)
    logger.info("model registered", extra={"package": package, "lineage": uris["lineage"]})
    return Registration(model_package_arn=package, lineage_uri=uris["lineage"])


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: a `RegisterEvent`: the request, the finished job, its estimate and evaluation, the execution."""
    parsed = RegisterEvent.model_validate(event)
    environment = RegisterEnvironment.from_environ()
    where = Destination(
        artifacts_bucket=environment.artifacts_bucket,
        group=environment.model_package_group,
        image_uri=environment.image_uri,
        revision=environment.platform_revision,
    )
    result = register(parsed, s3=boto3.client("s3"), sagemaker=boto3.client("sagemaker"), where=where)
    metrics.record(Metric.MODELS_REGISTERED)
    return result.model_dump(mode="json")

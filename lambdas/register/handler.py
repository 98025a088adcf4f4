"""Register handler: a model package (pending approval) with the run's full lineage.

Lineage: the dataset location and the S3 version ID of every object read, the image digest,
the platform's git revision, hyperparameters, checkpoint location, metrics and cost. The full
record is written to the artifacts bucket; the model package points at it and carries a summary.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.shared.env import env_str

logger = Logger(service="training-platform")

_MAX_METADATA_VALUE = 256  # SageMaker's limit on CustomerMetadataProperties values


def dataset_versions(s3: Any, s3_uri: str) -> list[dict[str, str]]:
    """The current version of every object under the dataset prefix: what this run could have read."""
    bucket, _, prefix = s3_uri.removeprefix("s3://").partition("/")
    versions: list[dict[str, str]] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        versions.extend(
            {"key": v["Key"], "version_id": v["VersionId"], "etag": v["ETag"].strip('"')}
            for v in page.get("Versions", [])
            if v["IsLatest"]
        )
    return sorted(versions, key=lambda v: v["key"])


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _MAX_METADATA_VALUE else text[: _MAX_METADATA_VALUE - 1] + "…"


def register(
    event: dict[str, Any],
    *,
    s3: Any,
    sagemaker: Any,
    artifacts_bucket: str,
    group: str,
    image_uri: str,
    revision: str,
) -> dict[str, Any]:
    request, job, estimate = event["request"], event["job"], event["estimate"]
    base = request["job_name_base"]
    versions = dataset_versions(s3, request["dataset"]["s3_uri"])
    manifest = "".join(json.dumps(v, sort_keys=True) + "\n" for v in versions)
    prefix = f"runs/{base}/lineage"
    s3.put_object(Bucket=artifacts_bucket, Key=f"{prefix}/dataset-versions.jsonl", Body=manifest.encode())

    hourly = estimate["hourly_usd"]
    billable = job.get("billable_seconds")
    lineage = {
        "run_name": request["run_name"],
        "execution": event["execution"],
        "training_job": job["job_name"],
        "dataset": {
            "uri": request["dataset"]["uri"],
            "s3_uri": request["dataset"]["s3_uri"],
            "objects": len(versions),
            "versions_sha256": hashlib.sha256(manifest.encode()).hexdigest(),
            "versions_uri": f"s3://{artifacts_bucket}/{prefix}/dataset-versions.jsonl",
        },
        "image": image_uri,
        "platform_revision": revision,
        "hyperparameters": request["hyperparameters"],
        "cluster": {
            "instance_type": request["instance_type"],
            "instance_count": request["instance_count"],
            "spot": request["spot"],
            "interruptions": job.get("interruptions", 0),
        },
        "checkpoints": job.get("checkpoint"),
        "model_artifacts": job["model_artifacts"],
        "metrics": job["final_metrics"],
        "evaluation": event["evaluation"]["reason"],
        "cost": {
            "estimate_usd": estimate["max_cost_usd"],
            "billable_seconds": billable,
            # Billable seconds already net out spot savings; this is list price for them.
            "actual_usd": round(hourly * billable / 3600, 4) if billable is not None else None,
        },
    }
    lineage_key = f"{prefix}/lineage.json"
    s3.put_object(Bucket=artifacts_bucket, Key=lineage_key, Body=json.dumps(lineage, indent=2, sort_keys=True))
    metrics_key = f"{prefix}/metrics.json"
    s3.put_object(Bucket=artifacts_bucket, Key=metrics_key, Body=json.dumps(job["final_metrics"], sort_keys=True))

    package = sagemaker.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"{request['run_name']}: {event['evaluation']['reason']}"[:1000],
        ModelApprovalStatus="PendingManualApproval",
        ClientToken=job["job_name"],  # a retried registration returns the same package
        InferenceSpecification={
            "Containers": [{"Image": image_uri, "ModelDataUrl": job["model_artifacts"]}],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
        },
        ModelMetrics={
            "ModelQuality": {
                "Statistics": {"ContentType": "application/json", "S3Uri": f"s3://{artifacts_bucket}/{metrics_key}"}
            }
        },
        MetadataProperties={"CommitId": revision, "GeneratedBy": event["execution"], "ProjectId": request["run_name"]},
        CustomerMetadataProperties={
            "lineage": f"s3://{artifacts_bucket}/{lineage_key}",
            "training_job": job["job_name"],
            "dataset": _clip(request["dataset"]["uri"]),
            "dataset_versions_sha256": lineage["dataset"]["versions_sha256"],
            "image": _clip(image_uri),
            "platform_revision": revision,
            "checkpoints": _clip((job.get("checkpoint") or {}).get("uri", "none")),
            "hyperparameters": _clip(request["hyperparameters"]),
            "metrics": _clip(job["final_metrics"]),
            "cost_estimate_usd": str(estimate["max_cost_usd"]),
            "cost_actual_usd": str(lineage["cost"]["actual_usd"]),
        },
        Tags=request["tags"],
    )
    logger.info("model registered", extra={"package": package["ModelPackageArn"], "lineage": lineage_key})
    return {"model_package_arn": package["ModelPackageArn"], "lineage_uri": f"s3://{artifacts_bucket}/{lineage_key}"}


@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    return register(
        event,
        s3=boto3.client("s3"),
        sagemaker=boto3.client("sagemaker"),
        artifacts_bucket=env_str("ARTIFACTS_BUCKET"),
        group=env_str("MODEL_PACKAGE_GROUP"),
        image_uri=env_str("IMAGE_URI"),
        revision=env_str("PLATFORM_REVISION"),
    )

"""A registered model version pins its model archive and lineage record (S3 version and SHA-256), and promotion
refuses a version whose keys hold other bytes by then: acted out with IAM enforced."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import boto3
import pytest

from contract.layout import split_s3_uri
from localrun.aws.cfn import REGION
from tests.pipeline.conftest import Pipeline


def _registered(pipeline: Pipeline) -> tuple[str, dict[str, Any]]:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    (package,) = pipeline.model_packages()
    return arn, package


def _model_uri(package: dict[str, Any]) -> str:
    (container,) = package["InferenceSpecification"]["Containers"]
    return str(container["ModelDataUrl"])


def _current(uri: str) -> tuple[str, bytes]:
    bucket, key = split_s3_uri(uri)
    got = boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)
    return got["VersionId"], got["Body"].read()


def _overwrite(uri: str, body: bytes) -> None:
    """What any principal the bucket lets write there can do after registration."""
    bucket, key = split_s3_uri(uri)
    boto3.client("s3", region_name=REGION).put_object(Bucket=bucket, Key=key, Body=body)


def test_the_registry_and_the_lineage_pin_the_model_and_the_lineage(pipeline: Pipeline) -> None:
    _, package = _registered(pipeline)
    metadata = package["CustomerMetadataProperties"]
    for name, uri in (("model", _model_uri(package)), ("lineage", metadata["lineage"])):
        version, body = _current(uri)
        assert metadata[f"{name}_version_id"] == version
        assert metadata[f"{name}_sha256"] == hashlib.sha256(body).hexdigest()
    lineage = pipeline.lineage()
    assert lineage["model"] == {
        "uri": _model_uri(package),
        "version_id": metadata["model_version_id"],
        "sha256": metadata["model_sha256"],
    }


@pytest.mark.parametrize("artifact", ["model", "lineage"])
def test_a_model_whose_bytes_changed_after_registration_is_not_promoted(pipeline: Pipeline, artifact: str) -> None:
    arn, package = _registered(pipeline)
    uri = _model_uri(package) if artifact == "model" else package["CustomerMetadataProperties"]["lineage"]
    registered_version, _ = _current(uri)
    _overwrite(uri, json.dumps({"swapped": True}).encode())
    pipeline.decide("promotion", "approve", reason="val loss is fine")
    described = pipeline.finish(arn)

    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "ModelChanged", cause
    assert f"{uri} changed after the model was registered: registered version {registered_version}" in cause
    assert "the model is not promoted" in cause
    (after,) = pipeline.model_packages()
    assert after["ModelApprovalStatus"] == "Rejected"
    runs = pipeline.local.messages("TopicsRuns")
    told = json.loads(runs[-1]["Message"])
    assert told["model_package"] == package["ModelPackageArn"] and told["cause"] == cause


def test_the_same_bytes_written_again_are_still_the_registered_model(pipeline: Pipeline) -> None:
    arn, package = _registered(pipeline)
    uri = _model_uri(package)
    _, body = _current(uri)
    _overwrite(uri, body)  # a new version, the same bytes
    pipeline.decide("promotion", "approve", reason="val loss is fine")
    described = pipeline.finish(arn)

    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    (after,) = pipeline.model_packages()
    assert after["ModelApprovalStatus"] == "Approved"

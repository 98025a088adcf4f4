"""lambdas/register/pin.py and verify.py on a versioned bucket: what a package pins, and when promotion refuses it."""

from __future__ import annotations

import hashlib
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambdas.register.pin import LINEAGE, MODEL, pin
from lambdas.register.verify import ModelChangedError, verify

MODEL_URI, LINEAGE_URI = "s3://artifacts/runs/r-1/output/model.tar.gz", "s3://artifacts/runs/r/lineage/lineage.json"


def _package(s3: Any) -> dict[str, Any]:
    """A package as Register creates it: the model's key, the lineage's, and both pins."""
    metadata = {LINEAGE: LINEAGE_URI, **pin(s3, MODEL_URI).metadata(MODEL), **pin(s3, LINEAGE_URI).metadata(LINEAGE)}
    return {
        "ModelPackageArn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1",
        "InferenceSpecification": {"Containers": [{"Image": "i", "ModelDataUrl": MODEL_URI}]},
        "CustomerMetadataProperties": metadata,
    }


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="artifacts")
        client.put_bucket_versioning(Bucket="artifacts", VersioningConfiguration={"Status": "Enabled"})
        client.put_object(Bucket="artifacts", Key="runs/r-1/output/model.tar.gz", Body=b"weights")
        client.put_object(Bucket="artifacts", Key="runs/r/lineage/lineage.json", Body=b"{}")
        yield client


def test_a_pin_is_the_keys_version_and_the_digest_of_its_bytes(s3: Any) -> None:
    pinned = pin(s3, MODEL_URI)
    head = s3.head_object(Bucket="artifacts", Key="runs/r-1/output/model.tar.gz")
    assert (pinned.version_id, pinned.sha256) == (head["VersionId"], hashlib.sha256(b"weights").hexdigest())
    assert verify(s3, _package(s3))[MODEL] == pinned


def test_other_bytes_under_the_key_refuse_promotion_and_say_what_changed(s3: Any) -> None:
    package = _package(s3)
    s3.put_object(Bucket="artifacts", Key="runs/r-1/output/model.tar.gz", Body=b"other weights")
    with pytest.raises(ModelChangedError) as refused:
        verify(s3, package)
    registered = package["CustomerMetadataProperties"]["model_version_id"]
    assert f"{MODEL_URI} changed after the model was registered: registered version {registered}" in str(refused.value)
    assert hashlib.sha256(b"other weights").hexdigest() in str(refused.value)


def test_the_pinned_version_deleted_refuses_promotion(s3: Any) -> None:
    """Deleting the current version makes an older one current: other bytes, though no one wrote any."""
    s3.put_object(Bucket="artifacts", Key="runs/r-1/output/model.tar.gz", Body=b"weights v2")
    package = _package(s3)
    version = package["CustomerMetadataProperties"]["model_version_id"]
    s3.delete_object(Bucket="artifacts", Key="runs/r-1/output/model.tar.gz", VersionId=version)
    with pytest.raises(ModelChangedError, match="changed after the model was registered"):
        verify(s3, package)


def test_a_package_without_pins_is_not_promoted_blindly(s3: Any) -> None:
    package = _package(s3)
    package["CustomerMetadataProperties"] = {LINEAGE: LINEAGE_URI}
    with pytest.raises(ModelChangedError, match="holds no version and digest of its model"):
        verify(s3, package)

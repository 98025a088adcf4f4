"""Before promotion: a model version's artifacts still hold the bytes Register pinned (lambdas/register/pin.py).

A key that holds its pinned version holds the pinned bytes (a version never changes). A key that holds another
version (overwritten, or its pinned version deleted) is hashed: the same bytes written again are the same model;
other bytes refuse the promotion with `ModelChangedError`, which names the artifact, both versions and both digests.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger
from pydantic import BaseModel, ConfigDict

from lambdas.register.pin import LINEAGE, MODEL, Pinned, current_version, sha256_of
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


class ModelChangedError(Exception):
    """A registered model version's artifact no longer holds the bytes it was registered with: not promoted."""


class VerifyEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_package_arn: str


def registered_pins(package: dict[str, Any]) -> dict[str, Pinned]:
    """The artifacts a model package pins, by name, as its metadata holds them."""
    metadata = package.get("CustomerMetadataProperties", {})
    (container,) = package["InferenceSpecification"]["Containers"]
    return {
        MODEL: Pinned.from_metadata(container["ModelDataUrl"], MODEL, metadata),
        LINEAGE: Pinned.from_metadata(metadata.get(LINEAGE, ""), LINEAGE, metadata),
    }


def verify(s3: Any, package: dict[str, Any]) -> dict[str, Pinned]:
    """The package's pinned artifacts, each checked against what its key holds now; `ModelChangedError` if not."""
    pins = registered_pins(package)
    for name, pinned in pins.items():
        if not (pinned.uri and pinned.version_id and pinned.sha256):
            raise ModelChangedError(
                f"{package['ModelPackageArn']}: the registry holds no version and digest of its {name} "
                f"({pinned.uri or 'no URI'}), so its bytes cannot be checked; run the training again to register it"
            )
        now = current_version(s3, pinned.uri)
        if now == pinned.version_id:
            continue
        digest = sha256_of(s3, pinned.uri, now)
        if digest != pinned.sha256:
            raise ModelChangedError(
                f"{pinned.uri} changed after the model was registered: registered version {pinned.version_id} "
                f"(SHA-256 {pinned.sha256}), now version {now} (SHA-256 {digest}); the {name} is not the one "
                "evaluated and approved, so the model is not promoted"
            )
        logger.warning("rewritten with the same bytes", extra={"artifact": pinned.uri, "version": now})
    return pins


@classified
@logger.inject_lambda_context
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: the model package to promote. Returns its pinned artifacts; raises `ModelChangedError` if one changed."""
    parsed = VerifyEvent.model_validate(event)
    package = boto3.client("sagemaker").describe_model_package(ModelPackageName=parsed.model_package_arn)
    pins = verify(boto3.client("s3"), package)
    return {name: pinned.uri for name, pinned in pins.items()}

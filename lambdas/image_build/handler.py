"""Build the training image in CodeBuild and wait for it (CDK Provider framework: onEvent + isComplete).

Create/Update start a build that pushes `<repository>:<ImageTag>`, where ImageTag is the
content hash of `training/`, so an unchanged package never rebuilds and a tag is never
overwritten (the repository's tags are immutable). Delete keeps every image.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.shared.errors import classified

logger = Logger(service="training-platform")

_FAILED = {"FAILED", "FAULT", "STOPPED", "TIMED_OUT"}


class ImageBuildError(RuntimeError):
    """The CodeBuild build did not produce the image."""


def start_build(props: dict[str, Any], codebuild: Any) -> dict[str, Any]:
    """Start the build for the requested tag; the physical ID is the image reference."""
    build = codebuild.start_build(
        projectName=props["ProjectName"],
        environmentVariablesOverride=[{"name": "IMAGE_TAG", "value": props["ImageTag"], "type": "PLAINTEXT"}],
    )["build"]
    logger.info("started image build", extra={"build_id": build["id"], "image_tag": props["ImageTag"]})
    return {
        "PhysicalResourceId": f"{props['RepositoryName']}:{props['ImageTag']}",
        "Data": {"BuildId": build["id"]},
    }


def check_build(build_id: str, props: dict[str, Any], codebuild: Any, ecr: Any) -> dict[str, Any]:
    """IsComplete once the build succeeded and the tag exists; raise with the log link if it failed."""
    build = codebuild.batch_get_builds(ids=[build_id])["builds"][0]
    status = build["buildStatus"]
    if status == "IN_PROGRESS":
        return {"IsComplete": False}
    if status in _FAILED or status != "SUCCEEDED":
        link = build.get("logs", {}).get("deepLink", "(no log link)")
        raise ImageBuildError(f"image build {build_id} ended {status}; logs: {link}")
    image = ecr.describe_images(repositoryName=props["RepositoryName"], imageIds=[{"imageTag": props["ImageTag"]}])[
        "imageDetails"
    ][0]
    digest = image["imageDigest"]
    repository = ecr.describe_repositories(repositoryNames=[props["RepositoryName"]])["repositories"][0]
    uri = f"{repository['repositoryUri']}@{digest}"
    logger.info("image ready", extra={"image_tag": props["ImageTag"], "image": uri})
    return {"IsComplete": True, "Data": {"ImageDigest": digest, "ImageTag": props["ImageTag"], "ImageUri": uri}}


@classified
@logger.inject_lambda_context
def on_event(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    return start_build(event["ResourceProperties"], boto3.client("codebuild"))


@classified
@logger.inject_lambda_context
def is_complete(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    if event["RequestType"] == "Delete":
        return {"IsComplete": True}
    return check_build(
        event["Data"]["BuildId"], event["ResourceProperties"], boto3.client("codebuild"), boto3.client("ecr")
    )

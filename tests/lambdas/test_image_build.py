"""The image-build custom resource, against botocore's real request/response models (Stubber)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from lambdas.image_build import handler

PROPS = {"ProjectName": "proj", "RepositoryName": "repo", "ImageTag": "a" * 64}


@pytest.fixture
def clients() -> Any:
    codebuild = boto3.client("codebuild", region_name="us-east-1")
    ecr = boto3.client("ecr", region_name="us-east-1")
    with Stubber(codebuild) as cb, Stubber(ecr) as er:
        yield codebuild, ecr, cb, er
        cb.assert_no_pending_responses()
        er.assert_no_pending_responses()


def test_start_build_passes_the_tag_and_names_the_image(clients: Any) -> None:
    codebuild, _, cb, _ = clients
    cb.add_response(
        "start_build",
        {"build": {"id": "proj:1234", "buildStatus": "IN_PROGRESS"}},
        {
            "projectName": "proj",
            "environmentVariablesOverride": [{"name": "IMAGE_TAG", "value": "a" * 64, "type": "PLAINTEXT"}],
        },
    )
    result = handler.start_build(PROPS, codebuild)
    assert result == {"PhysicalResourceId": f"repo:{'a' * 64}", "Data": {"BuildId": "proj:1234"}}


def test_in_progress_is_not_complete(clients: Any) -> None:
    codebuild, ecr, cb, _ = clients
    cb.add_response(
        "batch_get_builds", {"builds": [{"id": "proj:1", "buildStatus": "IN_PROGRESS"}]}, {"ids": ["proj:1"]}
    )
    assert handler.check_build("proj:1", PROPS, codebuild, ecr) == {"IsComplete": False}


def test_success_returns_the_image_digest(clients: Any) -> None:
    codebuild, ecr, cb, er = clients
    cb.add_response("batch_get_builds", {"builds": [{"id": "proj:1", "buildStatus": "SUCCEEDED"}]}, {"ids": ["proj:1"]})
    digest = "sha256:" + "b" * 64
    er.add_response(
        "describe_images",
        {"imageDetails": [{"imageDigest": digest, "imageTags": ["a" * 64]}]},
        {"repositoryName": "repo", "imageIds": [{"imageTag": "a" * 64}]},
    )
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/repo"
    er.add_response(
        "describe_repositories",
        {"repositories": [{"repositoryName": "repo", "repositoryUri": uri}]},
        {"repositoryNames": ["repo"]},
    )
    assert handler.check_build("proj:1", PROPS, codebuild, ecr) == {
        "IsComplete": True,
        "Data": {"ImageDigest": digest, "ImageTag": "a" * 64, "ImageUri": f"{uri}@{digest}"},
    }


@pytest.mark.parametrize("status", ["FAILED", "FAULT", "STOPPED", "TIMED_OUT"])
def test_failed_build_fails_the_deploy_with_the_log_link(clients: Any, status: str) -> None:
    codebuild, ecr, cb, _ = clients
    cb.add_response(
        "batch_get_builds",
        {"builds": [{"id": "proj:1", "buildStatus": status, "logs": {"deepLink": "https://console/logs/1"}}]},
        {"ids": ["proj:1"]},
    )
    with pytest.raises(
        handler.ImageBuildError, match=f"image build proj:1 ended {status}; logs: https://console/logs/1"
    ):
        handler.check_build("proj:1", PROPS, codebuild, ecr)


class _Context:
    function_name = "check"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:check"
    aws_request_id = "req-1"


def test_delete_keeps_every_image() -> None:
    # No client is created or called on Delete: the repository and its images are retained.
    event = {"RequestType": "Delete", "PhysicalResourceId": "repo:tag", "ResourceProperties": PROPS}
    assert handler.on_event(event, _Context()) == {"PhysicalResourceId": "repo:tag"}
    assert handler.is_complete(event, _Context()) == {"IsComplete": True}

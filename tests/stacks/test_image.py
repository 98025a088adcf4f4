"""Image stack: the platform's own repository and the CodeBuild-built training image."""

from __future__ import annotations

import json
import re
from typing import Any

from aws_cdk.assertions import Match

from stacks.constructs.training_image import WAITER_LOGGING
from tests.support.templates import get_att, logical_id, resources, template


def test_repository_is_immutable_scanned_and_kms_encrypted(platform: Any) -> None:
    t = template(platform, platform.image)
    t.has_resource(
        "AWS::ECR::Repository",
        {
            "Properties": Match.object_like(
                {
                    "ImageTagMutability": "IMMUTABLE",
                    "ImageScanningConfiguration": {"ScanOnPush": True},
                    "EncryptionConfiguration": {
                        "EncryptionType": "KMS",
                        "KmsKey": {
                            "Fn::GetStackOutput": Match.object_like(
                                {
                                    "StackName": platform.data.stack_name,
                                    "OutputName": Match.string_like_regexp("DataKey"),
                                }
                            )
                        },
                    },
                }
            ),
            "DeletionPolicy": "Retain",
        },
    )
    repo = next(iter(resources(platform, platform.image, "AWS::ECR::Repository").values()))
    rules = json.loads(repo["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert [
        (r["selection"]["tagStatus"], r["selection"]["countType"], r["selection"]["countNumber"]) for r in rules
    ] == [
        ("untagged", "sinceImagePushed", 1),
        ("any", "imageCountMoreThan", 30),
    ]


def test_codebuild_builds_from_the_dlc_and_pushes_to_the_platform_repository(platform: Any) -> None:
    repo = logical_id(platform, platform.image, "AWS::ECR::Repository", "Repository")
    project = next(iter(resources(platform, platform.image, "AWS::CodeBuild::Project").values()))["Properties"]
    env = {v["Name"]: v["Value"] for v in project["Environment"]["EnvironmentVariables"]}
    assert env["BASE_IMAGE"] == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.10.0-gpu-py313"
    assert env["REPOSITORY_NAME"] == {"Ref": repo}
    assert project["Environment"]["PrivilegedMode"] is True
    assert project["TimeoutInMinutes"] == 55
    spec = json.loads(project["Source"]["BuildSpec"])
    build = " ".join(spec["phases"]["build"]["commands"])
    assert 'docker build --pull --build-arg BASE_IMAGE="$BASE_IMAGE"' in build
    assert 'docker push "$REPOSITORY_URI:$IMAGE_TAG"' in build
    # An existing tag is never rebuilt (immutable tags would reject the push).
    assert build.index("describe-images") < build.index("docker build")


def test_build_role_pulls_only_the_dlc_repository(platform: Any) -> None:
    policies = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for k, p in resources(platform, platform.image, "AWS::IAM::Policy").items()
        if k.startswith("TrainingImageBuildRole")
    ]
    statements = [s for doc in policies for s in doc]
    pull = next(s for s in statements if s.get("Sid") == "PullDeepLearningContainer")
    assert pull["Resource"] == {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":ecr:us-east-1:763104351884:repository/pytorch-training"]]
    }
    wildcard = [s for s in statements if s["Resource"] == "*"]
    assert [s["Action"] for s in wildcard] == ["ecr:GetAuthorizationToken"]


def test_deploy_waits_for_the_content_addressed_image(platform: Any) -> None:
    t = template(platform, platform.image)
    image = platform.image.training_image
    t.has_resource_properties(
        "Custom::TrainingImage",
        {
            "ProjectName": {"Ref": logical_id(platform, platform.image, "AWS::CodeBuild::Project", "Build")},
            "RepositoryName": {"Ref": logical_id(platform, platform.image, "AWS::ECR::Repository", "Repository")},
            "ImageTag": image.image_tag,
        },
    )
    assert len(image.image_tag) == 64  # sha256 of the training/ package
    handlers = {
        f["Properties"]["Handler"]: f["Properties"]
        for f in resources(platform, platform.image, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler", "").startswith("lambdas.")
    }
    assert set(handlers) == {"lambdas.image_build.handler.on_event", "lambdas.image_build.handler.is_complete"}
    for props in handlers.values():
        assert props["Runtime"] == "python3.14"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["ReservedConcurrentExecutions"] == 5
        assert len(props["Layers"]) == 1 and props["Layers"][0]["Ref"].startswith(
            "SsmParameterValueawsservicepowertools"
        )


def test_powertools_layer_comes_from_the_pinned_public_parameter(platform: Any) -> None:
    from importlib import metadata

    params = platform.assembly.get_stack_by_name(platform.image.stack_name).template["Parameters"]
    ssm = [p for k, p in params.items() if k.startswith("SsmParameterValue")]
    version = metadata.version("aws-lambda-powertools")
    assert [p["Default"] for p in ssm] == [f"/aws/service/powertools/python/x86_64/python3.14/{version}"]


def test_handler_roles_are_scoped_to_the_project_and_repository(platform: Any) -> None:
    project = get_att(logical_id(platform, platform.image, "AWS::CodeBuild::Project", "Build"), "Arn")
    repo = get_att(logical_id(platform, platform.image, "AWS::ECR::Repository", "Repository"), "Arn")
    statements = {
        k: p["Properties"]["PolicyDocument"]["Statement"]
        for k, p in resources(platform, platform.image, "AWS::IAM::Policy").items()
        if "StartBuild" in k or "CheckBuild" in k
    }
    start = next(v for k, v in statements.items() if "StartBuild" in k)
    check = next(v for k, v in statements.items() if "CheckBuild" in k)
    assert {"Action": "codebuild:StartBuild", "Effect": "Allow", "Resource": project} in start
    assert {"Action": "codebuild:BatchGetBuilds", "Effect": "Allow", "Resource": project} in check
    assert {"Action": ["ecr:DescribeImages", "ecr:DescribeRepositories"], "Effect": "Allow", "Resource": repo} in check


def test_the_waiters_acknowledgement_names_exactly_the_actions_it_acknowledges(platform: Any) -> None:
    """The waiter's AwsSolutions-IAM5[Resource::*] reason names each action of its statement on "*", and no other."""
    policies = resources(platform, platform.image, "AWS::IAM::Policy")
    (statement,) = [
        s
        for logical, policy in policies.items()
        if "waiterstatemachine" in logical
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if s["Resource"] == "*"
    ]
    actions = set(statement["Action"])
    assert len(actions) == 10, actions
    named = set(re.findall(r"\blogs:[A-Za-z]+", WAITER_LOGGING))
    assert named == actions

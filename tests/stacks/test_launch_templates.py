"""The launch templates of the instances the platform launches itself (AWS Batch, the EFA template)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stacks.constructs.batch_cluster import ECS_BLOCK_IMDS
from tests.support.iam import AssemblyIam


def _launch_templates(built: Any) -> list[tuple[str, dict[str, Any]]]:
    iam = AssemblyIam(Path(built.assembly.directory))
    found = [(logical, props["LaunchTemplateData"]) for _, logical, props in iam.resources("AWS::EC2::LaunchTemplate")]
    assert len(found) >= 2, "the Batch compute environment's and the network stack's EFA launch templates"
    return found


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_containers_cannot_reach_the_instance_role(built: str, request: Any) -> None:
    """IMDSv2 only, one hop: a container behind the Docker bridge (two hops) gets no instance credentials."""
    for logical, data in _launch_templates(request.getfixturevalue(built)):
        options = data.get("MetadataOptions", {})
        assert options.get("HttpTokens") == "required", logical
        assert options.get("HttpPutResponseHopLimit") == 1, logical


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_awsvpc_jobs_cannot_reach_the_instance_metadata(built: str, request: Any) -> None:
    """Multi-node jobs run in awsvpc mode, their own network namespace on a task ENI: the hop limit
    does not cover them, the ECS agent's ECS_AWSVPC_BLOCK_IMDS does."""
    with_user_data = [
        (logical, data) for logical, data in _launch_templates(request.getfixturevalue(built)) if "UserData" in data
    ]
    assert with_user_data, "the Batch compute environment's launch template"
    for logical, data in with_user_data:
        assert f"echo {ECS_BLOCK_IMDS} >> /etc/ecs/ecs.config" in json.dumps(data["UserData"]), logical


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_instances_get_no_public_ip(built: str, request: Any) -> None:
    """Control Tower's CT.EC2.PR.9: every network interface of a launch template says AssociatePublicIpAddress
    false, not only the primary one (accounts that enforce it as a CloudFormation hook refuse anything else)."""
    for logical, data in _launch_templates(request.getfixturevalue(built)):
        interfaces = data["NetworkInterfaces"]
        assert len(interfaces) > 1, f"{logical}: one interface per network card of an EFA type"
        assert [i.get("AssociatePublicIpAddress") for i in interfaces] == [False] * len(interfaces), logical

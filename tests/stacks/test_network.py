"""Network stack: isolated VPC, endpoints, EFA and Lustre security groups, placement."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match

from tests.support.templates import get_att, logical_id, resources, template


def test_private_subnets_and_no_nat_by_default(platform: Any) -> None:
    t = template(platform, platform.network)
    t.resource_count_is("AWS::EC2::NatGateway", 0)
    t.resource_count_is("AWS::EC2::InternetGateway", 0)
    t.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.20.0.0/16", "EnableDnsHostnames": True})
    subnets = resources(platform, platform.network, "AWS::EC2::Subnet")
    assert len(subnets) == 4  # training + services in each of 2 AZs
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())
    training = [s for k, s in subnets.items() if "training" in k]
    assert sorted(s["Properties"]["CidrBlock"] for s in training) == ["10.20.0.0/20", "10.20.16.0/20"]


def test_training_subnet_is_the_first_az(platform: Any) -> None:
    subnet = platform.network.network.training_subnet
    assert "trainingSubnet1" in subnet.node.path
    azs = [
        s["Properties"]["AvailabilityZone"]
        for k, s in resources(platform, platform.network, "AWS::EC2::Subnet").items()
        if "trainingSubnet1" in k
    ]
    assert azs == [{"Fn::Select": [0, {"Fn::GetAZs": ""}]}]


def test_flow_logs_all_traffic_to_a_kms_encrypted_group(platform: Any) -> None:
    t = template(platform, platform.network)
    key = logical_id(platform, platform.network, "AWS::KMS::Key", "FlowLogsKey")
    group = logical_id(platform, platform.network, "AWS::Logs::LogGroup", "FlowLogs")
    t.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL", "LogGroupName": {"Ref": group}})
    t.has_resource_properties("AWS::Logs::LogGroup", {"KmsKeyId": get_att(key, "Arn"), "RetentionInDays": 365})
    t.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_efa_security_group_allows_all_traffic_to_and_from_itself_only(platform: Any) -> None:
    sg = logical_id(platform, platform.network, "AWS::EC2::SecurityGroup", "TrainingSg")
    own = get_att(sg, "GroupId")
    all_traffic_in = [
        r["Properties"]
        for r in resources(platform, platform.network, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == own and r["Properties"]["IpProtocol"] == "-1"
    ]
    all_traffic_out = [
        r["Properties"]
        for r in resources(platform, platform.network, "AWS::EC2::SecurityGroupEgress").values()
        if r["Properties"]["GroupId"] == own and r["Properties"]["IpProtocol"] == "-1"
    ]
    assert [p["SourceSecurityGroupId"] for p in all_traffic_in] == [own]
    assert [p["DestinationSecurityGroupId"] for p in all_traffic_out] == [own]
    inline = resources(platform, platform.network, "AWS::EC2::SecurityGroup")[sg]["Properties"]
    assert "SecurityGroupIngress" not in inline
    # Outside the group: HTTPS only.
    assert all(e["IpProtocol"] == "tcp" and e["FromPort"] == e["ToPort"] == 443 for e in inline["SecurityGroupEgress"])


def test_lustre_ports_both_ways_between_training_and_file_servers(platform: Any) -> None:
    training = get_att(logical_id(platform, platform.network, "AWS::EC2::SecurityGroup", "TrainingSg"), "GroupId")
    lustre = get_att(logical_id(platform, platform.network, "AWS::EC2::SecurityGroup", "LustreSg"), "GroupId")

    def rules(type_: str, group: dict[str, Any], peer_key: str, peer: dict[str, Any]) -> set[tuple[int, int]]:
        return {
            (r["Properties"]["FromPort"], r["Properties"]["ToPort"])
            for r in resources(platform, platform.network, type_).values()
            if r["Properties"]["GroupId"] == group and r["Properties"].get(peer_key) == peer
        }

    lustre_ports = {(988, 988), (1018, 1023)}
    assert lustre_ports <= rules("AWS::EC2::SecurityGroupIngress", lustre, "SourceSecurityGroupId", training)
    assert lustre_ports <= rules("AWS::EC2::SecurityGroupEgress", lustre, "DestinationSecurityGroupId", training)
    assert lustre_ports <= rules("AWS::EC2::SecurityGroupIngress", training, "SourceSecurityGroupId", lustre)
    assert lustre_ports <= rules("AWS::EC2::SecurityGroupEgress", training, "DestinationSecurityGroupId", lustre)
    assert lustre_ports <= rules("AWS::EC2::SecurityGroupIngress", lustre, "SourceSecurityGroupId", lustre)


@pytest.mark.parametrize("stack_name", ["network", "data", "image"])
def test_no_ingress_from_anywhere(platform: Any, stack_name: str) -> None:
    stack = getattr(platform, stack_name)
    for sg in resources(platform, stack, "AWS::EC2::SecurityGroup").values():
        for rule in sg["Properties"].get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") not in ("0.0.0.0/0",) and rule.get("CidrIpv6") != "::/0"
    for rule in resources(platform, stack, "AWS::EC2::SecurityGroupIngress").values():
        assert "CidrIp" not in rule["Properties"] and "CidrIpv6" not in rule["Properties"]


def test_endpoint_set(platform: Any) -> None:
    endpoints = resources(platform, platform.network, "AWS::EC2::VPCEndpoint").values()
    names = {
        (e["Properties"]["ServiceName"]["Fn::Join"][1][2].lstrip("."), e["Properties"]["VpcEndpointType"])
        for e in endpoints
    }
    assert names == {
        ("s3", "Gateway"),
        ("dynamodb", "Gateway"),
        *(
            (s, "Interface")
            for s in (
                "sagemaker.api",
                "ecr.api",
                "ecr.dkr",
                "sts",
                "logs",
                "monitoring",
                "kms",
                "states",
                "sns",
                "xray",
                "batch",
                "ecs",
                "ecs-agent",
                "ecs-telemetry",
            )
        ),
    }
    for e in endpoints:
        if e["Properties"]["VpcEndpointType"] == "Interface":
            assert e["Properties"]["PrivateDnsEnabled"] is True
            assert len(e["Properties"]["SubnetIds"]) == 2


def test_endpoint_policies_scope_to_this_account(platform: Any) -> None:
    t = template(platform, platform.network)
    own_account = {"Ref": "AWS::AccountId"}
    t.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "ServiceName": Match.object_like({"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]}),
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {"Condition": {"StringEquals": {"aws:ResourceAccount": own_account}}, "Action": "s3:*"}
                        )
                    ]
                ),
                "Version": "2012-10-17",
            },
        },
    )
    scoped = 0
    for e in resources(platform, platform.network, "AWS::EC2::VPCEndpoint").values():
        service = e["Properties"]["ServiceName"]["Fn::Join"][1][2]
        policy = e["Properties"].get("PolicyDocument")
        if service in (".xray", ".ecs", ".ecs-agent", ".ecs-telemetry"):
            assert policy is None
            continue
        statements = policy["Statement"]
        # Every statement is conditioned on this account, except reading ECR's image-layer bucket.
        for st in statements:
            if st.get("Sid") == "EcrImageLayers":
                assert st["Action"] == "s3:GetObject"
                continue
            assert st["Condition"]["StringEquals"] in (
                {"aws:PrincipalAccount": own_account},
                {"aws:ResourceAccount": own_account},
            )
        scoped += 1
    assert scoped == 12


def test_cluster_placement_group_and_efa_launch_template(platform: Any) -> None:
    t = template(platform, platform.network)
    t.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    lt = next(iter(resources(platform, platform.network, "AWS::EC2::LaunchTemplate").values()))
    data = lt["Properties"]["LaunchTemplateData"]
    assert data["InstanceType"] == "p5.48xlarge"
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    nics = data["NetworkInterfaces"]
    assert len(nics) == 32  # one EFA interface per network card of a p5.48xlarge
    assert {n["InterfaceType"] for n in nics} == {"efa"}
    assert [n["NetworkCardIndex"] for n in nics] == list(range(32))
    assert [n["DeviceIndex"] for n in nics] == [0] + [1] * 31
    training_sg = get_att(logical_id(platform, platform.network, "AWS::EC2::SecurityGroup", "TrainingSg"), "GroupId")
    assert all(n["Groups"] == [training_sg] for n in nics)
    assert {n["SubnetId"]["Ref"] for n in nics} == {
        k for k in resources(platform, platform.network, "AWS::EC2::Subnet") if "trainingSubnet1" in k
    }


def test_nat_is_optional(variant: Any) -> None:
    t = template(variant, variant.network)
    t.resource_count_is("AWS::EC2::NatGateway", 1)
    t.resource_count_is("AWS::EC2::InternetGateway", 1)
    assert {
        s["Properties"]["AvailabilityZone"] for s in resources(variant, variant.network, "AWS::EC2::Subnet").values()
    } == {
        "eu-west-1a",
        "eu-west-1b",
    }
    training = [
        s["Properties"]["AvailabilityZone"]
        for k, s in resources(variant, variant.network, "AWS::EC2::Subnet").items()
        if "trainingSubnet1" in k
    ]
    assert training == ["eu-west-1b"]


def test_launch_template_follows_the_configured_instance_type(variant: Any) -> None:
    lt = next(iter(resources(variant, variant.network, "AWS::EC2::LaunchTemplate").values()))
    data = lt["Properties"]["LaunchTemplateData"]
    assert data["InstanceType"] == "p4d.24xlarge"
    assert len(data["NetworkInterfaces"]) == 4

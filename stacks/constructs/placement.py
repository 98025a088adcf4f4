"""Cluster placement group and an EFA launch template for the EC2 / AWS Batch training path."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from contract.catalog import InstanceType

# IMDSv2 answers one hop only: the instance itself, never a container behind the Docker bridge,
# so a job cannot take the instance role (its own role comes from the ECS credentials endpoint).
INSTANCE_METADATA_HOP_LIMIT = 1


class EfaClusterPlacement(Construct):
    """A cluster placement group plus a launch template with one EFA interface per network card.

    SageMaker places its own clusters; this is for instances the platform launches itself
    (AWS Batch multi-node jobs), which must share a placement group and an EFA security group.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance: InstanceType,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, id_)
        self.placement_group = ec2.PlacementGroup(self, "Group", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        interfaces = efa_interfaces(instance, subnet=subnet, security_group=security_group)
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                instance_type=instance.ec2_name,
                placement=ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.placement_group_name),
                network_interfaces=interfaces,
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_tokens="required",
                    http_endpoint="enabled",
                    http_put_response_hop_limit=INSTANCE_METADATA_HOP_LIMIT,
                ),
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
            ),
        )


def efa_interfaces(
    instance: InstanceType, *, subnet: ec2.ISubnet, security_group: ec2.ISecurityGroup
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """One interface per network card, EFA where the type has it, in the training subnet and security group,
    each saying it takes no public IP (Control Tower's CT.EC2.PR.9 asks it of every interface, not only the
    primary one, which alone could take one)."""
    # Card 0 carries the primary interface (device 0); the other cards' EFA interfaces are device 1.
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            device_index=0 if card == 0 else 1,
            network_card_index=card,
            interface_type="efa" if instance.supports_efa else None,
            groups=[security_group.security_group_id],
            subnet_id=subnet.subnet_id,
            delete_on_termination=True,
            associate_public_ip_address=False,
            description=f"training network card {card}",
        )
        for card in range(max(1, instance.efa_interfaces))
    ]

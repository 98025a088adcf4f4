"""Network stack: the training VPC, its endpoints and security groups, the EFA placement."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from contract.catalog import instance_type
from stacks.constructs.network import TrainingNetwork
from stacks.constructs.placement import EfaClusterPlacement
from stacks.settings import PlatformSettings


class NetworkStack(Stack):
    def __init__(self, scope: Construct, id_: str, *, settings: PlatformSettings, **kwargs: Any) -> None:
        super().__init__(scope, id_, **kwargs)
        self.network = TrainingNetwork(self, "Network", settings=settings.network)
        self.placement = EfaClusterPlacement(
            self,
            "ClusterPlacement",
            instance=instance_type(settings.network.largest_cluster.instance_type),
            subnet=self.network.training_subnet,
            security_group=self.network.training_sg,
        )

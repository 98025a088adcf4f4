"""The training VPC: isolated subnets, AWS APIs through endpoints, EFA and Lustre security groups."""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.constructs.keys import account_key
from stacks.constructs.logs import allow_cloudwatch_logs, encrypted_log_group
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy
from stacks.settings import NetworkSettings

LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))

# Interface endpoints: what training jobs, the platform's Lambdas and the EC2/Batch path call.
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "Kms": ec2.InterfaceVpcEndpointAwsService.KMS,
    "StepFunctions": ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
    "Sns": ec2.InterfaceVpcEndpointAwsService.SNS,
    "XRay": ec2.InterfaceVpcEndpointAwsService.XRAY,
    # The Batch path: its handlers call Batch; its instances' ECS agent registers and reports through ECS's three.
    "Batch": ec2.InterfaceVpcEndpointAwsService.BATCH,
    "Ecs": ec2.InterfaceVpcEndpointAwsService.ECS,
    "EcsAgent": ec2.InterfaceVpcEndpointAwsService.ECS_AGENT,
    "EcsTelemetry": ec2.InterfaceVpcEndpointAwsService.ECS_TELEMETRY,
}
# Services whose endpoints do not take a policy, or whose support for one the platform has not confirmed
# (ECS's), keep the default (full access).
_NO_ENDPOINT_POLICY = frozenset({"XRay", "Ecs", "EcsAgent", "EcsTelemetry"})


class TrainingNetwork(Construct):
    """VPC with a single-AZ training subnet (EFA traffic must stay in one subnet) and no internet path.

    Subnet groups: `training` (one per AZ; the first AZ's is used, the others are spares to move
    to when an AZ lacks capacity), `services` (Lambdas and interface endpoints) and, only when
    NAT gateways are configured, `public`.
    """

    def __init__(self, scope: Construct, id_: str, *, settings: NetworkSettings) -> None:
        super().__init__(scope, id_)
        egress = settings.nat_gateways > 0
        private = ec2.SubnetType.PRIVATE_WITH_EGRESS if egress else ec2.SubnetType.PRIVATE_ISOLATED
        subnets = [
            ec2.SubnetConfiguration(name="training", subnet_type=private, cidr_mask=settings.training_subnet_mask),
            ec2.SubnetConfiguration(name="services", subnet_type=private, cidr_mask=24),
        ]
        if egress:
            public = ec2.SubnetConfiguration(
                name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=26, map_public_ip_on_launch=False
            )
            subnets.insert(0, public)

        azs = settings.availability_zones
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(settings.vpc_cidr),
            availability_zones=azs or None,
            max_azs=None if azs else settings.az_count,
            nat_gateways=settings.nat_gateways,
            subnet_configuration=subnets,
            restrict_default_security_group=True,
            enable_dns_hostnames=True,
            enable_dns_support=True,
        )
        for subnet in self.vpc.public_subnets:
            for pack in ("NIST.800.53.R5", "HIPAA.Security"):
                acknowledge(
                    subnet,
                    f"{pack}-VPCNoUnrestrictedRouteToIGW",
                    "Public subnets exist only when network.nat_gateways > 0: they hold the NAT gateways, "
                    "whose default route must reach the internet gateway. No workload runs in them.",
                )
        self.training_subnet: ec2.ISubnet = self.vpc.select_subnets(subnet_group_name="training").subnets[0]
        self.services_subnets = ec2.SubnetSelection(subnet_group_name="services")

        self.flow_logs_key = account_key(self, "FlowLogsKey", description="Encrypts the training VPC's flow logs")
        allow_cloudwatch_logs(self.flow_logs_key)
        self.flow_logs = encrypted_log_group(
            self, "FlowLogs", key=self.flow_logs_key, retention_days=settings.flow_log_retention_days
        )
        flow_log = self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_logs),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        acknowledge_inline_policy(flow_log.node.find_child("IAMRole"))

        self._security_groups()
        self._endpoints()

    def _security_groups(self) -> None:
        vpc = self.vpc
        self.endpoint_sg = ec2.SecurityGroup(
            self, "EndpointSg", vpc=vpc, allow_all_outbound=False, description="Interface endpoints: HTTPS in"
        )
        self.training_sg = ec2.SecurityGroup(
            self,
            "TrainingSg",
            vpc=vpc,
            allow_all_outbound=False,
            description="Training cluster (EFA): all traffic to and from itself only",
        )
        self.lustre_sg = ec2.SecurityGroup(
            self, "LustreSg", vpc=vpc, allow_all_outbound=False, description="FSx for Lustre file servers"
        )
        self.services_sg = ec2.SecurityGroup(
            self,
            "ServicesSg",
            vpc=vpc,
            allow_all_outbound=False,
            description="Platform Lambdas: HTTPS to AWS APIs through endpoints",
        )

        # EFA requires one security group whose members may send anything to each other, and nothing else.
        self.training_sg.add_ingress_rule(self.training_sg, ec2.Port.all_traffic(), "EFA/NCCL within the cluster")
        self.training_sg.add_egress_rule(self.training_sg, ec2.Port.all_traffic(), "EFA/NCCL within the cluster")
        for pack in ("NIST.800.53.R5", "HIPAA.Security"):
            acknowledge(
                self.training_sg,
                f"{pack}-EC2RestrictedCommonPorts",
                "The only all-traffic ingress is from this security group itself (EFA requires it); "
                "no CIDR can reach any port.",
            )

        # Lustre clients and servers open connections both ways on 988 and 1018-1023.
        for port in LUSTRE_PORTS:
            for peer in (self.training_sg, self.lustre_sg):
                self.lustre_sg.add_ingress_rule(peer, port, "Lustre")
                self.lustre_sg.add_egress_rule(peer, port, "Lustre")
            self.training_sg.add_ingress_rule(self.lustre_sg, port, "Lustre")
            self.training_sg.add_egress_rule(self.lustre_sg, port, "Lustre")

        for workload in (self.training_sg, self.services_sg):
            workload.add_egress_rule(self.endpoint_sg, ec2.Port.tcp(443), "AWS APIs through interface endpoints")
            # The only IPv4 route out of isolated subnets is the S3/DynamoDB gateway endpoints, whose
            # prefix lists cannot be resolved without a lookup; with NAT configured this is HTTPS out.
            workload.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "S3 and DynamoDB gateway endpoints")
            self.endpoint_sg.add_ingress_rule(workload, ec2.Port.tcp(443), "HTTPS from platform workloads")

    def _endpoints(self) -> None:
        in_account = {"StringEquals": {"aws:ResourceAccount": Aws.ACCOUNT_ID}}
        s3 = self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[ec2.SubnetSelection(subnet_group_name=g) for g in ("training", "services")],
        )
        s3.add_to_policy(
            iam.PolicyStatement(
                sid="OwnAccountBuckets",
                principals=[iam.AnyPrincipal()],
                actions=["s3:*"],
                resources=["*"],
                conditions=in_account,
            )
        )
        s3.add_to_policy(
            iam.PolicyStatement(
                sid="EcrImageLayers",
                principals=[iam.AnyPrincipal()],
                actions=["s3:GetObject"],
                resources=[f"arn:{Aws.PARTITION}:s3:::prod-{Aws.REGION}-starport-layer-bucket/*"],
            )
        )
        dynamodb = self.vpc.add_gateway_endpoint(
            "DynamoDb",
            service=ec2.GatewayVpcEndpointAwsService.DYNAMODB,
            subnets=[self.services_subnets],
        )
        dynamodb.add_to_policy(
            iam.PolicyStatement(
                sid="OwnAccountTables",
                principals=[iam.AnyPrincipal()],
                actions=["dynamodb:*"],
                resources=["*"],
                conditions=in_account,
            )
        )

        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=self.services_subnets,
                security_groups=[self.endpoint_sg],
                private_dns_enabled=True,
                open=False,
            )
            if name not in _NO_ENDPOINT_POLICY:
                # Data perimeter: only this account's principals may use the platform's endpoints.
                endpoint.add_to_policy(
                    iam.PolicyStatement(
                        sid="OwnAccountPrincipals",
                        principals=[iam.AnyPrincipal()],
                        actions=["*"],
                        resources=["*"],
                        conditions={"StringEquals": {"aws:PrincipalAccount": Aws.ACCOUNT_ID}},
                    )
                )
            self.interface_endpoints[name] = endpoint

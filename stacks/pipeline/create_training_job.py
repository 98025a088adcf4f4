"""SageMaker distributed training as Step Functions states: create, then poll until it ends.

CreateTrainingJob is an SDK task because CDK's SageMakerCreateTrainingJob task lacks most of the
fields the platform needs, and `.sync` cannot record spot interruptions or check checkpoint
freshness while a job runs. Its parameters are defined in contract/service_requests.py; this
construct gives them the stacks' resources (role, image, VPC, KMS keys, buckets) as constants.
"""

from __future__ import annotations

import math

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.catalog import INSTANCE_TYPES
from contract.execution_state import TRAIN
from contract.service_requests import TrainingJobConstants, Variant, create_training_job
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.constructs.network import TrainingNetwork
from stacks.constructs.tasks import SAGEMAKER_TRANSIENT
from stacks.constructs.training_image import TrainingImage
from stacks.constructs.training_storage import acknowledge_training_storage, training_storage_statements
from stacks.naming import CHECKPOINT_WRITERS_PATH, ec2_arn_prefix
from stacks.outputs import SAGEMAKER_TRAINING_LOG_GROUP
from stacks.pipeline.parts import Buckets
from stacks.pipeline.polled_job import sdk_task
from stacks.settings import PipelineSettings


def volumes(variant: Variant) -> str:
    """How a create state's comment names the variant's volumes."""
    return " (instance-store NVMe)" if variant.local_storage else " (EBS volumes encrypted with the platform key)"


class DistributedTrainingJob(Construct):
    """The SageMaker execution role and the CreateTrainingJob states of every step that runs SageMaker training jobs
    (the pipeline makes one)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        pipeline: PipelineSettings,
        network: TrainingNetwork,
        image: TrainingImage,
        buckets: Buckets,
    ) -> None:
        super().__init__(scope, id_)
        self.vpc = network.vpc
        self.image_uri = image.image_uri
        self.key = buckets.key
        self.checkpoints = buckets.checkpoints
        self.artifacts = buckets.artifacts
        self.subnet = network.training_subnet
        self.security_group = network.training_sg
        self.inter_container_encryption = pipeline.inter_container_encryption
        self.network_isolation = pipeline.network_isolation
        self.instance_types = pipeline.instance_types()
        self.max_runtime_seconds = math.ceil(pipeline.max_runtime_hours * 3600)
        self.training_plan_arn = pipeline.training_plan.arn if pipeline.training_plan else None
        self.role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="SageMaker training jobs of the distributed training platform",
            path=CHECKPOINT_WRITERS_PATH,  # SageMaker syncs the jobs' checkpoints with this role
        )
        image.repository.grant_pull(self.role)
        self.constants = TrainingJobConstants(
            role_arn=self.role.role_arn,
            training_image=self.image_uri,
            key_arn=self.key.key_arn,
            subnet=self.subnet.subnet_id,
            security_group=self.security_group.security_group_id,
            checkpoints_bucket=self.checkpoints.bucket_name,
            artifacts_bucket=self.artifacts.bucket_name,
            inter_container_encryption=self.inter_container_encryption,
            network_isolation=self.network_isolation,
            training_plan_arn=self.training_plan_arn or "",
        )
        self.request = create_training_job(self.constants)
        """CreateTrainingJob, as every step that creates SageMaker training jobs sends it."""
        statements = self._execution_statements(buckets.datasets)
        for sid, statement in statements.items():
            statement.sid = sid
            self.role.add_to_policy(statement)
        self._acknowledge_execution_role(buckets.datasets, statements)

    def _execution_statements(self, datasets: s3.IBucket) -> dict[str, iam.PolicyStatement]:
        """What the training containers may do: read datasets, read and write checkpoints, write outputs."""
        stack = Stack.of(self)
        region_account = f"{stack.region}:{stack.account}"
        ec2_arn = ec2_arn_prefix(self)
        interfaces = f"{ec2_arn}:network-interface/*"
        return {
            "TrainingLogs": iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[f"arn:{stack.partition}:logs:{region_account}:log-group:{SAGEMAKER_TRAINING_LOG_GROUP}*"],
            ),
            "TrainingMetrics": iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}},
            ),
            **training_storage_statements(datasets=datasets, checkpoints=self.checkpoints, artifacts=self.artifacts),
            # Reads datasets and checkpoints, writes checkpoints and outputs under the platform key.
            "UsePlatformKey": iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"], resources=[self.key.key_arn]
            ),
            # SageMaker encrypts the instances' EBS volumes with the key through a grant.
            "EncryptVolumes": iam.PolicyStatement(
                actions=["kms:CreateGrant"],
                resources=[self.key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            ),
            # SageMaker's VPC mode: interfaces in the training subnet and security group only.
            "CreateInterfacesInTheTrainingSubnet": iam.PolicyStatement(
                actions=["ec2:CreateNetworkInterface"],
                resources=[
                    interfaces,
                    f"{ec2_arn}:subnet/{self.subnet.subnet_id}",
                    f"{ec2_arn}:security-group/{self.security_group.security_group_id}",
                ],
            ),
            "ManageInterfacesInTheVpc": iam.PolicyStatement(
                actions=[
                    "ec2:CreateNetworkInterfacePermission",
                    "ec2:DeleteNetworkInterfacePermission",
                    "ec2:DeleteNetworkInterface",
                ],
                resources=[interfaces],
                conditions={"ArnEquals": {"ec2:Vpc": f"{ec2_arn}:vpc/{self.vpc.vpc_id}"}},
            ),
            "DescribeTheNetwork": iam.PolicyStatement(
                actions=[
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                ],
                resources=["*"],
            ),
            # The reference lets DescribeFileSystems name no file system: on one ARN it grants nothing.
            "LustreDataSource": iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"]),
        }

    def _acknowledge_execution_role(self, datasets: s3.IBucket, statements: dict[str, iam.PolicyStatement]) -> None:
        acknowledge_inline_policy(self.role)
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::*]",
            "ECR GetAuthorizationToken, CloudWatch PutMetricData (limited to SageMaker namespaces by condition), "
            "EC2 Describe* and FSx DescribeFileSystems take no resource scope.",
        )
        acknowledge_training_storage(
            self.role, datasets=datasets, checkpoints=self.checkpoints, artifacts=self.artifacts
        )
        for resource, reason in {
            statements["CreateInterfacesInTheTrainingSubnet"].resources[0]: "Interfaces SageMaker creates for the "
            "job; creation is bound to the training subnet and security group, changes to the platform VPC by "
            "condition.",
            statements["TrainingLogs"].resources[0]: "SageMaker writes each job's logs to streams of its TrainingJobs "
            "log group.",
        }.items():
            acknowledge_wildcard(self.role, resource, reason)

    def create_state(self, scope: Construct, id_: str, variant: Variant) -> sfn.CustomState:
        """CreateTrainingJob; its result is the job's name and ARN under `$.train.job`."""
        return sdk_task(
            scope,
            id_,
            self.request.service,
            self.request.action,
            {
                "Comment": "Starts the training job"
                + (" on a heterogeneous cluster" if variant.heterogeneous else "")
                + (" in the stage's training plan" if variant.training_plan else "")
                + volumes(variant),
                "Parameters": self.request.states_parameters(variant),
                "ResultSelector": {
                    "arn.$": "$.TrainingJobArn",
                    "job_name.$": "States.ArrayGetItem(States.StringSplit($.TrainingJobArn, '/'), 1)",
                },
                "ResultPath": str(TRAIN.job),
            },
            passes=SAGEMAKER_TRANSIENT,
        )

    def grant_follow(self, role: iam.IRole) -> None:
        """Describe the platform's training jobs (what polling them needs)."""
        stack = Stack.of(self)
        jobs = f"arn:{stack.partition}:sagemaker:{stack.region}:{stack.account}:training-job/*"
        role.add_to_principal_policy(
            iam.PolicyStatement(sid="FollowTrainingJobs", actions=["sagemaker:DescribeTrainingJob"], resources=[jobs])
        )

    def grant_stop(self, role: iam.IRole) -> None:
        """Find an execution's training jobs by their tags, and stop them."""
        stack = Stack.of(self)
        jobs = f"arn:{stack.partition}:sagemaker:{stack.region}:{stack.account}:training-job/*"
        role.add_to_principal_policy(
            iam.PolicyStatement(sid="ListTrainingJobs", actions=["sagemaker:ListTrainingJobs"], resources=["*"])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="StopTrainingJobs",
                actions=["sagemaker:ListTags", "sagemaker:StopTrainingJob"],
                resources=[jobs],
            )
        )

    def create_statements(self, action: str, resource: str, *, sid_prefix: str) -> list[iam.PolicyStatement]:
        """`action` allowed only as the platform configures jobs: its subnet, security group, output key, instance
        types, runtime limit, encryption and isolation flags; on EBS types only with its volume key, with an
        instance-store type anywhere in the job (one group of a heterogeneous cluster is enough) only with none.
        """
        flags = {"sagemaker:InterContainerTrafficEncryption": self.inter_container_encryption}
        if self.network_isolation:
            flags["sagemaker:NetworkIsolation"] = True
        ebs = [t for t in self.instance_types if not INSTANCE_TYPES[t].local_storage]
        instance_store = [t for t in self.instance_types if INSTANCE_TYPES[t].local_storage]
        # (sid, every type of the job among, some type among, with the volume key)
        shapes = [
            (f"{sid_prefix}OnEbsTypes", ebs, None, True),
            (f"{sid_prefix}OnInstanceStoreTypes", self.instance_types, instance_store, False),
        ]
        # A job in the training plan is authorised on the plan too (the Service Authorization Reference's
        # training-plan resource of CreateTrainingJob), under the same conditions.
        plan = [self.training_plan_arn] if self.training_plan_arn and action == "sagemaker:CreateTrainingJob" else []
        return [
            iam.PolicyStatement(
                sid=sid,
                actions=[action],
                resources=[resource, *plan],
                conditions={
                    "ForAllValues:StringEquals": {
                        "sagemaker:VpcSubnets": [self.subnet.subnet_id],
                        "sagemaker:VpcSecurityGroupIds": [self.security_group.security_group_id],
                        "sagemaker:InstanceTypes": types,
                    },
                    **({"ForAnyValue:StringEquals": {"sagemaker:InstanceTypes": some_of}} if some_of else {}),
                    "Null": {
                        "sagemaker:VpcSubnets": "false",
                        "sagemaker:VpcSecurityGroupIds": "false",
                        "sagemaker:InstanceTypes": "false",
                        "sagemaker:VolumeKmsKey": str(not volume_key).lower(),
                    },
                    "StringEquals": {
                        "sagemaker:OutputKmsKey": self.key.key_arn,
                        **({"sagemaker:VolumeKmsKey": self.key.key_arn} if volume_key else {}),
                    },
                    "Bool": {k: str(v).lower() for k, v in flags.items()},
                    "NumericLessThanEquals": {"sagemaker:MaxRuntimeInSeconds": str(self.max_runtime_seconds)},
                },
            )
            for sid, types, some_of, volume_key in shapes
            if types and some_of != []
        ]

    def grant_run(self, state_machine_role: iam.IRole) -> None:
        """What the state machine needs: create (as the platform configures jobs only), tag, pass the role.

        CreateTrainingJob only under `create_statements`' conditions.
        """
        stack = Stack.of(self)
        jobs = f"arn:{stack.partition}:sagemaker:{stack.region}:{stack.account}:training-job/*"
        for statement in self.create_statements("sagemaker:CreateTrainingJob", jobs, sid_prefix="CreateJobs"):
            state_machine_role.add_to_principal_policy(statement)
        state_machine_role.add_to_principal_policy(
            iam.PolicyStatement(sid="TagTrainingJobs", actions=["sagemaker:AddTags"], resources=[jobs])
        )
        state_machine_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="PassTheTrainingRole",
                actions=["iam:PassRole"],
                resources=[self.role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )

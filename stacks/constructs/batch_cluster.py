"""The EC2 / AWS Batch training cluster: a compute environment, a job queue and a multi-node job definition.

The instances are the platform's own: the GPU ECS AMI (resolved from SSM when CloudFormation
deploys, never looked up at synth), one EFA interface per network card in the training subnet and
security group, the cluster placement group, IMDSv2 only, root volumes encrypted with the platform
key, and FSx for Lustre mounted at /fsx by the launch template's user data. AWS Batch runs
multi-node parallel jobs on On-Demand instances only (its documentation: "Multi-node parallel jobs
aren't supported on compute environments that use Spot Instances"), so there is no Spot environment.

Two roles: the instance role runs the ECS agent and pulls the image, nothing more; the job role
(the container's) reads datasets and writes the run's checkpoints and outputs under the platform key.
"""

from __future__ import annotations

from aws_cdk import Duration, Size, Stack
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.catalog import InstanceType
from stacks.constructs.nag import acknowledge, acknowledge_inline_policy, acknowledge_wildcard
from stacks.constructs.network import TrainingNetwork
from stacks.constructs.placement import INSTANCE_METADATA_HOP_LIMIT, EfaClusterPlacement, efa_interfaces
from stacks.constructs.training_image import TrainingImage
from stacks.constructs.training_storage import acknowledge_training_storage, training_storage_statements
from stacks.naming import CHECKPOINT_WRITERS_PATH

FSX_MOUNT_PATH = "/fsx"
ROOT_VOLUME_GB = 200
# The ECS agent setting that keeps awsvpc tasks (every multi-node job) from the instance metadata.
ECS_BLOCK_IMDS = "ECS_AWSVPC_BLOCK_IMDS=true"
# What the host keeps for itself (ECS agent, Docker, the OS); the job's container gets the rest.
HOST_MEMORY_FRACTION = 0.9
BATCH_COMMAND = ["train"]


class BatchTrainingCluster(Construct):
    """On-Demand EFA instances in one placement group, the queue that feeds them and the job they run."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance: InstanceType,
        max_nodes: int,
        network: TrainingNetwork,
        placement: EfaClusterPlacement,
        image: TrainingImage,
        key: kms.IKey,
        file_system: fsx.LustreFileSystem,
        datasets: s3.IBucket,
        checkpoints: s3.IBucket,
        artifacts: s3.IBucket,
    ) -> None:
        super().__init__(scope, id_)
        self.instance = instance
        self.max_nodes = max_nodes
        self.key = key
        self.instance_role = self._instance_role()
        self.execution_role = self._execution_role(image)
        self.job_role = self._job_role(key, datasets, checkpoints, artifacts)
        self.launch_template = self._launch_template(instance, network, key, file_system)
        self.compute_environment = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "OnDemand",
            vpc=network.vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=[network.training_subnet]),
            security_groups=[network.training_sg],
            instance_types=[ec2.InstanceType(instance.ec2_name)],
            use_optimal_instance_classes=False,
            # Best fit keeps to the one type; the training subnet (one AZ) keeps every node in one AZ.
            allocation_strategy=batch.AllocationStrategy.BEST_FIT_PROGRESSIVE,
            spot=False,
            minv_cpus=0,
            maxv_cpus=instance.vcpus * max_nodes,
            instance_role=self.instance_role,
            launch_template=self.launch_template,
            placement_group=placement.placement_group,
            images=[
                batch.EcsMachineImage(
                    image=ecs.EcsOptimizedImage.amazon_linux2(ecs.AmiHardwareType.GPU),
                    image_type=batch.EcsMachineImageType.ECS_AL2_NVIDIA,
                )
            ],
            update_to_latest_image_version=False,
        )
        environment = self.compute_environment.node.default_child
        assert isinstance(environment, batch.CfnComputeEnvironment)
        # The launch template's interfaces carry the EFA security group; EC2 refuses instance-level security
        # groups beside network interfaces (the group is passed above only so that CDK creates no other).
        environment.add_property_deletion_override("ComputeResources.SecurityGroupIds")
        self.queue = batch.JobQueue(
            self,
            "Queue",
            compute_environments=[
                batch.OrderedComputeEnvironment(compute_environment=self.compute_environment, order=1)
            ],
        )
        self.job_definition = self._job_definition(instance, max_nodes, image)

    def _execution_role(self, image: TrainingImage) -> iam.Role:
        """What ECS uses to start the container: pull the training image, write its log stream."""
        role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="Starts the AWS Batch training containers (image pull, log streams)",
        )
        image.repository.grant_pull(role)
        stack = Stack.of(self)
        logs = f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:/aws/batch/job:*"
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ContainerLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[logs]
            )
        )
        acknowledge_inline_policy(role)
        acknowledge(role, "AwsSolutions-IAM5[Resource::*]", "ecr:GetAuthorizationToken takes no resource scope.")
        acknowledge_wildcard(role, logs, "Streams of AWS Batch's job log group, one per job container.")
        return role

    def _instance_role(self) -> iam.Role:
        """The ECS agent's: register the instance, take tasks, write container logs. No data, no image pull."""
        role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="EC2 instances of the AWS Batch training cluster (ECS agent and image pull only)",
        )
        stack = Stack.of(self)
        ecs_arn = f"arn:{stack.partition}:ecs:{stack.region}:{stack.account}"
        # AmazonEC2ContainerServiceforEC2Role, less what the cluster does not use, scoped to ECS clusters.
        role.add_to_policy(
            iam.PolicyStatement(
                sid="EcsAgent",
                actions=[
                    "ecs:DeregisterContainerInstance",
                    "ecs:RegisterContainerInstance",
                    "ecs:Submit*",
                    "ecs:Poll",
                    "ecs:StartTelemetrySession",
                    "ecs:UpdateContainerInstancesState",
                ],
                resources=[f"{ecs_arn}:cluster/*", f"{ecs_arn}:container-instance/*"],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(sid="EcsDiscovery", actions=["ecs:DiscoverPollEndpoint"], resources=["*"])
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ContainerLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:/aws/batch/job:*"],
            )
        )
        acknowledge_inline_policy(role)
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecs:DiscoverPollEndpoint takes no resource scope.",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Action::ecs:Submit*]",
            "The ECS agent reports task and container state changes (SubmitTaskStateChange, "
            "SubmitContainerStateChange, SubmitAttachmentStateChanges), as AWS's ECS instance policy grants.",
        )
        for resource, reason in {
            f"{ecs_arn}:cluster/*": "AWS Batch creates and names the ECS cluster behind the compute environment.",
            f"{ecs_arn}:container-instance/*": "The instance registers itself in the cluster AWS Batch created.",
            f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:/aws/batch/job:*": (
                "Streams of AWS Batch's job log group, one per job container."
            ),
        }.items():
            acknowledge_wildcard(role, resource, reason)
        return role

    def _job_role(
        self, key: kms.IKey, datasets: s3.IBucket, checkpoints: s3.IBucket, artifacts: s3.IBucket
    ) -> iam.Role:
        """The container's: read datasets, read and write run checkpoints, write run outputs, under the key."""
        role = iam.Role(
            self,
            "JobRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            path=CHECKPOINT_WRITERS_PATH,  # the Batch contract uploads the run's checkpoints with this role
            description="Training containers of AWS Batch jobs (datasets in; checkpoints and outputs out)",
        )
        statements = {
            **training_storage_statements(datasets=datasets, checkpoints=checkpoints, artifacts=artifacts),
            "UsePlatformKey": iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[key.key_arn]
            ),
        }
        for sid, statement in statements.items():
            statement.sid = sid
            role.add_to_policy(statement)
        acknowledge_inline_policy(role)
        acknowledge_training_storage(role, datasets=datasets, checkpoints=checkpoints, artifacts=artifacts)
        return role

    def _launch_template(
        self, instance: InstanceType, network: TrainingNetwork, key: kms.IKey, file_system: fsx.LustreFileSystem
    ) -> ec2.LaunchTemplate:
        """EFA interfaces, IMDSv2, an encrypted root volume, and FSx mounted before the ECS agent starts."""
        mount = ec2.UserData.for_linux()
        mount.add_commands(
            "set -euo pipefail",
            "amazon-linux-extras install -y lustre",
            f"mkdir -p {FSX_MOUNT_PATH}",
            f"mount -t lustre -o relatime,flock {file_system.dns_name}@tcp:/{file_system.mount_name} {FSX_MOUNT_PATH}",
            f"echo '{file_system.dns_name}@tcp:/{file_system.mount_name} {FSX_MOUNT_PATH} lustre "
            "defaults,relatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service 0 0' >> /etc/fstab",
            # Multi-node jobs run in awsvpc mode, where the hop limit alone does not keep a container from
            # the instance metadata (and the instance role): the ECS agent blocks it for those tasks.
            f"echo {ECS_BLOCK_IMDS} >> /etc/ecs/ecs.config",
        )
        # AWS Batch merges its own user data with the launch template's, which must be MIME multi-part.
        user_data = ec2.MultipartUserData()
        user_data.add_user_data_part(mount, ec2.MultipartBody.SHELL_SCRIPT, True)
        template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            user_data=user_data,
            require_imdsv2=True,
            http_put_response_hop_limit=INSTANCE_METADATA_HOP_LIMIT,
            detailed_monitoring=True,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/xvda",
                    volume=ec2.BlockDeviceVolume.ebs(
                        ROOT_VOLUME_GB,
                        encrypted=True,
                        kms_key=key,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        # Interfaces per network card are not in the L2 launch template; security groups go on them.
        cfn = template.node.default_child
        assert isinstance(cfn, ec2.CfnLaunchTemplate)
        interfaces = efa_interfaces(instance, subnet=network.training_subnet, security_group=network.training_sg)
        cfn.add_property_override(
            "LaunchTemplateData.NetworkInterfaces",
            [
                {
                    "DeviceIndex": interface.device_index,
                    "NetworkCardIndex": interface.network_card_index,
                    **({"InterfaceType": interface.interface_type} if interface.interface_type else {}),
                    "Groups": interface.groups,
                    "SubnetId": interface.subnet_id,
                    "DeleteOnTermination": True,
                    "AssociatePublicIpAddress": interface.associate_public_ip_address,
                    "Description": interface.description,
                }
                for interface in interfaces
            ],
        )
        return template

    def _job_definition(
        self, instance: InstanceType, max_nodes: int, image: TrainingImage
    ) -> batch.MultiNodeJobDefinition:
        """The training image on every node; the pipeline's submit sets the node count and the run's environment."""
        linux = batch.LinuxParameters(self, "Linux", shared_memory_size=Size.gibibytes(64))
        container = batch.EcsEc2ContainerDefinition(
            self,
            "Container",
            image=ecs.ContainerImage.from_registry(image.image_uri),
            command=BATCH_COMMAND,
            cpu=instance.vcpus,
            memory=Size.mebibytes(int(instance.memory_gib * 1024 * HOST_MEMORY_FRACTION)),
            gpu=instance.gpus or None,
            job_role=self.job_role,
            execution_role=self.execution_role,
            linux_parameters=linux,
            # NCCL over EFA registers (pins) GPU and host memory.
            ulimits=[batch.Ulimit(name=batch.UlimitName.MEMLOCK, soft_limit=-1, hard_limit=-1)],
            volumes=[
                batch.EcsVolume.host(name="fsx", host_path=FSX_MOUNT_PATH, container_path=FSX_MOUNT_PATH, readonly=True)
            ],
            environment={"PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "WARN"},
        )
        definition = batch.MultiNodeJobDefinition(
            self,
            "MultiNode",
            instance_type=ec2.InstanceType(instance.ec2_name),
            containers=[batch.MultiNodeContainer(container=container, start_node=0, end_node=max_nodes - 1)],
            main_node=0,
            propagate_tags=True,
            # A node lost with its host (EC2 terminated it) is retried as a new attempt, which resumes
            # from the run's checkpoints in S3; anything else fails the job.
            retry_strategies=[
                batch.RetryStrategy.of(batch.Action.RETRY, batch.Reason.custom(on_status_reason="Host EC2*")),
                batch.RetryStrategy.of(batch.Action.EXIT, batch.Reason.custom(on_reason="*")),
            ],
            retry_attempts=3,
            timeout=Duration.days(14),
        )
        cfn = definition.node.default_child
        assert isinstance(cfn, batch.CfnJobDefinition)
        # One range for every node ("0:"), so that a submit may ask for fewer nodes than the largest cluster.
        cfn.add_property_override("NodeProperties.NodeRangeProperties.0.TargetNodes", "0:")
        # Every EFA device into the container, with the permissions Batch's EFA guide names (CDK writes them
        # in lower case, which the Batch API does not list).
        cfn.add_property_override(
            "NodeProperties.NodeRangeProperties.0.Container.LinuxParameters.Devices",
            [
                {
                    "HostPath": f"/dev/infiniband/uverbs{n}",
                    "ContainerPath": f"/dev/infiniband/uverbs{n}",
                    "Permissions": ["READ", "WRITE", "MKNOD"],
                }
                for n in range(instance.efa_interfaces)
            ],
        )
        return definition

    def grant_submit(self, role: iam.IRole) -> None:
        """Submit jobs of this definition to this queue, tagged, and terminate them."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SubmitBatchTrainingJobs",
                actions=["batch:SubmitJob", "batch:TagResource"],
                resources=[self.queue.job_queue_arn, self.job_definition.job_definition_arn, self._jobs_arn()],
            )
        )

    def grant_follow(self, role: iam.IRole) -> None:
        """Describe and list the queue's jobs (Batch authorizes both on `*` only)."""
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="FollowBatchJobs", actions=["batch:DescribeJobs", "batch:ListJobs"], resources=["*"]
            )
        )

    def grant_find(self, role: iam.IRole) -> None:
        """List the queue's jobs by name (Batch authorizes ListJobs on `*` only)."""
        role.add_to_principal_policy(
            iam.PolicyStatement(sid="FindBatchJobs", actions=["batch:ListJobs"], resources=["*"])
        )

    def grant_terminate(self, role: iam.IRole) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(sid="TerminateBatchJobs", actions=["batch:TerminateJob"], resources=[self._jobs_arn()])
        )

    def _jobs_arn(self) -> str:
        stack = Stack.of(self)
        return f"arn:{stack.partition}:batch:{stack.region}:{stack.account}:job/*"

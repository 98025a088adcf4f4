"""The AWS Batch training cluster: compute environment, queue, multi-node job definition, their roles."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match

from contract.catalog import instance_type
from tests.support.templates import get_att, logical_id, resources, template


def _statements(platform: Any, role_contains: str) -> dict[str, dict[str, Any]]:
    """The statements of the policies attached to one role of the pipeline stack, by Sid: its inline policy and
    the overflow policies CDK moves statements into past IAM's inline size limit."""
    role = logical_id(platform, platform.pipeline, "AWS::IAM::Role", role_contains)
    out: dict[str, dict[str, Any]] = {}
    policies = {
        **resources(platform, platform.pipeline, "AWS::IAM::Policy"),
        **resources(platform, platform.pipeline, "AWS::IAM::ManagedPolicy"),
    }
    for policy in policies.values():
        if {"Ref": role} in policy["Properties"].get("Roles", []):
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                out[statement.get("Sid", str(len(out)))] = statement
    return out


def test_on_demand_compute_environment_in_the_placement_group_with_the_gpu_ami(platform: Any) -> None:
    cluster = platform.settings.network.largest_cluster
    kind = instance_type(cluster.instance_type)
    (environment,) = resources(platform, platform.pipeline, "AWS::Batch::ComputeEnvironment").values()
    compute = environment["Properties"]["ComputeResources"]
    assert compute["Type"] == "EC2"  # Batch runs no multi-node job on Spot
    assert compute["InstanceTypes"] == [kind.ec2_name]
    assert compute["MinvCpus"] == 0
    assert compute["MaxvCpus"] == kind.vcpus * cluster.count
    assert compute["AllocationStrategy"] == "BEST_FIT_PROGRESSIVE"
    assert len(compute["Subnets"]) == 1  # the training subnet: one AZ
    assert "PlacementGroup" in compute
    assert "SecurityGroupIds" not in compute  # carried by the launch template's interfaces
    (image,) = compute["Ec2Configuration"]
    assert image["ImageType"] == "ECS_AL2_NVIDIA"
    # The GPU ECS AMI is an SSM parameter resolved at deploy time, not a synth-time lookup.
    parameter = image["ImageIdOverride"]["Ref"]
    parameters = platform.assembly.get_stack_by_name(platform.pipeline.stack_name).template["Parameters"]
    assert parameters[parameter]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert "gpu" in parameters[parameter]["Default"]
    template(platform, platform.pipeline).has_resource_properties(
        "AWS::Batch::JobQueue",
        {"ComputeEnvironmentOrder": [{"ComputeEnvironment": Match.any_value(), "Order": 1}], "State": "ENABLED"},
    )


def test_launch_template_efa_per_card_imdsv2_encrypted_root_and_fsx_mount(platform: Any) -> None:
    kind = instance_type(platform.settings.network.largest_cluster.instance_type)
    template_id = logical_id(platform, platform.pipeline, "AWS::EC2::LaunchTemplate", "BatchCluster")
    data = resources(platform, platform.pipeline, "AWS::EC2::LaunchTemplate")[template_id]["Properties"][
        "LaunchTemplateData"
    ]
    interfaces = data["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(kind.efa_interfaces))
    assert {i["InterfaceType"] for i in interfaces} == {"efa"}
    assert [i["DeviceIndex"] for i in interfaces[:2]] == [0, 1]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True
    assert "KmsKeyId" in root["Ebs"]
    user_data = str(data["UserData"])
    assert "multipart/mixed" in user_data  # AWS Batch merges MIME multi-part user data only
    assert "mount -t lustre" in user_data
    assert "/fsx" in user_data


def test_multi_node_job_definition_passes_efa_devices_and_mounts_fsx(platform: Any) -> None:
    kind = instance_type(platform.settings.network.largest_cluster.instance_type)
    (definition,) = resources(platform, platform.pipeline, "AWS::Batch::JobDefinition").values()
    props = definition["Properties"]
    assert props["Type"] == "multinode"
    assert props["PropagateTags"] is True
    nodes = props["NodeProperties"]
    assert nodes["MainNode"] == 0
    (node_range,) = nodes["NodeRangeProperties"]
    assert node_range["TargetNodes"] == "0:"
    container = node_range["Container"]
    assert container["Command"] == ["train"]
    devices = container["LinuxParameters"]["Devices"]
    assert [d["HostPath"] for d in devices] == [f"/dev/infiniband/uverbs{n}" for n in range(kind.efa_interfaces)]
    assert all(d["Permissions"] == ["READ", "WRITE", "MKNOD"] for d in devices)
    assert {"SourceVolume": "fsx", "ContainerPath": "/fsx", "ReadOnly": True} in container["MountPoints"]
    assert container["Volumes"] == [{"Name": "fsx", "Host": {"SourcePath": "/fsx"}}]
    assert {"Name": "memlock", "SoftLimit": -1, "HardLimit": -1} in container["Ulimits"]
    resources_ = {r["Type"]: r["Value"] for r in container["ResourceRequirements"]}
    assert resources_["GPU"] == str(kind.gpus)
    assert resources_["VCPU"] == str(kind.vcpus)
    job_role = logical_id(platform, platform.pipeline, "AWS::IAM::Role", "BatchClusterJobRole")
    assert container["JobRoleArn"] == get_att(job_role, "Arn")
    # Lost hosts are retried (resuming from checkpoints); anything else ends the job.
    assert props["RetryStrategy"]["EvaluateOnExit"][0] == {"Action": "RETRY", "OnStatusReason": "Host EC2*"}


def test_instance_role_runs_the_agent_only(platform: Any) -> None:
    statements = _statements(platform, "BatchClusterInstanceRole")
    actions = {a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not any(a.startswith(("s3:", "kms:")) for a in actions), actions
    assert "ecs:RegisterContainerInstance" in actions
    role = logical_id(platform, platform.pipeline, "AWS::IAM::Role", "BatchClusterInstanceRole")
    assert resources(platform, platform.pipeline, "AWS::IAM::Role")[role]["Properties"].get("ManagedPolicyArns") is None


def test_job_role_reads_datasets_and_writes_run_outputs_only(platform: Any) -> None:
    statements = _statements(platform, "BatchClusterJobRole")
    assert set(statements) == {
        "ReadDatasets",
        "RunCheckpoints",
        "ListRunCheckpoints",
        "ReadRunLedgers",
        "ListRunLedgers",
        "WriteOutputs",
        "NoLineageWrites",
        "ReadRunCode",
        "ListRunCode",
        "NoCodeWrites",
        "NoDeletes",
        "UsePlatformKey",
    }
    assert statements["WriteOutputs"]["Action"] == "s3:PutObject"
    assert statements["RunCheckpoints"]["Action"] == ["s3:GetObject", "s3:PutObject"]  # no delete
    assert statements["ListRunCheckpoints"]["Condition"] == {"StringLike": {"s3:prefix": ["runs/*/checkpoints/*"]}}
    assert statements["ReadRunLedgers"]["Action"] == "s3:GetObject"  # the ledger: read, never written
    assert statements["ListRunLedgers"]["Condition"] == {"StringLike": {"s3:prefix": ["runs/*/lineage/checkpoints/*"]}}
    assert statements["NoLineageWrites"]["Effect"] == statements["NoDeletes"]["Effect"] == "Deny"
    assert statements["ReadRunCode"]["Action"] == "s3:GetObject"  # the packed code: read, never written
    assert statements["ListRunCode"]["Condition"] == {"StringLike": {"s3:prefix": ["code/*"]}}
    assert statements["NoCodeWrites"]["Effect"] == "Deny"


def test_state_machine_submits_only_to_the_platform_queue_and_definition(platform: Any) -> None:
    statements = _statements(platform, "TrainingPipelineRole")
    submit = statements["SubmitBatchTrainingJobs"]
    queue = logical_id(platform, platform.pipeline, "AWS::Batch::JobQueue", "BatchCluster")
    definition = logical_id(platform, platform.pipeline, "AWS::Batch::JobDefinition", "BatchCluster")
    assert get_att(queue, "JobQueueArn") in submit["Resource"]
    assert {"Ref": definition} in submit["Resource"]
    # It finds a job a lost submit created (ListJobs); the adoption check, not the machine, describes it.
    assert statements["FindBatchJobs"]["Action"] == "batch:ListJobs"
    assert not any("batch:DescribeJobs" in str(s["Action"]) for s in statements.values())
    assert not any("batch:TerminateJob" in str(s["Action"]) for s in statements.values())


def test_validate_learns_the_batch_cluster(platform: Any) -> None:
    cluster = platform.settings.network.largest_cluster
    function = logical_id(platform, platform.pipeline, "AWS::Lambda::Function", "Validate")
    variables = resources(platform, platform.pipeline, "AWS::Lambda::Function")[function]["Properties"]["Environment"][
        "Variables"
    ]
    assert variables["TRAINING_BACKENDS"] == '["sagemaker", "batch"]'
    assert variables["BATCH_INSTANCE_TYPES"] == f'["{cluster.instance_type}"]'
    assert variables["BATCH_MAX_NODES"] == str(cluster.count)

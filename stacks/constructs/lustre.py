"""FSx for Lustre PERSISTENT_2 in the training subnet, lazily loaded from the datasets bucket."""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.settings import StorageSettings

DATASETS_PATH = "/datasets"
RESULTS_PATH = "/results"
_ALL_EVENTS = ["NEW", "CHANGED", "DELETED"]


class LustreDataRepository(Construct):
    """The file system training jobs read datasets from, linked to S3 by data repository associations.

    Datasets appear under `/datasets` as metadata on creation and load on first read; new,
    changed and deleted S3 objects are imported automatically. S3 stays the source of truth.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        subnet: ec2.ISubnet,
        vpc: ec2.IVpc,
        security_group: ec2.ISecurityGroup,
        key: kms.IKey,
        datasets: s3.IBucket,
        artifacts: s3.IBucket,
        settings: StorageSettings,
    ) -> None:
        super().__init__(scope, id_)
        self.file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnet=subnet,
            security_group=security_group,
            storage_capacity_gib=settings.fsx_storage_capacity_gib,
            kms_key=key,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            removal_policy=RemovalPolicy.RETAIN,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=settings.fsx_throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType(settings.fsx_compression),
                weekly_maintenance_start_time=fsx.LustreMaintenanceTime(day=fsx.Weekday.SUNDAY, hour=3, minute=0),
            ),
        )
        self.datasets_association = fsx.CfnDataRepositoryAssociation(
            self,
            "DatasetsAssociation",
            file_system_id=self.file_system.file_system_id,
            file_system_path=DATASETS_PATH,
            data_repository_path=f"s3://{datasets.bucket_name}/",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=_ALL_EVENTS)
            ),
        )
        self.results_association: fsx.CfnDataRepositoryAssociation | None = None
        if settings.fsx_auto_export_prefix:
            self.results_association = fsx.CfnDataRepositoryAssociation(
                self,
                "ResultsAssociation",
                file_system_id=self.file_system.file_system_id,
                file_system_path=RESULTS_PATH,
                data_repository_path=f"s3://{artifacts.bucket_name}/{settings.fsx_auto_export_prefix}",
                batch_import_meta_data_on_create=False,
                s3=fsx.CfnDataRepositoryAssociation.S3Property(
                    auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=_ALL_EVENTS)
                ),
            )

        # FSx reads and writes the linked buckets through a per-file-system service-linked role,
        # which needs the bucket key; the role's name holds the file-system ID, hence ArnLike.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="FsxDataRepositoryAccess",
                principals=[iam.AnyPrincipal()],
                actions=["kms:Decrypt", "kms:GenerateDataKey*", "kms:DescribeKey"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "aws:PrincipalArn": (
                            f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/aws-service-role/"
                            "s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"
                        )
                    },
                    "StringEquals": {
                        "aws:PrincipalAccount": Aws.ACCOUNT_ID,
                        "kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com",
                    },
                },
            )
        )

    @property
    def mount_name(self) -> str:
        return self.file_system.mount_name

    @property
    def file_system_id(self) -> str:
        return self.file_system.file_system_id

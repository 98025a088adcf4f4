"""Data stack: the retained key, buckets and Lustre file system."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match

from tests.support.templates import get_att, logical_id, resources, template


def _key(platform: Any) -> str:
    return logical_id(platform, platform.data, "AWS::KMS::Key", "DataKey")


def test_stateful_stack_is_termination_protected(platform: Any) -> None:
    assert platform.data.termination_protection is True
    assert platform.image.termination_protection is True
    artifact = platform.assembly.get_stack_by_name(platform.data.stack_name)
    assert artifact.termination_protection is True


def test_customer_managed_key_rotates_and_is_retained(platform: Any) -> None:
    key = resources(platform, platform.data, "AWS::KMS::Key")[_key(platform)]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == key["UpdateReplacePolicy"] == "Retain"


def test_every_resource_in_the_data_stack_is_retained(platform: Any) -> None:
    template_json = platform.assembly.get_stack_by_name(platform.data.stack_name).template
    stateful = {"AWS::KMS::Key", "AWS::S3::Bucket", "AWS::FSx::FileSystem"}
    for logical, resource in template_json["Resources"].items():
        if resource["Type"] in stateful:
            assert resource.get("DeletionPolicy") == "Retain", logical


@pytest.mark.parametrize("bucket", ["Datasets", "Checkpoints", "Artifacts"])
def test_data_buckets_are_versioned_kms_encrypted_private_and_logged(platform: Any, bucket: str) -> None:
    t = template(platform, platform.data)
    logical = logical_id(platform, platform.data, "AWS::S3::Bucket", f"Buckets{bucket}")
    logs = logical_id(platform, platform.data, "AWS::S3::Bucket", "AccessLogs")
    props = resources(platform, platform.data, "AWS::S3::Bucket")[logical]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"] == [
        {
            "BucketKeyEnabled": True,
            "ServerSideEncryptionByDefault": {
                "KMSMasterKeyID": get_att(_key(platform), "Arn"),
                "SSEAlgorithm": "aws:kms",
            },
        }
    ]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["LoggingConfiguration"] == {
        "DestinationBucketName": {"Ref": logs},
        "LogFilePrefix": f"{bucket.lower()}/",
    }
    rule = next(r for r in props["LifecycleConfiguration"]["Rules"] if r["Id"] == "noncurrent-and-incomplete")
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    t.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": logical},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Principal": {"AWS": "*"},
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        ),
                        Match.object_like({"Effect": "Deny", "Condition": {"NumericLessThan": {"s3:TlsVersion": 1.2}}}),
                    ]
                ),
                "Version": "2012-10-17",
            },
        },
    )


def test_access_log_bucket_is_tls_only_and_expires_logs(platform: Any) -> None:
    logical = logical_id(platform, platform.data, "AWS::S3::Bucket", "AccessLogs")
    props = resources(platform, platform.data, "AWS::S3::Bucket")[logical]["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert props["LifecycleConfiguration"]["Rules"][0]["ExpirationInDays"] == 365
    policy = next(
        p
        for p in resources(platform, platform.data, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": logical}
    )
    denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert {"Bool": {"aws:SecureTransport": "false"}} in [s["Condition"] for s in denies]


def test_lustre_persistent_2_in_the_training_subnet_encrypted_with_the_key(platform: Any) -> None:
    t = template(platform, platform.data)
    t.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "StorageCapacity": 1200,
            "KmsKeyId": {"Ref": _key(platform)},
            "LustreConfiguration": {
                "DeploymentType": "PERSISTENT_2",
                "PerUnitStorageThroughput": 250,
                "DataCompressionType": "LZ4",
                "WeeklyMaintenanceStartTime": Match.any_value(),
            },
            "SubnetIds": [
                {
                    "Fn::GetStackOutput": Match.object_like(
                        {
                            "StackName": platform.network.stack_name,
                            "OutputName": Match.string_like_regexp("trainingSubnet1"),
                        }
                    )
                }
            ],
            "SecurityGroupIds": [
                {"Fn::GetStackOutput": Match.object_like({"OutputName": Match.string_like_regexp("LustreSg")})}
            ],
        },
    )


def test_datasets_association_lazy_loads_and_auto_imports(platform: Any) -> None:
    t = template(platform, platform.data)
    datasets = logical_id(platform, platform.data, "AWS::S3::Bucket", "BucketsDatasets")
    fs = logical_id(platform, platform.data, "AWS::FSx::FileSystem", "Lustre")
    t.resource_count_is("AWS::FSx::DataRepositoryAssociation", 1)  # no auto-export unless configured
    t.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemId": {"Ref": fs},
            "FileSystemPath": "/datasets",
            "DataRepositoryPath": {"Fn::Join": ["", ["s3://", {"Ref": datasets}, "/"]]},
            "BatchImportMetaDataOnCreate": True,
            "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
        },
    )


def test_fsx_can_use_the_key_through_s3_only(platform: Any) -> None:
    key = resources(platform, platform.data, "AWS::KMS::Key")[_key(platform)]
    statement = next(
        s for s in key["Properties"]["KeyPolicy"]["Statement"] if s.get("Sid") == "FsxDataRepositoryAccess"
    )
    assert statement["Action"] == ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey*"]
    assert "AWSServiceRoleForFSxS3Access_*" in str(statement["Condition"]["ArnLike"]["aws:PrincipalArn"])
    assert set(statement["Condition"]["StringEquals"]) == {"aws:PrincipalAccount", "kms:ViaService"}


def test_auto_export_of_a_results_prefix_when_configured(request: pytest.FixtureRequest) -> None:
    variant = request.getfixturevalue("variant")
    t = template(variant, variant.data)
    artifacts = logical_id(variant, variant.data, "AWS::S3::Bucket", "BucketsArtifacts")
    t.resource_count_is("AWS::FSx::DataRepositoryAssociation", 2)
    t.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/results",
            "DataRepositoryPath": {"Fn::Join": ["", ["s3://", {"Ref": artifacts}, "/results/"]]},
            "S3": {"AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
        },
    )

"""Deploy-time preconditions no local run can exercise, as rules over every resource of their kind.

An AWS service, not the platform's code, makes these calls: Lambda attaches functions to the VPC,
SageMaker pulls the image and encrypts volumes, S3/DynamoDB/SNS use the key for the caller. The
local platform cannot see them fail, so each is a rule here, evaluated with the same policy
evaluator that the local runs enforce with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from moto.iam.aws_managed_policies import aws_managed_policies_data

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.iam_policy import Policy, Request, evaluate
from tests.support.iam import AssemblyIam, Role, calls_in_handler, task_states

S3_READ, S3_WRITE = ("s3:GetObject",), ("s3:PutObject",)
TABLE_READ = ("dynamodb:GetItem", "dynamodb:Query", "dynamodb:Scan", "dynamodb:BatchGetItem")
TABLE_WRITE = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")
# What each data action needs of the resource's KMS key, per the services' KMS documentation.
KEY_NEEDS = {
    **{a: ("kms:Decrypt",) for a in (*S3_READ, *TABLE_READ)},
    **{a: ("kms:GenerateDataKey",) for a in S3_WRITE},
    **{a: ("kms:Decrypt", "kms:GenerateDataKey") for a in TABLE_WRITE},
    "sns:Publish": ("kms:Decrypt", "kms:GenerateDataKey"),
    "sqs:SendMessage": ("kms:Decrypt", "kms:GenerateDataKey"),
    # A CMK-encrypted state machine: answering a task token writes (encrypts) execution data.
    "states:SendTaskSuccess": ("kms:GenerateDataKey",),
    "states:SendTaskFailure": ("kms:GenerateDataKey",),
}
TASK_RESPONSES = {"send_task_success": "states:SendTaskSuccess", "send_task_failure": "states:SendTaskFailure"}


@pytest.fixture(scope="module")
def iam(platform: Any) -> AssemblyIam:
    return AssemblyIam(Path(platform.assembly.directory))


def _function_roles(iam: AssemblyIam) -> list[tuple[str, dict[str, Any], Role]]:
    return [(logical, props, iam.roles[props["Role"]]) for _, logical, props in iam.resources("AWS::Lambda::Function")]


def test_vpc_functions_can_manage_their_network_interfaces(iam: AssemblyIam) -> None:
    """Lambda refuses to create a VPC function whose role cannot manage its interfaces: each action of
    AWSLambdaVPCAccessExecutionRole on what the function's own interfaces are (its subnets, security
    groups and VPC; `*` for the describe actions, which take no resource)."""
    document = json.loads(aws_managed_policies_data)["AWSLambdaVPCAccessExecutionRole"]["Document"]
    needed = [a for s in document["Statement"] for a in s["Action"] if a.startswith("ec2:")]
    ((stack, logical, _),) = iam.resources("AWS::EC2::VPC")
    vpc = f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{iam.resolver.ref(stack, logical)}"
    interface = f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"
    in_vpc = [(logical, props, role) for logical, props, role in _function_roles(iam) if props.get("VpcConfig")]
    assert len(in_vpc) >= 7
    missing = {}
    for logical, props, role in in_vpc:
        ec2_arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
        resources = {
            "ec2:CreateNetworkInterface": [
                interface,
                *(f"{ec2_arn}:subnet/{s}" for s in props["VpcConfig"]["SubnetIds"]),
                *(f"{ec2_arn}:security-group/{g}" for g in props["VpcConfig"]["SecurityGroupIds"]),
            ],
            "ec2:DescribeNetworkInterfaces": ["*"],
            "ec2:DescribeSubnets": ["*"],
        }
        missing[logical] = [
            (action, resource)
            for action in needed
            for resource in resources.get(action, [interface])
            if not role.may(action, resource, **{"ec2:Vpc": vpc})
        ]
    assert {k: v for k, v in missing.items() if v} == {}


def test_every_function_that_resumes_a_task_token_may_send_it(iam: AssemblyIam) -> None:
    machines = [(stack, logical) for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")]
    waiting = [
        iam.resolver.ref(stack, logical)
        for stack, logical in machines
        if any("waitForTaskToken" in str(t.get("Resource")) for t in task_states(iam.definition(stack, logical)))
    ]
    assert waiting, "the pipeline has approval gates that wait for a task token"
    senders = []
    for logical, props, role in _function_roles(iam):
        if not props["Handler"].startswith("lambdas."):
            continue  # CDK's own provider functions
        for method, action in TASK_RESPONSES.items():
            if method in calls_in_handler(props["Handler"]):
                senders.append(logical)
                # SendTask* name no resource (Service Authorization Reference): IAM authorizes them on "*".
                denied = [] if role.may(action, "*") else waiting
                assert denied == [], f"{logical} calls {method} but its role cannot on {denied}"
    assert senders, "some function must answer the gates, or every gated run times out"


def _encrypted_resources(iam: AssemblyIam) -> list[tuple[str, str, str]]:
    """(kind, resource ARN, key ARN) of every resource encrypted with a customer-managed key."""
    found = []
    for _stack, _logical, props in iam.resources("AWS::S3::Bucket"):
        for rule in props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", []):
            default = rule["ServerSideEncryptionByDefault"]
            if default["SSEAlgorithm"] == "aws:kms":
                found.append(("bucket", f"arn:aws:s3:::{props['BucketName']}", default["KMSMasterKeyID"]))
    for stack, logical, props in iam.resources("AWS::DynamoDB::Table"):
        if props.get("SSESpecification", {}).get("KMSMasterKeyId"):
            found.append(("table", iam.arn(stack, logical), props["SSESpecification"]["KMSMasterKeyId"]))
    for stack, logical, props in iam.resources("AWS::SNS::Topic"):
        if props.get("KmsMasterKeyId"):
            found.append(("topic", iam.resolver.ref(stack, logical), props["KmsMasterKeyId"]))
    for stack, logical, props in iam.resources("AWS::SQS::Queue"):
        if props.get("KmsMasterKeyId"):
            found.append(("queue", iam.arn(stack, logical), props["KmsMasterKeyId"]))
    for stack, logical, props in iam.resources("AWS::StepFunctions::StateMachine"):
        if props.get("EncryptionConfiguration", {}).get("Type") == "CUSTOMER_MANAGED_KMS_KEY":
            found.append(
                ("state machine", iam.resolver.ref(stack, logical), props["EncryptionConfiguration"]["KmsKeyId"])
            )
    return found


def _key_context(kind: str, resource: str) -> dict[str, Any]:
    """The encryption context a service puts on the key calls it makes for `resource`."""
    return {"kms:EncryptionContext:aws:states:stateMachineArn": resource} if kind == "state machine" else {}


def _granted_paths(role: Role, bucket_arn: str) -> list[str]:
    """The object-ARN patterns a role's statements name in a bucket (used as the resource to test)."""
    patterns = []
    for policy in role.policies:
        for statement in policy.statements():
            resources = statement.get("Resource", [])
            for resource in [resources] if isinstance(resources, str) else resources:
                if resource.startswith(f"{bucket_arn}/"):
                    patterns.append(resource)
    return patterns


def test_every_role_that_touches_encrypted_data_can_use_its_key(iam: AssemblyIam) -> None:
    encrypted = _encrypted_resources(iam)
    assert {kind for kind, _, _ in encrypted} == {"bucket", "table", "topic", "queue", "state machine"}
    problems = []
    for role in iam.roles.values():
        for kind, resource, key in encrypted:
            targets = _granted_paths(role, resource) if kind == "bucket" else [resource]
            for action, needs in KEY_NEEDS.items():
                for target in targets:
                    if role.may(action, target):
                        problems += [
                            f"{role.logical}: {action} on {target} needs {need} on {key}"
                            for need in needs
                            if not iam.may_use_key(role, need, key, **_key_context(kind, resource))
                        ]
    assert problems == []


def test_services_that_write_to_encrypted_topics_and_queues_can_use_the_key(iam: AssemblyIam) -> None:
    """A topic or queue policy letting a service write (EventBridge dead letters, budget alerts) needs the key too."""
    keys = {resource: key for kind, resource, key in _encrypted_resources(iam) if kind in ("topic", "queue")}
    checked, problems = 0, []
    for type_ in ("AWS::SNS::TopicPolicy", "AWS::SQS::QueuePolicy"):
        for _, logical, props in iam.resources(type_):
            for statement in props["PolicyDocument"]["Statement"]:
                service = (
                    statement.get("Principal", {}).get("Service")
                    if isinstance(statement.get("Principal"), dict)
                    else None
                )
                if statement["Effect"] != "Allow" or service is None:
                    continue
                conditions = statement.get("Condition", {})
                source = next(
                    (block["aws:SourceArn"] for block in conditions.values() if "aws:SourceArn" in block), None
                )
                for resource in _as_list(statement["Resource"]):
                    key = keys.get(resource) or keys.get(_queue_arn(iam, resource))
                    if key is None:
                        continue
                    checked += 1
                    context = {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": source}
                    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
                        request = Request(action, key, context, known_keys=None, principal_service=service)
                        if not evaluate([iam.key_policy(key)], request).allowed:
                            problems.append(f"{logical}: {service} writes to {resource} but cannot {action} on its key")
    assert checked >= 2 and problems == []


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _queue_arn(iam: AssemblyIam, url_or_arn: str) -> str:
    """Queue policies name queues by URL (a Ref); keys are found by ARN."""
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url_or_arn.rsplit('/', 1)[-1]}"


def test_an_encrypted_state_machine_can_use_its_key(iam: AssemblyIam) -> None:
    """Step Functions encrypts and decrypts a CMK state machine's data with its execution role."""
    for stack, logical, props in iam.resources("AWS::StepFunctions::StateMachine"):
        configuration = props.get("EncryptionConfiguration", {})
        if configuration.get("Type") != "CUSTOMER_MANAGED_KMS_KEY":
            continue
        role = iam.roles[props["RoleArn"]]
        context = _key_context("state machine", iam.resolver.ref(stack, logical))
        for action in ("kms:Decrypt", "kms:GenerateDataKey"):
            assert iam.may_use_key(role, action, configuration["KmsKeyId"], **context), f"{logical}: {action}"


def test_every_key_stays_manageable_by_the_account(iam: AssemblyIam) -> None:
    """A key policy that locked the account out could never be changed or scheduled for deletion."""
    for _, logical, props in iam.resources("AWS::KMS::Key"):
        admin = Policy.parse(logical, props["KeyPolicy"], resource_policy=True)
        for action in ("kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:DescribeKey"):
            request = Request(action, "*", known_keys=None, principal_role=f"arn:aws:iam::{ACCOUNT}:root")
            assert evaluate([admin], request).allowed, f"{logical}: the account cannot {action}"


def _create_training_job(iam: AssemblyIam) -> dict[str, Any]:
    creates = [
        task["Parameters"]
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        for task in task_states(iam.definition(stack, logical))
        if task["Resource"].endswith(":sagemaker:createTrainingJob")
    ]
    assert creates, "the pipeline creates training jobs"
    return creates[0]


def test_the_training_role_can_run_a_vpc_job_with_fsx_ecr_and_kms(iam: AssemblyIam) -> None:
    """What SageMaker does with the execution role before and while the job trains."""
    request = _create_training_job(iam)
    role = iam.roles[request["RoleArn"]]
    assert role.trusted_by("sagemaker.amazonaws.com")
    subnet, group = request["VpcConfig"]["Subnets"][0], request["VpcConfig"]["SecurityGroupIds"][0]
    (vpc,) = {
        props["VpcId"]
        for stack, logical, props in iam.resources("AWS::EC2::Subnet")
        if iam.resolver.ref(stack, logical) == subnet
    }
    ec2 = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    interface = {"ec2:Vpc": f"{ec2}:vpc/{vpc}", "ec2:Subnet": f"{ec2}:subnet/{subnet}"}
    image = request["AlgorithmSpecification"]["TrainingImage"]
    repository = re.fullmatch(r"\d+\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/([^@:]+).*", image).group(1)  # type: ignore[union-attr]
    output, volume_key = request["OutputDataConfig"], request["ResourceConfig"]["VolumeKmsKeyId"]
    environment = next(
        props["Environment"]["Variables"]
        for _, logical, props in iam.resources("AWS::Lambda::Function")
        if logical.startswith("Validate")
    )
    datasets = f"arn:aws:s3:::{environment['DATASETS_BUCKET']}"
    checkpoints = request["CheckpointConfig"]["S3Uri.$"].split("'")[1].replace("s3://", "arn:aws:s3:::").format("job")
    logs = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs"
    needs: list[tuple[str, str, dict[str, Any]]] = [
        ("ec2:CreateNetworkInterface", f"{ec2}:subnet/{subnet}", {}),
        ("ec2:CreateNetworkInterface", f"{ec2}:security-group/{group}", {}),
        ("ec2:CreateNetworkInterface", f"{ec2}:network-interface/eni-1", {}),
        ("ec2:CreateNetworkInterfacePermission", f"{ec2}:network-interface/eni-1", interface),
        ("ec2:DeleteNetworkInterface", f"{ec2}:network-interface/eni-1", interface),
        ("ec2:DeleteNetworkInterfacePermission", f"{ec2}:network-interface/eni-1", interface),
        *(
            (f"ec2:{a}", "*", {})
            for a in (
                "DescribeNetworkInterfaces",
                "DescribeVpcs",
                "DescribeDhcpOptions",
                "DescribeSubnets",
                "DescribeSecurityGroups",
            )
        ),
        ("ecr:GetAuthorizationToken", "*", {}),
        *(
            (f"ecr:{a}", f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{repository}", {})
            for a in ("BatchGetImage", "GetDownloadUrlForLayer", "BatchCheckLayerAvailability")
        ),
        *((f"logs:{a}", f"{logs}:log-stream:job/algo-1", {}) for a in ("CreateLogStream", "PutLogEvents")),
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}),
        ("kms:CreateGrant", volume_key, {"kms:GrantIsForAWSResource": True}),
        ("kms:Encrypt", output["KmsKeyId"], {}),
        ("kms:GenerateDataKey", output["KmsKeyId"], {}),
        ("kms:Decrypt", output["KmsKeyId"], {}),
        ("s3:GetObject", f"{datasets}/corpus/train_000.bin", {}),
        ("s3:ListBucket", datasets, {"s3:prefix": "corpus/"}),
        # Not DeleteObject: SageMaker's sync mirrors local deletions, which the platform's prune does instead.
        *((f"s3:{a}", f"{checkpoints}step-1/manifest.json", {}) for a in ("GetObject", "PutObject")),
        ("s3:PutObject", output["S3OutputPath"].replace("s3://", "arn:aws:s3:::") + "job/output/model.tar.gz", {}),
        # The reference lets DescribeFileSystems name no file system: IAM authorizes it on "*".
        ("fsx:DescribeFileSystems", "*", {}),
    ]
    missing = [(action, resource) for action, resource, context in needs if not role.may(action, resource, **context)]
    assert missing == []


# The endpoint (interface or gateway service name) a VPC function's call to each service goes through.
ENDPOINT_OF = {
    "s3": "s3",
    "dynamodb": "dynamodb",
    "sagemaker": "sagemaker.api",
    "states": "states",
    "sns": "sns",
    "sts": "sts",
    "kms": "kms",
    "cloudwatch": "monitoring",
    "logs": "logs",
    "xray": "xray",
    "batch": "batch",
    "ecr": "ecr.api",
}
# Called with the function's role by Lambda itself, outside the VPC: its interfaces, its dead letters.
NOT_FROM_THE_VPC = {"ec2", "sqs"}


@pytest.mark.parametrize("assembly", ["shipped", "teams"])
def test_every_service_a_vpc_function_may_call_has_an_endpoint(assembly: str, request: pytest.FixtureRequest) -> None:
    """The VPC has no internet path: a call to a service without an endpoint times out in AWS, never locally. On
    the shipped settings and on the teams demo's (a queue, team approvers, a team admitted by its tag)."""
    if assembly == "shipped":
        iam = request.getfixturevalue("iam")
    else:
        iam = AssemblyIam(request.getfixturevalue("teams_assembly"))
    assert iam.resources("AWS::EC2::NatGateway") == [], "with a NAT gateway every service has a route"
    endpoints = {
        str(props["ServiceName"]).split(f".{REGION}.", 1)[1] for _, _, props in iam.resources("AWS::EC2::VPCEndpoint")
    }
    missing: dict[str, set[str]] = {}
    for logical, props, role in _function_roles(iam):
        if not props.get("VpcConfig"):
            continue
        services = {
            action.split(":")[0]
            for policy in role.policies
            for statement in policy.statements()
            if statement.get("Effect") == "Allow"
            for action in _as_list(statement.get("Action", []))
        } - NOT_FROM_THE_VPC
        unknown = services - set(ENDPOINT_OF)
        assert not unknown, f"{logical} may call {unknown}: name the endpoint its calls go through in ENDPOINT_OF"
        if lacking := {ENDPOINT_OF[s] for s in services} - endpoints:
            missing[logical] = lacking
    assert missing == {}

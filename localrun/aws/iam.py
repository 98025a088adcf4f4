"""IAM, enforced: every AWS call the local platform makes is authorized as AWS would authorize it.

Who calls what:
- a handler: its function's role (LocalPlatform runs each handler with that role's credentials);
- the state machine's service integrations (Lambda, SageMaker, SNS): the state machine's role;
- the local SageMaker runner (channels, checkpoints, model upload): the job's execution role;
- the harness (deploying into moto, seeding data, reading results): the account administrator,
  whose calls are not judged.
Each role is created in moto from the synthesized template and assumed only if its trust policy
lets the AWS service that would assume it in the cloud do so.

How a call is judged: moto still finds the session by its access key and checks its token;
its own policy check, which matches actions only (every non-S3 resource is `*`, conditions are
ignored), is replaced by `LocalIam.authorize`. That derives the IAM actions, resource ARNs and
condition keys of the API call from `REQUEST_MODEL` (the Service Authorization Reference, for
the operations the platform uses) and evaluates the role's policies, plus the bucket policy for
S3, with localrun/aws/iam_policy.py. An operation the model does not know is refused with a message
saying so: a gap in the model is never an Allow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import Credentials
from moto.core import authorization
from moto.core.exceptions import JsonRESTError, _RESTError
from moto.core.parse import PROTOCOL_PARSERS
from moto.core.request import determine_request_protocol
from moto.core.utils import get_service_model
from moto.iam.models import iam_backends
from moto.s3.exceptions import S3ClientError
from moto.s3.models import s3_backends
from moto.stepfunctions.parser.models import stepfunctions_parser_backends
from moto.sts.models import sts_backends

from lambdas.approvals.identity import BINDING_HEADER
from localrun.aws.cfn import ACCOUNT, REGION, Assembly, Resolver
from localrun.aws.iam_policy import Decision, Policy, Request, evaluate

# The services whose principals assume the platform's roles, by what they run.
LAMBDA, STATES, SAGEMAKER = "lambda.amazonaws.com", "states.amazonaws.com", "sagemaker.amazonaws.com"
_CREDENTIAL = re.compile(r"Credential=([^/]+)/")


@dataclass(frozen=True)
class Judgement:
    """One authorization decision, kept for tests and reports."""

    principal: str
    action: str
    resource: str
    allowed: bool
    reason: str


# -- the request model: API call -> IAM actions, resources, condition keys ------------------------
@dataclass(frozen=True)
class Call:
    service: str  # botocore's name: sagemaker, dynamodb, stepfunctions, sns, lambda, sts
    operation: str
    params: dict[str, Any]
    region: str = REGION
    account: str = ACCOUNT

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.account}:{resource}"


def _tags(tags: list[dict[str, str]] | dict[str, str] | None) -> dict[str, Any]:
    pairs = tags.items() if isinstance(tags, dict) else [(t["Key"], t["Value"]) for t in tags or []]
    context: dict[str, Any] = {f"aws:RequestTag/{k}": v for k, v in pairs}
    if context:
        context["aws:TagKeys"] = [k for k, _ in pairs]
    return context


def _pass_role(role_arn: str, service: str) -> Request:
    return Request(
        "iam:PassRole",
        role_arn,
        context={"iam:PassedToService": service},
        known_keys=frozenset({"iam:PassedToService", "iam:AssociatedResourceArn"}),
    )


_TRAINING_KEYS = frozenset(
    {
        "sagemaker:InstanceTypes",
        "sagemaker:VpcSubnets",
        "sagemaker:VpcSecurityGroupIds",
        "sagemaker:OutputKmsKey",
        "sagemaker:VolumeKmsKey",
        "sagemaker:InterContainerTrafficEncryption",
        "sagemaker:NetworkIsolation",
        "sagemaker:MaxRuntimeInSeconds",
        "sagemaker:KeepAlivePeriod",
        "sagemaker:FileSystemId",
        "sagemaker:FileSystemType",
        "sagemaker:FileSystemDirectoryPath",
        "sagemaker:FileSystemAccessMode",
        "sagemaker:EnableRemoteDebug",
    }
)


def _create_training_job(call: Call) -> list[Request]:
    p = call.params
    job = call.arn("sagemaker", f"training-job/{p['TrainingJobName'].lower()}")
    resources = p.get("ResourceConfig", {})
    groups = resources.get("InstanceGroups") or []
    vpc = p.get("VpcConfig") or {}
    file_systems = [
        c["DataSource"]["FileSystemDataSource"]
        for c in p.get("InputDataConfig", [])
        if "FileSystemDataSource" in c.get("DataSource", {})
    ]

    def each(field_: str) -> list[str] | None:
        return [f[field_] for f in file_systems] or None

    context = {
        "sagemaker:InstanceTypes": [resources["InstanceType"]]
        if "InstanceType" in resources
        else [g["InstanceType"] for g in groups],
        "sagemaker:VpcSubnets": vpc.get("Subnets"),
        "sagemaker:VpcSecurityGroupIds": vpc.get("SecurityGroupIds"),
        "sagemaker:OutputKmsKey": p.get("OutputDataConfig", {}).get("KmsKeyId"),
        "sagemaker:VolumeKmsKey": resources.get("VolumeKmsKeyId"),
        "sagemaker:InterContainerTrafficEncryption": p.get("EnableInterContainerTrafficEncryption"),
        "sagemaker:NetworkIsolation": p.get("EnableNetworkIsolation"),
        "sagemaker:MaxRuntimeInSeconds": p.get("StoppingCondition", {}).get("MaxRuntimeInSeconds"),
        "sagemaker:KeepAlivePeriod": resources.get("KeepAlivePeriodInSeconds"),
        "sagemaker:FileSystemId": each("FileSystemId"),
        "sagemaker:FileSystemType": each("FileSystemType"),
        "sagemaker:FileSystemDirectoryPath": each("DirectoryPath"),
        "sagemaker:FileSystemAccessMode": each("FileSystemAccessMode"),
        **_tags(p.get("Tags")),
    }
    requests = [
        Request("sagemaker:CreateTrainingJob", job, context, _TRAINING_KEYS),
        _pass_role(p["RoleArn"], SAGEMAKER),
    ]
    if p.get("Tags"):
        requests.append(Request("sagemaker:AddTags", job, _tags(p["Tags"])))
    return requests


# The condition keys SageMaker supports on CreateHyperParameterTuningJob (Service Authorization Reference).
_TUNING_KEYS = _TRAINING_KEYS - {"sagemaker:KeepAlivePeriod", "sagemaker:EnableRemoteDebug"}


def _tuning_job(call: Call) -> str:
    return call.arn("sagemaker", f"hyper-parameter-tuning-job/{call.params['HyperParameterTuningJobName'].lower()}")


def _create_tuning_job(call: Call) -> list[Request]:
    """CreateTrainingJob's condition context, read from the tuning job's training-job definition."""
    p = call.params
    definition = p.get("TrainingJobDefinition") or {}
    as_job = Call(
        call.service,
        "CreateTrainingJob",
        {**definition, "TrainingJobName": p["HyperParameterTuningJobName"], "Tags": p.get("Tags")},
        call.region,
        call.account,
    )
    create, pass_role, *tagging = _create_training_job(as_job)
    tuning = _tuning_job(call)
    context = {k: v for k, v in create.context.items() if k != "sagemaker:KeepAlivePeriod"}
    requests = [Request("sagemaker:CreateHyperParameterTuningJob", tuning, context, _TUNING_KEYS), pass_role]
    requests += [Request(t.action, tuning, t.context) for t in tagging]
    return requests


def _model_package_arn(call: Call, name: str) -> str:
    return name if name.startswith("arn:") else call.arn("sagemaker", f"model-package/{name.lower()}")


def _create_model_package(call: Call) -> list[Request]:
    p = call.params
    group = p["ModelPackageGroupName"]
    backend = sagemaker_backend(call)
    version = 1 + sum(1 for m in list(backend.model_packages.values()) if m.model_package_group_name == group)
    package = call.arn("sagemaker", f"model-package/{group.lower()}/{version}")
    metadata = {
        f"sagemaker:CustomerMetadataProperties/{k}": v for k, v in p.get("CustomerMetadataProperties", {}).items()
    }
    context = {"sagemaker:ModelApprovalStatus": p.get("ModelApprovalStatus"), **metadata, **_tags(p.get("Tags"))}
    keys = frozenset({"sagemaker:ModelApprovalStatus", *metadata})
    requests = [Request("sagemaker:CreateModelPackage", package, context, keys)]
    if p.get("Tags"):
        requests.append(Request("sagemaker:AddTags", package, _tags(p["Tags"])))
    return requests


def sagemaker_backend(call: Call) -> Any:
    from moto.sagemaker.models import sagemaker_backends  # noqa: PLC0415 - moto loads backends lazily

    return sagemaker_backends[call.account][call.region]


def _lambda_function(call: Call) -> str:
    name = call.params["FunctionName"]
    arn = name if name.startswith("arn:") else call.arn("lambda", f"function:{name}")
    qualifier = call.params.get("Qualifier")
    return f"{arn}:{qualifier}" if qualifier and arn.count(":") == 6 else arn


def _one(action: str, resource: Callable[[Call], str]) -> Callable[[Call], list[Request]]:
    return lambda call: [Request(action, resource(call))]


def _everything(action: str) -> Callable[[Call], list[Request]]:
    return lambda _call: [Request(action, "*")]


def _log_group(call: Call) -> str:
    """A log group as the Service Authorization Reference's log-group resource names it (its streams: `:*`)."""
    return call.arn("logs", f"log-group:{call.params['logGroupName']}:*")


def _training_job(call: Call) -> str:
    return call.arn("sagemaker", f"training-job/{call.params['TrainingJobName'].lower()}")


def _table(call: Call) -> str:
    table = call.arn("dynamodb", f"table/{call.params['TableName']}")
    index = call.params.get("IndexName")
    return f"{table}/index/{index}" if index else table


def _batch_get_item(call: Call) -> list[Request]:
    """BatchGetItem is authorized on each table it reads."""
    return [
        Request("dynamodb:BatchGetItem", call.arn("dynamodb", f"table/{name}")) for name in call.params["RequestItems"]
    ]


def _submit_job(call: Call) -> list[Request]:
    """SubmitJob is authorized on the queue and on the job definition, with its tags as request tags; tags on the
    job need TagResource."""
    p = call.params
    job = call.arn("batch", "job/*")
    tags = _tags(p.get("tags"))
    requests = [Request("batch:SubmitJob", p["jobQueue"], tags), Request("batch:SubmitJob", p["jobDefinition"], tags)]
    if p.get("tags"):
        requests.append(Request("batch:TagResource", job, _tags(p["tags"])))
    return requests


def _job_queue(call: Call) -> str:
    queue = call.params["jobQueue"]
    return queue if queue.startswith("arn:") else call.arn("batch", f"job-queue/{queue}")


def _submit_service_job(call: Call) -> list[Request]:
    """SubmitServiceJob is authorized on the queue and on the quota share it names, with its priority as a
    condition key; tags on the job need TagResource (as SubmitJob's)."""
    p = call.params
    context = {"batch:SchedulingPriority": p.get("schedulingPriority"), **_tags(p.get("tags"))}
    keys = frozenset({"batch:SchedulingPriority"})
    queue = _job_queue(call)
    requests = [Request("batch:SubmitServiceJob", queue, context, keys)]
    if p.get("quotaShareName"):
        requests.append(Request("batch:SubmitServiceJob", f"{queue}/quota-share/{p['quotaShareName']}", context, keys))
    if p.get("tags"):
        requests.append(Request("batch:TagResource", call.arn("batch", "service-job/*"), _tags(p["tags"])))
    return requests


def service_job_tags(job_id: str) -> dict[str, str]:
    """The tags of a service job, which IAM evaluates as aws:ResourceTag: none here; the local queue
    (localrun/backends/queue.py) patches in its jobs' tags."""
    return {}


def _kms_key(call: Call) -> str:
    """The key's ARN: named by KeyId, or (Decrypt of a symmetric ciphertext) by the ciphertext itself."""
    from moto.kms.models import kms_backends  # noqa: PLC0415 - moto loads backends lazily
    from moto.kms.utils import _deserialize_ciphertext_blob  # noqa: PLC0415

    backend = kms_backends[call.account][call.region]
    named = call.params.get("KeyId") or _deserialize_ciphertext_blob(call.params["CiphertextBlob"]).key_id
    return str(backend.describe_key(named).arn)


def _kms_use(action: str) -> Callable[[Call], list[Request]]:
    """Encrypt/Decrypt on the key, with the request's encryption context as condition keys."""

    def requests(call: Call) -> list[Request]:
        pairs = call.params.get("EncryptionContext") or {}
        context: dict[str, Any] = {f"kms:EncryptionContext:{k}": v for k, v in pairs.items()}
        if pairs:
            context["kms:EncryptionContextKeys"] = list(pairs)
        return [Request(action, _kms_key(call), context, None)]

    return requests


_BATCH_OPERATIONS = {
    "submitjob": "SubmitJob",
    "describejobs": "DescribeJobs",
    "listjobs": "ListJobs",
    "terminatejob": "TerminateJob",
    "submitservicejob": "SubmitServiceJob",
    "describeservicejob": "DescribeServiceJob",
    "terminateservicejob": "TerminateServiceJob",
    "listservicejobs": "ListServiceJobs",
    "describejobdefinitions": "DescribeJobDefinitions",
}
REQUEST_MODEL: dict[tuple[str, str], Callable[[Call], list[Request]]] = {
    ("batch", "SubmitJob"): _submit_job,
    ("batch", "DescribeJobs"): _everything("batch:DescribeJobs"),
    ("batch", "DescribeJobDefinitions"): _everything("batch:DescribeJobDefinitions"),
    ("batch", "ListJobs"): _everything("batch:ListJobs"),
    ("batch", "TerminateJob"): _one("batch:TerminateJob", lambda c: c.arn("batch", f"job/{c.params['jobId']}")),
    ("batch", "SubmitServiceJob"): _submit_service_job,
    # The reference names no resource for these two: IAM authorizes them on "*".
    ("batch", "DescribeServiceJob"): _everything("batch:DescribeServiceJob"),
    ("batch", "ListServiceJobs"): _everything("batch:ListServiceJobs"),
    ("batch", "TerminateServiceJob"): lambda c: [
        Request(
            "batch:TerminateServiceJob",
            c.arn("batch", f"service-job/{c.params['jobId']}"),
            {f"aws:ResourceTag/{k}": v for k, v in service_job_tags(c.params["jobId"]).items()},
        )
    ],
    ("sagemaker", "CreateTrainingJob"): _create_training_job,
    ("sagemaker", "DescribeTrainingJob"): _one("sagemaker:DescribeTrainingJob", _training_job),
    ("sagemaker", "StopTrainingJob"): _one("sagemaker:StopTrainingJob", _training_job),
    ("sagemaker", "ListTrainingJobs"): _everything("sagemaker:ListTrainingJobs"),
    ("sagemaker", "CreateHyperParameterTuningJob"): _create_tuning_job,
    ("sagemaker", "DescribeHyperParameterTuningJob"): _one("sagemaker:DescribeHyperParameterTuningJob", _tuning_job),
    ("sagemaker", "StopHyperParameterTuningJob"): _one("sagemaker:StopHyperParameterTuningJob", _tuning_job),
    ("sagemaker", "ListHyperParameterTuningJobs"): _everything("sagemaker:ListHyperParameterTuningJobs"),
    ("sagemaker", "ListTrainingJobsForHyperParameterTuningJob"): _one(
        "sagemaker:ListTrainingJobsForHyperParameterTuningJob", _tuning_job
    ),
    ("sagemaker", "Search"): _everything("sagemaker:Search"),
    ("sagemaker", "AddTags"): lambda c: [
        Request("sagemaker:AddTags", c.params["ResourceArn"], _tags(c.params["Tags"]))
    ],
    ("sagemaker", "ListTags"): _one("sagemaker:ListTags", lambda c: c.params["ResourceArn"]),
    ("sagemaker", "CreateModelPackage"): _create_model_package,
    ("sagemaker", "UpdateModelPackage"): lambda c: [
        Request(
            "sagemaker:UpdateModelPackage",
            _model_package_arn(c, c.params["ModelPackageArn"]),
            {"sagemaker:ModelApprovalStatus": c.params.get("ModelApprovalStatus")},
            frozenset({"sagemaker:ModelApprovalStatus"}),
        )
    ],
    ("sagemaker", "DescribeModelPackage"): _one(
        "sagemaker:DescribeModelPackage", lambda c: _model_package_arn(c, c.params["ModelPackageName"])
    ),
    ("sagemaker", "ListModelPackages"): _everything("sagemaker:ListModelPackages"),
    ("dynamodb", "GetItem"): _one("dynamodb:GetItem", _table),
    ("dynamodb", "BatchGetItem"): _batch_get_item,
    ("dynamodb", "PutItem"): _one("dynamodb:PutItem", _table),
    ("dynamodb", "UpdateItem"): _one("dynamodb:UpdateItem", _table),
    ("dynamodb", "DeleteItem"): _one("dynamodb:DeleteItem", _table),
    ("dynamodb", "Query"): _one("dynamodb:Query", _table),
    ("dynamodb", "Scan"): _one("dynamodb:Scan", _table),
    ("dynamodb", "DescribeTable"): _one("dynamodb:DescribeTable", _table),
    ("sns", "Publish"): _one("sns:Publish", lambda c: c.params.get("TopicArn") or c.params["TargetArn"]),
    ("lambda", "Invoke"): _one("lambda:InvokeFunction", _lambda_function),
    # The reference lets SendTask* name no resource: IAM authorizes them on "*", whatever the token.
    ("stepfunctions", "SendTaskSuccess"): _everything("states:SendTaskSuccess"),
    ("stepfunctions", "SendTaskFailure"): _everything("states:SendTaskFailure"),
    ("stepfunctions", "SendTaskHeartbeat"): _everything("states:SendTaskHeartbeat"),
    ("stepfunctions", "StartExecution"): _one("states:StartExecution", lambda c: c.params["stateMachineArn"]),
    ("stepfunctions", "DescribeExecution"): _one("states:DescribeExecution", lambda c: c.params["executionArn"]),
    ("stepfunctions", "GetExecutionHistory"): _one("states:GetExecutionHistory", lambda c: c.params["executionArn"]),
    ("stepfunctions", "StopExecution"): _one("states:StopExecution", lambda c: c.params["executionArn"]),
    ("sts", "AssumeRole"): _one("sts:AssumeRole", lambda c: c.params["RoleArn"]),
    # What `tp` reads of a stage (the local platform serves it on loopback: localrun/aws/served.py).
    ("stepfunctions", "ListExecutions"): _one("states:ListExecutions", lambda c: c.params["stateMachineArn"]),
    ("logs", "DescribeLogStreams"): _one("logs:DescribeLogStreams", _log_group),
    ("logs", "FilterLogEvents"): _one("logs:FilterLogEvents", _log_group),
    ("logs", "GetLogEvents"): _one(
        "logs:GetLogEvents", lambda c: f"{_log_group(c).removesuffix(':*')}:log-stream:{c.params['logStreamName']}"
    ),
    ("iam", "ListRoleTags"): _one(
        "iam:ListRoleTags", lambda c: f"arn:aws:iam::{c.account}:role/{c.params['RoleName']}"
    ),
    ("kms", "Encrypt"): _kms_use("kms:Encrypt"),
    ("kms", "Decrypt"): _kms_use("kms:Decrypt"),
}
# S3 condition keys the model computes (moto names S3's IAM action and resource itself).
_S3_KEYS = frozenset(
    {
        "s3:prefix",
        "s3:delimiter",
        "s3:x-amz-server-side-encryption",
        "s3:x-amz-server-side-encryption-aws-kms-key-id",
        "s3:TlsVersion",
        "s3:authType",
        "s3:signatureversion",
        "s3:if-none-match",
    }
)


def _s3_request(response: Any, action: str, resource: str) -> Request:
    query = response.querystring
    headers = response.headers
    https = urlparse(response.uri).scheme == "https"
    context = {
        # The SDK speaks TLS 1.2 or later to AWS; locally there is no handshake to read it from.
        "s3:TlsVersion": "1.2" if https else None,
        "s3:authType": "REST-HEADER",
        "s3:signatureversion": "AWS4-HMAC-SHA256",
        "s3:prefix": (query.get("prefix") or [None])[0],
        "s3:delimiter": (query.get("delimiter") or [None])[0],
        "s3:x-amz-server-side-encryption": headers.get("x-amz-server-side-encryption"),
        "s3:x-amz-server-side-encryption-aws-kms-key-id": headers.get("x-amz-server-side-encryption-aws-kms-key-id"),
        # A conditional write's header (PutObject, CompleteMultipartUpload); S3's condition key names it in lower case.
        "s3:if-none-match": headers.get("If-None-Match"),
    }
    return Request(f"s3:{action}", resource, context, _S3_KEYS)


def _deleted_keys(response: Any) -> list[str]:
    """The keys of a DeleteObjects request body (<Delete><Object><Key>...)."""
    from xml.etree import ElementTree  # noqa: PLC0415

    root = ElementTree.fromstring(response.raw_body)  # noqa: S314 - moto's own request, built by botocore
    return [element.text or "" for element in root.iter() if element.tag.endswith("Key")]


# -- moto integration ---------------------------------------------------------------------------
def _request_params(response: Any, operation: str) -> dict[str, Any]:
    """The API call's parameters, parsed with the service's own botocore model (as moto parses them)."""
    service_model = get_service_model(response.boto3_service_name)
    request = response.normalized_request
    protocol = determine_request_protocol(service_model, request.content_type)
    parser = PROTOCOL_PARSERS[protocol](service_model.operation_model(operation), map_type=dict)
    parsed = parser.parse(
        {
            "method": request.method,
            "values": request.values,
            "headers": request.headers,
            "body": request.data,
            "url_path": request.path,
            "url_params": response.uri_match,
        }
    )
    return dict(parsed)


def _denied(response: Any, message: str) -> Exception:
    """The service's own spelling of AccessDenied, so callers (and Step Functions) see what AWS sends."""
    if response.boto3_service_name == "s3":
        return S3ClientError("AccessDenied", message)
    protocol = get_service_model(response.boto3_service_name).protocol
    if protocol in ("json", "rest-json"):
        error = JsonRESTError("AccessDeniedException", message)
        error.code = 403 if protocol == "rest-json" else 400
        return error
    error_type = "AuthorizationError" if response.boto3_service_name == "sns" else "AccessDenied"
    rest = _RESTError(error_type, message)
    rest.code = 403
    return rest


@dataclass
class LocalIam:
    """The platform's roles in moto, their sessions, and the authorizer that judges their calls."""

    assembly: Assembly
    resolver: Resolver
    operator_key: str
    judgements: list[Judgement] = field(default_factory=list)
    _sessions: dict[tuple[str, str], Credentials] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- roles ------------------------------------------------------------------------------------
    def deploy_roles(self) -> None:
        """Create every IAM role of the assembly with its trust policy and its policies, and every managed policy."""
        iam = boto3.client("iam", region_name=REGION)
        for stack, logical, managed in self.assembly.resources("AWS::IAM::ManagedPolicy"):
            props = self.resolver.resolve(stack, managed["Properties"])
            arn = self.resolver.ref(stack, logical)
            iam.create_policy(PolicyName=arn.rsplit("/", 1)[-1], PolicyDocument=json.dumps(props["PolicyDocument"]))
        for stack, logical, role in self.assembly.resources("AWS::IAM::Role"):
            props = self.resolver.resolve(stack, role["Properties"])
            name = self.resolver.ref(stack, logical)
            iam.create_role(
                RoleName=name,
                Path=props.get("Path", "/"),
                AssumeRolePolicyDocument=json.dumps(props["AssumeRolePolicyDocument"]),
            )
            for policy in props.get("Policies", []):
                iam.put_role_policy(
                    RoleName=name, PolicyName=policy["PolicyName"], PolicyDocument=json.dumps(policy["PolicyDocument"])
                )
            for arn in props.get("ManagedPolicyArns", []):
                iam.attach_role_policy(RoleName=name, PolicyArn=arn)
        for stack, logical, managed in self.assembly.resources("AWS::IAM::ManagedPolicy"):
            props = self.resolver.resolve(stack, managed["Properties"])
            for role in props.get("Roles", []):
                iam.attach_role_policy(RoleName=role, PolicyArn=self.resolver.ref(stack, logical))
        for stack, logical, policy in self.assembly.resources("AWS::IAM::Policy"):
            props = self.resolver.resolve(stack, policy["Properties"])
            for role in props.get("Roles", []):
                iam.put_role_policy(
                    RoleName=role,
                    PolicyName=props.get("PolicyName", logical),
                    PolicyDocument=json.dumps(props["PolicyDocument"]),
                )

    def role_policies(self, role_name: str) -> list[Policy]:
        backend = iam_backends[ACCOUNT]["aws"]
        role = backend.get_role(role_name)
        # Copies, each taken in one step: the harness changes roles' policies on its own thread while handlers run.
        policies = [Policy.parse(f"{role_name}/{name}", doc) for name, doc in list(role.policies.items())]
        for managed in list(role.managed_policies.values()):
            version = next(v for v in managed.versions if v.is_default)
            policies.append(Policy.parse(managed.arn, version.document))
        return policies

    def credentials(self, role_arn: str, service: str, source_arn: str | None = None) -> Credentials:
        """A session of `role_arn` as `service` obtains it for `source_arn`: only if the trust policy allows.

        The service states the account and the resource it acts for (aws:SourceAccount, aws:SourceArn),
        which trust policies check against confused deputies.
        """
        with self._lock:
            cached = self._sessions.get((role_arn, service))
            if cached is not None:
                return cached
            role = iam_backends[ACCOUNT]["aws"].get_role_by_arn(role_arn)
            trust = Policy.parse(f"{role.name} trust policy", role.assume_role_policy_document, resource_policy=True)
            context = {"aws:SourceAccount": ACCOUNT, "aws:SourceArn": source_arn}
            decision = evaluate([trust], Request("sts:AssumeRole", role_arn, context, principal_service=service))
            if not decision.allowed:
                raise PermissionError(
                    f"{service} cannot assume {role_arn} for {source_arn or 'this account'}: its trust policy "
                    f"does not allow it ({decision.reason})"
                )
            session = sts_backends[ACCOUNT]["aws"].assume_role(
                region_name=REGION,
                role_session_name=service.split(".", maxsplit=1)[0],
                role_arn=role_arn,
                policy="",
                duration=43200,
                external_id="",
            )
            credentials = Credentials(session.access_key_id, session.secret_access_key, session.session_token)
            self._sessions[(role_arn, service)] = credentials
            return credentials

    # -- judging calls --------------------------------------------------------------------------
    def authorize(self, response: Any, iam_request_cls: type, resource: str) -> None:
        match = _CREDENTIAL.search(response.headers.get("Authorization", ""))
        if match is None:
            # Anonymous: no platform policy allows one, and Block Public Access keeps it so.
            raise _denied(response, "Anonymous users are not authorized: the request carries no signature")
        if match.group(1) == self.operator_key:
            return  # the harness: the account administrator who deployed the platform
        url = urlparse(response.uri)
        iam_request = iam_request_cls(
            account_id=response.current_account,
            method=response.method,
            path=response.raw_path + (f"?{url.query}" if url.query else ""),
            data=response.data,
            body=response.raw_body,
            headers=response.headers,
            action=response._get_action(),
        )
        # The session is identified by its access key and proven by its session token (moto checks
        # both above); moto's signature recomputation cannot verify S3's chunked uploads, so it runs
        # only where a signature is what is being tested: a proof (bound to its request) replayed.
        if any(response.headers.get(name) is not None for name in (BINDING_HEADER, BINDING_HEADER.lower())):
            iam_request.check_signature()
        session = iam_request._access_key
        role_name = session._owner_role_name
        role = iam_backends[ACCOUNT]["aws"].get_role(role_name)
        # aws:PrincipalArn of a role's session is the role's ARN, its path included.
        principal = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": role.arn} | {
            f"aws:PrincipalTag/{tag['Key']}": tag["Value"] for tag in role.tags
        }
        network = getattr(_acting, "network", None)  # the VPC's S3 endpoint, for a VPC function's S3 calls
        if response.boto3_service_name == "s3" and network:
            principal["aws:SourceVpce"] = network
        for modelled in self._requests(response, resource):
            request = Request(
                modelled.action,
                modelled.resource,
                {**modelled.context, **principal, "aws:SecureTransport": url.scheme == "https"},
                modelled.known_keys,
                principal=session.arn,
                principal_role=role.arn,
            )
            if response.boto3_service_name == "kms":
                decision = self._key_policy_decision(request, role_name)
            else:
                policies = self.role_policies(role_name) + self._resource_policies(response, request)
                decision = evaluate(policies, request)
            self._record(session.arn, request, decision)
            if not decision.allowed:
                raise _denied(
                    response,
                    f"User: {session.arn} is not authorized to perform: {request.action} on resource: "
                    f"{request.resource} because {decision.reason}",
                )

    def _requests(self, response: Any, resource: str) -> list[Request]:
        service = response.boto3_service_name
        if service == "s3" and response.method == "POST" and "delete" in response.querystring:
            # DeleteObjects: AWS authorizes s3:DeleteObject on each key (moto, on the bucket).
            return [_s3_request(response, "DeleteObject", f"{resource}/{key}") for key in _deleted_keys(response)]
        if service == "s3":
            return [_s3_request(response, response.data["Action"], resource)]
        operation = response._get_action()
        # moto's Batch names the action by its lower-case URL path (/v1/submitjob).
        operation = _BATCH_OPERATIONS.get(operation, operation) if service == "batch" else operation
        if (service, operation) == ("sts", "GetCallerIdentity"):
            return []  # needs no permission in AWS
        model = REQUEST_MODEL.get((service, operation))
        if model is None:
            raise _denied(
                response,
                f"{service}:{operation} is not in the local IAM request model (localrun/aws/iam.py REQUEST_MODEL); "
                "add its actions, resources and condition keys from the Service Authorization Reference",
            )
        return model(Call(service, operation, _request_params(response, operation), response.region))

    def _key_policy_decision(self, request: Request, role_name: str) -> Decision:
        """KMS: the key policy decides; IAM policies count only where it lets the account's IAM grant the action."""
        from moto.kms.models import kms_backends  # noqa: PLC0415 - moto loads backends lazily

        key = kms_backends[ACCOUNT][REGION].describe_key(request.resource)
        key_policy = Policy.parse(f"key policy of {key.id}", key.policy, resource_policy=True)
        direct = evaluate([key_policy], request)
        root = f"arn:aws:iam::{ACCOUNT}:root"
        delegated = evaluate([key_policy], dataclasses.replace(request, principal=root, principal_role=root))
        if direct.allowed or not delegated.allowed:
            return direct
        return evaluate([key_policy, *self.role_policies(role_name)], request)

    def _resource_policies(self, response: Any, request: Request) -> list[Policy]:
        if response.boto3_service_name != "s3":
            return []
        bucket_name = request.resource.removeprefix("arn:aws:s3:::").split("/", 1)[0]
        bucket = s3_backends[ACCOUNT]["aws"].buckets.get(bucket_name)
        if bucket is None or not bucket.policy:
            return []
        return [Policy.parse(f"bucket policy of {bucket_name}", bucket.policy.decode(), resource_policy=True)]

    def _record(self, principal: str, request: Request, decision: Decision) -> None:
        with self._lock:
            self.judgements.append(
                Judgement(principal, request.action, request.resource, decision.allowed, decision.reason)
            )

    def denials(self) -> list[Judgement]:
        return [j for j in self.judgements if not j.allowed]

    # -- enforcement ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def enforced(self) -> Iterator[None]:
        """Judge every call made with role credentials; route the state machine's calls through its role."""
        iam = self

        def authorize(response: Any, iam_request_cls: type, resource: str = "*") -> None:
            iam.authorize(response, iam_request_cls, resource)

        with contextlib.ExitStack() as stack:
            stack.enter_context(authorization.enable_iam_authentication())
            stack.enter_context(
                _patch(authorization.ActionAuthenticatorMixin, "_authenticate_and_authorize_action", authorize)
            )
            for module in _modules_using_boto_client_for():
                stack.enter_context(_patch(module, "boto_client_for", self._state_machine_client))
            stack.enter_context(_patch(botocore.session.Session, "get_credentials", _get_credentials))
            yield

    def _state_machine_client(self, region: str, service: str, state_credentials: Any = None) -> Any:
        """Step Functions calls services with the state machine's role, validating parameters as AWS does."""
        if state_credentials is None:
            raise PermissionError(f"a Step Functions call to {service} carried no role to sign with")
        role = state_credentials.role_arn
        machines = stepfunctions_parser_backends[ACCOUNT][region].state_machines
        source = next((m.arn for m in machines if m.roleArn == role), None)
        credentials = self.credentials(role, STATES, source)
        return boto3.client(
            service,
            region_name=region,
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            aws_session_token=credentials.token,
            config=Config(retries={"max_attempts": 0, "total_max_attempts": 1}, connect_timeout=60, read_timeout=60),
        )


def _modules_using_boto_client_for() -> list[Any]:
    from moto.stepfunctions.parser.asl.utils import boto_client  # noqa: PLC0415

    original = boto_client.boto_client_for
    return [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("moto.stepfunctions") and getattr(module, "boto_client_for", None) is original
    ]


@contextlib.contextmanager
def _patch(target: Any, attribute: str, value: Any) -> Iterator[None]:
    saved = getattr(target, attribute)
    setattr(target, attribute, value)
    try:
        yield
    finally:
        setattr(target, attribute, saved)


# -- handler credentials --------------------------------------------------------------------------
_acting = threading.local()
_original_get_credentials = botocore.session.Session.get_credentials


def _get_credentials(session: botocore.session.Session) -> Credentials | None:
    credentials: Credentials | None = getattr(_acting, "credentials", None)
    return credentials if credentials is not None else _original_get_credentials(session)


@contextlib.contextmanager
def acting_as(credentials: Credentials | None, *, s3_endpoint: str | None = None) -> Iterator[None]:
    """Clients this thread creates without keys (`boto3.client("s3")`) sign with `credentials` (None: the harness's).
    `s3_endpoint`: the thread runs in the VPC, whose S3 calls go through that gateway endpoint (aws:SourceVpce).

    Takes effect while `LocalIam.enforced()` is active, which routes botocore's credential lookup here.
    """
    previous = getattr(_acting, "credentials", None), getattr(_acting, "network", None)
    _acting.credentials, _acting.network = credentials, s3_endpoint
    try:
        yield
    finally:
        _acting.credentials, _acting.network = previous

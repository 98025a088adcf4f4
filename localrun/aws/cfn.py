"""Resolve a synthesized cloud assembly's templates into concrete values, as a deploy would.

CloudFormation resolves Refs, GetAtts, joins and cross-stack outputs at deploy time; offline,
this module does the same with deterministic stand-ins for physical IDs (account
123456789012, Region us-east-1, IDs derived from logical IDs), so that the exact state
machine definition and handler environments of the assembly can run in moto.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
PSEUDO = {
    "AWS::AccountId": ACCOUNT,
    "AWS::Region": REGION,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": None,
}
_SERVICE = {
    "AWS::Lambda::Function": "lambda",
    "AWS::IAM::Role": "iam",
    "AWS::SNS::Topic": "sns",
    "AWS::DynamoDB::Table": "dynamodb",
    "AWS::KMS::Key": "kms",
    "AWS::StepFunctions::StateMachine": "states",
    "AWS::Logs::LogGroup": "logs",
    "AWS::ECR::Repository": "ecr",
    "AWS::CodeBuild::Project": "codebuild",
    "AWS::SageMaker::ModelPackageGroup": "sagemaker",
}


# Arn attributes whose format is not arn:aws:<service>:<region>:<account>:<logical id>.
_ARNS = {
    "AWS::S3::Bucket": "arn:aws:s3:::{name}",
    "AWS::Lambda::Function": "arn:aws:lambda:{region}:{account}:function:{name}",
    "AWS::IAM::Role": "arn:aws:iam::{account}:role{path}{name}",
    "AWS::Logs::LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}:*",
    "AWS::KMS::Key": "arn:aws:kms:{region}:{account}:key/{name}",
    "AWS::ECR::Repository": "arn:aws:ecr:{region}:{account}:repository/{name}",
    "AWS::DynamoDB::Table": "arn:aws:dynamodb:{region}:{account}:table/{name}",
    "AWS::Events::Rule": "arn:aws:events:{region}:{account}:rule/{name}",
    "AWS::SQS::Queue": "arn:aws:sqs:{region}:{account}:{name}",
    "AWS::CodeBuild::Project": "arn:aws:codebuild:{region}:{account}:project/{name}",
}


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _logical_id_paths(directory: Path, artifact: dict[str, Any]) -> dict[str, str]:
    """Logical ID -> construct path, from a stack's metadata (in the manifest or the file it names)."""
    metadata: dict[str, list[dict[str, Any]]] = dict(artifact.get("metadata", {}))
    if "additionalMetadataFile" in artifact:
        metadata.update(json.loads((directory / artifact["additionalMetadataFile"]).read_text()))
    return {
        entry["data"]: path
        for path, entries in metadata.items()
        for entry in entries
        if entry["type"] == "aws:cdk:logicalId"
    }


@dataclass
class Assembly:
    """The templates of a cloud assembly directory, by stack name, and their resources' construct paths."""

    directory: Path
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # stack -> logical ID -> construct path as the metadata writes it ("/<stack>/Monitor/Function/Resource").
    construct_paths: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path) -> Assembly:
        manifest = json.loads((directory / "manifest.json").read_text())
        templates = {}
        paths = {}
        for artifact in manifest["artifacts"].values():
            if artifact["type"] == "aws:cloudformation:stack":
                name = artifact["properties"].get("stackName") or artifact["displayName"]
                templates[name] = json.loads((directory / artifact["properties"]["templateFile"]).read_text())
                paths[name] = _logical_id_paths(directory, artifact)
        return cls(directory=directory, templates=templates, construct_paths=paths)

    def resources(self, type_: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(stack, logical ID, resource) of every resource of a type."""
        for stack, template in self.templates.items():
            for logical, resource in template.get("Resources", {}).items():
                if resource["Type"] == type_:
                    yield stack, logical, resource

    def stack_named(self, suffix: str) -> str:
        matches = [s for s in self.templates if s.endswith(suffix)]
        if len(matches) != 1:
            raise KeyError(f"expected one stack ending in {suffix!r}, found {matches} among {sorted(self.templates)}")
        return matches[0]


class Resolver:
    """Deterministic stand-ins for what CloudFormation would return."""

    def __init__(self, assembly: Assembly) -> None:
        self.assembly = assembly

    def resolve(self, stack: str, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(stack, v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self.ref(stack, arg)
            if key == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.get_att(stack, logical, attribute)
            if key == "Fn::Join":
                delimiter, items = arg
                return str(delimiter).join(str(self.resolve(stack, i)) for i in self.resolve(stack, items))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(stack, items)[int(self.resolve(stack, index))]
            if key == "Fn::Split":
                delimiter, text = arg
                return str(self.resolve(stack, text)).split(delimiter)
            if key == "Fn::Sub":
                return self._sub(stack, arg)
            if key == "Fn::GetStackOutput":
                producer = self.resolve(stack, arg["StackName"])
                output = self.assembly.templates[producer]["Outputs"][arg["OutputName"]]
                return self.resolve(producer, output["Value"])
            if key == "Fn::ImportValue":
                return self._import(self.resolve(stack, arg))
            if key == "Fn::GetAZs":
                return [f"{REGION}a", f"{REGION}b", f"{REGION}c"]
        return {k: self.resolve(stack, v) for k, v in value.items()}

    def _sub(self, stack: str, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return str(self.resolve(stack, variables[name]))
            if "." in name:
                logical, attribute = name.split(".", 1)
                return str(self.get_att(stack, logical, attribute))
            return str(self.ref(stack, name))

        return re.sub(r"\$\{([^}]+)\}", replace, text)

    def _import(self, name: str) -> Any:
        for stack, template in self.assembly.templates.items():
            for output in template.get("Outputs", {}).values():
                if output.get("Export", {}).get("Name") == name:
                    return self.resolve(stack, output["Value"])
        raise KeyError(f"no export named {name}")

    def _resource(self, stack: str, logical: str) -> dict[str, Any]:
        return self.assembly.templates[stack]["Resources"][logical]  # type: ignore[no-any-return]

    def ref(self, stack: str, logical: str) -> Any:
        if logical in PSEUDO:
            return PSEUDO[logical]
        if logical == "AWS::StackName":
            return stack
        parameters = self.assembly.templates[stack].get("Parameters", {})
        if logical in parameters:
            return parameters[logical].get("Default", "")
        resource = self._resource(stack, logical)
        props = resource.get("Properties", {})
        type_ = resource["Type"]
        if type_ == "AWS::S3::Bucket":
            return self.resolve(stack, props.get("BucketName", logical.lower()))
        if type_ == "AWS::SNS::Topic":
            return f"arn:aws:sns:{REGION}:{ACCOUNT}:{logical}"
        if type_ == "AWS::StepFunctions::StateMachine":
            return f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{props.get('StateMachineName', logical)}"
        if type_ == "AWS::KMS::Key":
            h = _digest(logical, 32)
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        if type_ == "AWS::EC2::Subnet":
            return f"subnet-{_digest(logical, 17)}"
        if type_ == "AWS::EC2::SecurityGroup":
            return f"sg-{_digest(logical, 17)}"
        if type_ == "AWS::EC2::VPC":
            return f"vpc-{_digest(logical, 17)}"
        if type_ == "AWS::EC2::VPCEndpoint":
            return f"vpce-{_digest(logical, 17)}"
        if type_ == "AWS::FSx::FileSystem":
            return f"fs-{_digest(logical, 17)}"
        if type_ == "AWS::SageMaker::ModelPackageGroup":
            return self.get_att(stack, logical, "ModelPackageGroupArn")
        if type_ == "AWS::Batch::JobDefinition":  # Ref is the definition's ARN, with its revision
            return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/{logical}:1"
        if type_ == "AWS::IAM::ManagedPolicy":  # Ref is the policy's ARN
            return f"arn:aws:iam::{ACCOUNT}:policy/{self.resolve(stack, props.get('ManagedPolicyName', logical))}"
        name_prop = {
            "AWS::Lambda::Function": "FunctionName",
            "AWS::DynamoDB::Table": "TableName",
            "AWS::IAM::Role": "RoleName",
            "AWS::Logs::LogGroup": "LogGroupName",
            "AWS::ECR::Repository": "RepositoryName",
        }.get(type_)
        if name_prop and name_prop in props:
            return self.resolve(stack, props[name_prop])
        return logical.lower() if type_ == "AWS::ECR::Repository" else logical

    def get_att(self, stack: str, logical: str, attribute: str) -> Any:
        resource = self._resource(stack, logical)
        type_ = resource["Type"]
        props = resource.get("Properties", {})
        if type_ == "AWS::FSx::FileSystem" and attribute == "LustreMountName":
            return _digest(logical + "mount", 8)
        if type_ == "AWS::StepFunctions::StateMachine" and attribute == "Name":
            return props.get("StateMachineName", logical)
        if type_ == "AWS::EC2::SecurityGroup" and attribute == "GroupId":
            return self.ref(stack, logical)
        if type_ == "AWS::Lambda::Url" and attribute == "FunctionUrl":
            return f"https://{_digest(logical, 32)}.lambda-url.{REGION}.on.aws/"
        if type_ == "Custom::TrainingImage":
            digest = f"sha256:{_digest(logical + 'image', 64)}"
            repository = self.ref(stack, props["RepositoryName"]["Ref"])
            uri = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{repository}@{digest}"
            return {"ImageDigest": digest, "ImageUri": uri, "ImageTag": props["ImageTag"]}[attribute]
        if type_ == "AWS::Batch::JobQueue" and attribute == "JobQueueArn":
            return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{logical}"
        if type_ == "AWS::Batch::QuotaShare" and attribute == "QuotaShareArn":
            queue = self.resolve(stack, props["JobQueue"])
            return f"{queue}/quota-share/{self.resolve(stack, props['QuotaShareName'])}"
        if type_ == "AWS::Batch::ServiceEnvironment" and attribute == "ServiceEnvironmentArn":
            return f"arn:aws:batch:{REGION}:{ACCOUNT}:service-environment/{logical}"
        if type_ == "AWS::SageMaker::ModelPackageGroup" and attribute == "ModelPackageGroupArn":
            group = self.resolve(stack, props["ModelPackageGroupName"])
            return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package-group/{group}"
        if attribute == "Arn":
            arn = _ARNS.get(type_)
            if arn is not None:
                # A role's ARN holds its path (IAM's default "/").
                path = props.get("Path", "/")
                return arn.format(region=REGION, account=ACCOUNT, name=self.ref(stack, logical), path=path)
            service = _SERVICE.get(type_, type_.split("::")[1].lower())
            return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{logical}"
        return f"{logical}.{attribute}"

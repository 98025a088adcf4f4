"""Run the synthesized state machine in moto's engine with the real handlers, path by path."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from contract.layout import split_s3_uri
from contract.service_requests import TrainingJobConstants
from localrun.aws import construct_paths
from localrun.aws.cfn import REGION, Assembly, Resolver
from localrun.aws.clock import Clock
from localrun.aws.engine import REST_SECONDS, LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from tests.conftest import APPROVER, PATH_APPROVER, platform_context


def sagemaker_constants(params: dict[str, Any]) -> TrainingJobConstants:
    """The deployment's constants as a CreateTrainingJob the state machine sent holds them (not the request's)."""
    return TrainingJobConstants(
        role_arn=params["RoleArn"],
        training_image=params["AlgorithmSpecification"]["TrainingImage"],
        key_arn=params["OutputDataConfig"]["KmsKeyId"],
        subnet=params["VpcConfig"]["Subnets"][0],
        security_group=params["VpcConfig"]["SecurityGroupIds"][0],
        checkpoints_bucket=split_s3_uri(params["CheckpointConfig"]["S3Uri"])[0],
        artifacts_bucket=split_s3_uri(params["OutputDataConfig"]["S3OutputPath"])[0],
        inter_container_encryption=params["EnableInterContainerTrafficEncryption"],
        network_isolation=params["EnableNetworkIsolation"],
    )


COMPLETED = Poll("Completed", "Completed", metrics={"validation:loss": 2.5, "train:loss": 2.4}, billable_seconds=1800)


class Pipeline:
    """A LocalPlatform plus the few verbs the tests speak in."""

    def __init__(self, local: LocalPlatform, training: ScriptedTraining) -> None:
        self.local = local
        self.training = training

    @property
    def datasets_bucket(self) -> str:
        return self.local.environment("Validate")["DATASETS_BUCKET"]

    def input(self, **overrides: Any) -> dict[str, Any]:
        base = {
            "run_name": "gpt2-small",
            "model": "tiny",
            "dataset": "fsx:///datasets/corpus/",
            "instance_type": "ml.g5.2xlarge",
            "instance_count": 1,
            "max_runtime_hours": 2,
            "hyperparameters": {"max_steps": 100, "lr": 0.0006},
            "quality": {"metric": "validation:loss", "max": 3.0},
            "notify": ["alice@example.org"],
        }
        base.update(overrides)
        return {k: v for k, v in base.items() if v is not None}

    def start(self, execution_input: dict[str, Any], name: str = "run-1", **kwargs: Any) -> str:
        """Start a run; `requester=` another principal than the local platform's ML engineer."""
        return self.local.start(execution_input, name=name, **kwargs)

    def run_until(self, arn: str, state: str, timeout: float = 120) -> dict[str, Any]:
        return self.local.wait(arn, timeout, until=lambda: state in self.local.states_entered(arn))

    def finish(self, arn: str, timeout: float = 120) -> dict[str, Any]:
        return self.local.wait(arn, timeout)

    def pending(self, gate: str, caller: str = APPROVER, timeout: float = 60) -> dict[str, Any]:
        """The open request of a gate, as an approver lists it through the decision URL."""
        deadline = time.monotonic() + timeout
        while True:
            checked = time.monotonic()
            response = self.decide_raw(caller, method="GET")
            assert response["statusCode"] == 200, response
            found = [r for r in json.loads(response["body"])["pending"] if r["gate"] == gate]
            if found:
                (request,) = found
                return request  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, f"no pending {gate} request after {timeout} s: {self.local.explain()}"
            time.sleep(max(REST_SECONDS, 2 * (time.monotonic() - checked)))  # as LocalPlatform.wait rests

    def decide_raw(
        self,
        caller: str,
        *,
        method: str = "POST",
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Call the decision URL as `tp approve` does, signed by a session of `caller`.

        `caller` is a role ARN (the session is named "person") or an assumed-role ARN naming the session.
        """
        if ":assumed-role/" in caller:
            role, session_name = caller.split(":assumed-role/")[1].split("/", 1)
            session = self.local.person(f"arn:aws:iam::123456789012:role/{role}", session_name)
        else:
            session = self.local.person(caller)
        return self.local.call_decision_url(session, method, body, query)  # type: ignore[no-any-return]

    def decide(self, gate: str, decision: str, reason: str = "looks right", caller: str = APPROVER) -> dict[str, Any]:
        request_id = self.pending(gate)["request_id"]
        response = self.decide_raw(caller, body={"request_id": request_id, "decision": decision, "reason": reason})
        assert response["statusCode"] == 200, response
        return json.loads(response["body"])  # type: ignore[no-any-return]

    def jobs(self) -> list[str]:
        return list(self.local.training_requests)

    def model_packages(self) -> list[dict[str, Any]]:
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        group = self.local.environment("Register")["MODEL_PACKAGE_GROUP"]
        summaries = sagemaker.list_model_packages(ModelPackageGroupName=group)["ModelPackageSummaryList"]
        return [sagemaker.describe_model_package(ModelPackageName=s["ModelPackageArn"]) for s in summaries]

    def lineage(self) -> dict[str, Any]:
        """The lineage record of the one run registered so far."""
        s3 = boto3.client("s3", region_name=REGION)
        artifacts = self.local.environment("Register")["ARTIFACTS_BUCKET"]
        (key,) = [
            o["Key"]
            for o in s3.list_objects_v2(Bucket=artifacts, Prefix="runs/")["Contents"]
            if o["Key"].endswith("lineage.json")
        ]
        return json.loads(s3.get_object(Bucket=artifacts, Key=key)["Body"].read())  # type: ignore[no-any-return]

    def error(self, described: dict[str, Any]) -> tuple[str, str]:
        return described.get("error", ""), described.get("cause") or ""


@pytest.fixture(scope="session")
def guarded_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The platform where runs must prove who started them and nobody decides their own run
    (pipeline.forbid_self_approval), with an approver role that has a path: synthesized once for the session."""
    from stacks.app_builder import build_platform

    context = platform_context()
    context["platform"]["approvers"] = [APPROVER, PATH_APPROVER]
    context["platform"]["pipeline"] = {"forbid_self_approval": True}
    outdir = tmp_path_factory.mktemp("guarded")
    build_platform(context, outdir=str(outdir)).synth()
    return outdir


@pytest.fixture(scope="session")
def deployed_definition(platform: Any) -> dict[str, Any]:
    """The pipeline's state machine definition as a LocalPlatform of the session's platform deploys it, resolved once
    for the tests that only read it (a platform start is about 1.3 CPU-s). Read-only: it is shared."""
    assembly = Assembly.load(Path(platform.assembly.directory))
    return json.loads(construct_paths.state_machine(assembly).definition(Resolver(assembly)))  # type: ignore[no-any-return]


HANDOVER_BUDGET = 3
"""The polls an execution of `handing_assembly` makes before it hands its run over."""


@pytest.fixture(scope="session")
def handing_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The platform with `pipeline.polls_per_execution` lowered to HANDOVER_BUDGET (stacks/pipeline/handover.py)."""
    from stacks.app_builder import build_platform

    context = platform_context()
    context["platform"].setdefault("pipeline", {})["polls_per_execution"] = HANDOVER_BUDGET
    outdir = tmp_path_factory.mktemp("handover")
    build_platform(context, outdir=str(outdir)).synth()
    return outdir


@pytest.fixture
def pipeline_factory(platform: Any) -> Iterator[Any]:
    opened: list[LocalPlatform] = []

    def make(scripts: list[list[Poll]] | None = None, clock: Clock | None = None) -> Pipeline:
        training = ScriptedTraining(scripts=scripts or [[Poll(), COMPLETED]])
        local = LocalPlatform(Path(platform.assembly.directory), training=training, clock=clock)
        opened.append(local.__enter__())
        return Pipeline(local, training)

    yield make
    for local in opened:
        local.__exit__(None, None, None)


@pytest.fixture
def open_platform() -> Iterator[Any]:
    """A LocalPlatform of another assembly (an edited copy of the platform's), IAM enforced."""
    opened: list[LocalPlatform] = []

    def open_(assembly: Path, scripts: list[list[Poll]] | None = None) -> Pipeline:
        training = ScriptedTraining(scripts=scripts or [[Poll(), COMPLETED]])
        local = LocalPlatform(assembly, training=training)
        opened.append(local.__enter__())
        return Pipeline(local, training)

    yield open_
    for local in opened:
        local.__exit__(None, None, None)


@pytest.fixture
def pipeline(pipeline_factory: Any) -> Pipeline:
    return pipeline_factory()  # type: ignore[no-any-return]

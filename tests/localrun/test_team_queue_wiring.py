"""The local platform plays the synthesized team queue: its shares from the template, its jobs trained by the
platform's training backend, its submissions judged by the local IAM (a team's budget stop denies that team only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from localrun.aws.cfn import REGION
from localrun.aws.engine import LocalPlatform
from localrun.aws.iam import STATES
from localrun.backends.queue import LEND, LEND_AND_BORROW, Share
from localrun.backends.scripted import ScriptedTraining
from localrun.demo.cli import team_budget_action

M5 = "ml.m5.xlarge"


def _queue_arn(local: LocalPlatform) -> str:
    ((stack, logical, _),) = [
        (stack, logical, queue)
        for stack, logical, queue in local.assembly.resources("AWS::Batch::JobQueue")
        if queue["Properties"].get("JobQueueType") == "SAGEMAKER_TRAINING"
    ]
    return str(local.resolver.get_att(stack, logical, "JobQueueArn"))


def _payload(local: LocalPlatform, name: str) -> str:
    """A CreateTrainingJob request of one ml.m5.xlarge, run as the platform's training role."""
    (role,) = {r["RoleArn"] for r in _training_roles(local)}
    return json.dumps(
        {
            "TrainingJobName": name,
            "RoleArn": role,
            "AlgorithmSpecification": {"TrainingImage": "image:latest", "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": "s3://artifacts/out/"},
            "ResourceConfig": {"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 50},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
            "CheckpointConfig": {"S3Uri": f"s3://checkpoints/runs/{name}/"},
        }
    )


def _training_roles(local: LocalPlatform) -> list[dict[str, str]]:
    return [
        {"RoleArn": str(state["Parameters"]["RoleArn"])}
        for state in local.definition["States"].values()
        if "RoleArn" in state.get("Parameters", {}) and "AlgorithmSpecification" in state["Parameters"]
    ]


def _submit(batch: Any, local: LocalPlatform, team: str, name: str) -> str:
    return str(
        batch.submit_service_job(
            jobName=name,
            jobQueue=_queue_arn(local),
            serviceJobType="SAGEMAKER_TRAINING",
            serviceRequestPayload=_payload(local, name),
            quotaShareName=team,
            schedulingPriority=10,
            tags={"platform-team": team, "execution": f"arn:aws:states:{REGION}:123456789012:execution:x:{name}"},
        )["jobId"]
    )


def test_a_platform_with_teams_plays_their_queue_as_the_template_defines_it(teams_assembly: Path) -> None:
    training = ScriptedTraining()
    with LocalPlatform(teams_assembly, training=training) as local:
        jobs = local.queue
        assert jobs is not None
        assert jobs.queue_arn == _queue_arn(local)
        assert jobs.capacity == {M5: 2}
        assert sorted(jobs.shares, key=lambda s: s.name) == [
            Share("team-a", {M5: 1}, LEND),
            Share("team-b", {M5: 1}, LEND_AND_BORROW, borrow_limit=100),
        ]
        lines: list[str] = []
        jobs.on_line = lines.append
        batch = boto3.client("batch", region_name=REGION)  # the harness, as the account's administrator
        job_id = _submit(batch, local, "team-b", "b1")
        described = batch.describe_service_job(jobId=job_id)
        assert described["status"] == "RUNNING" and described["jobQueue"] == _queue_arn(local)
        # The platform's training backend runs the job's training job, recorded as any CreateTrainingJob.
        (name,) = training.created_names
        assert name.startswith("AWSBatchb1") and name in local.training_requests
        assert lines == [f"b1: scheduled as training job {name}"] == jobs.log


def test_a_teams_budget_stop_denies_the_state_machine_that_teams_submissions_only(teams_assembly: Path) -> None:
    with LocalPlatform(teams_assembly, training=ScriptedTraining()) as local:
        definition = team_budget_action(local, "team-a")
        role = local.state_machine_role_arn.rsplit("/", 1)[1]
        assert role in definition["Roles"]
        boto3.client("iam", region_name=REGION).attach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])
        keys = local.iam.credentials(local.state_machine_role_arn, STATES, local.state_machine_arn)
        batch = boto3.client(
            "batch",
            region_name=REGION,
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
            aws_session_token=keys.token,
        )
        assert _submit(batch, local, "team-b", "b1")
        with pytest.raises(ClientError, match=r"batch:SubmitServiceJob .* explicit deny in .*TeamBudgetteamaStop"):
            _submit(batch, local, "team-a", "a1")
        (denied,) = local.iam.denials()
        assert denied.action == "batch:SubmitServiceJob" and "TeamBudgetteamaStop" in denied.reason


def test_a_platform_without_teams_has_no_queue(platform: Any) -> None:
    assert LocalPlatform(Path(platform.assembly.directory), training=ScriptedTraining()).queue is None

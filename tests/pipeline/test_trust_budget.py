"""A team's spent budget stops its runs starting on every backend, and only its runs; Validate says so in words.

Applied as AWS Budgets applies it (the team's budget action attaches its deny policy to the roles it names), in the
local platform with IAM enforced. The platform is examples/teams.json's: team-a (TeamAScientist) and team-b.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from localrun.aws.cfn import REGION
from localrun.aws.clock import Clock
from localrun.aws.engine import LocalPlatform
from localrun.backends.batch import LocalBatch
from localrun.backends.scripted import Poll, ScriptedTraining
from localrun.demo import scenario
from localrun.demo.cli import team_budget_action
from tests.conftest import TEAMS_SCENARIO
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_queue import TEAM_A, TEAM_APPROVER, TEAM_B, team_input
from tests.pipeline.test_trust_locations import BACKENDS, creates

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 2, "max_runtime_hours": 10}
NOT_CREATED = {"sagemaker": "TrainingJobNotCreated", "batch": "TrainingJobNotCreated", "tuning": "TuningJobNotCreated"}


@pytest.fixture
def teams_with_batch(teams_assembly: Path, tmp_path: Path) -> Iterator[Pipeline]:
    """The teams platform with scripted SageMaker jobs and the local AWS Batch player."""
    batch = LocalBatch(root=tmp_path / "batch", datasets_bucket="")
    training = ScriptedTraining(scripts=[[Poll(), COMPLETED]])
    with LocalPlatform(
        teams_assembly, training=training, players={"batch": batch}, clock=Clock(wait_scale=0.001)
    ) as local:
        for role, tags in scenario.parse(json.loads(TEAMS_SCENARIO.read_text())).principal_tags.items():
            local.person(role, tags=tags)
        yield Pipeline(local, training)


def _spend(local: LocalPlatform, team: str) -> list[str]:
    """What AWS Budgets does when the team's budget is spent: attach its stop to the roles its action names."""
    definition = team_budget_action(local, team)
    iam = boto3.client("iam", region_name=REGION)
    for role in definition["Roles"]:
        iam.attach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])
    return list(definition["Roles"])


def _input(pipeline: Pipeline, team: str, backend: str, **overrides: Any) -> dict[str, Any]:
    given = {**team_input(pipeline, team, f"{team}-{backend}"), **BACKENDS[backend], **overrides}
    return {k: v for k, v in given.items() if v is not None}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_teams_spent_budget_refuses_its_runs_in_words_on_every_backend(
    teams_with_batch: Pipeline, backend: str
) -> None:
    pipeline = teams_with_batch
    roles = _spend(pipeline.local, "team-a")
    assert any(role.startswith("ValidateRole") for role in roles), roles
    with creates() as sent:
        described = pipeline.finish(pipeline.start(_input(pipeline, "team-a", backend), requester=TEAM_A))
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", "InvalidRequest"), cause
    assert "team 'team-a''s monthly budget of $500.00 is spent" in cause, cause
    assert "stopped new training jobs on every backend" in cause and "Ask " in cause, cause
    assert sent == [] and pipeline.jobs() == []
    # The stop names team-a alone: team-b's run is accepted and starts its job.
    with creates() as sent:
        arn = pipeline.start(_input(pipeline, "team-b", "queue"), name="team-b-run", requester=TEAM_B)
        pipeline.local.wait(arn, 60, until=lambda: bool(sent))
    assert [operation for operation, _ in sent] == ["SubmitServiceJob"]


@pytest.mark.parametrize("backend", sorted(NOT_CREATED))
def test_a_teams_run_accepted_before_its_budget_was_spent_starts_no_job(
    teams_with_batch: Pipeline, backend: str
) -> None:
    """IAM holds the stop too, on every backend: a run that waited at its gate while the budget ran out."""
    pipeline = teams_with_batch
    arn = pipeline.start(_input(pipeline, "team-a", backend, **EXPENSIVE), requester=TEAM_A)
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    _spend(pipeline.local, "team-a")
    request_id = pipeline.pending("launch", caller=TEAM_APPROVER)["request_id"]
    body = {"request_id": request_id, "decision": "approve", "reason": "approved before the budget ran out"}
    assert pipeline.decide_raw(TEAM_APPROVER, body=body)["statusCode"] == 200
    described = pipeline.finish(arn, timeout=60)
    error, cause = pipeline.error(described)
    assert (described["status"], error) == ("FAILED", NOT_CREATED[backend]), cause
    assert "explicit deny" in cause and "NoNewJobsOfTheTeam" in cause, cause
    assert pipeline.jobs() == [] and pipeline.local.tuning.jobs == {}

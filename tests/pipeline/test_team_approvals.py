"""A team's approval requests on the local platform: its approvers alone list and decide them, its addresses hear."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localrun.aws.cfn import REGION
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from tests.conftest import APPROVER, SERVICE_ENVIRONMENT, TEAMS, platform_context
from tests.pipeline.conftest import COMPLETED, Pipeline


def _status(response: dict[str, Any]) -> tuple[int, str]:
    return response["statusCode"], json.loads(response["body"]).get("error", "")


VISION_LEAD = TEAMS[0]["approvers"][0]


@pytest.fixture(scope="module")
def with_teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A platform with the variant's teams: vision names its approvers, language none."""
    from stacks.app_builder import build_platform

    context = platform_context()
    context["platform"].update(
        pipeline={"allowed_instance_types": ["ml.g5.2xlarge", "ml.p4d.24xlarge"]},
        teams=TEAMS,
        service_environment=SERVICE_ENVIRONMENT,
    )
    outdir = tmp_path_factory.mktemp("teams")
    build_platform(context, outdir=str(outdir)).synth()
    training = ScriptedTraining(scripts=[[Poll(), COMPLETED]])
    with LocalPlatform(outdir, training=training) as local:
        yield Pipeline(local, training)


def test_a_teams_approval_request_reaches_its_approvers_alone(with_teams: Pipeline) -> None:
    """The deployed functions, their roles and the decision URL's grants: a team's request, as the gate makes it."""
    local = with_teams.local
    local.messages("TopicsRuns")  # drop what came before
    execution = f"arn:aws:states:{REGION}:123456789012:execution:pipeline:cats"
    event = {
        "gate": "promotion",
        "token": "a-token-of-no-execution",
        "execution": execution,
        "run_name": "cats",
        "requested_by": "arn:aws:iam::123456789012:role/VisionScientist",
        "team": "vision",
        "summary": {"evaluation": "passed"},
    }
    request_id = local.invoke("ApprovalRequest", event)["request_id"]
    (message,) = local.messages("TopicsRuns")
    assert message["MessageAttributes"]["team"] == {"Type": "String", "Value": "vision"}
    listed = json.loads(with_teams.decide_raw(VISION_LEAD, method="GET")["body"])["pending"]
    assert [(r["request_id"], r["team"]) for r in listed] == [(request_id, "vision")]
    assert json.loads(with_teams.decide_raw(APPROVER, method="GET")["body"])["pending"] == []
    decision = {"request_id": request_id, "decision": "approve", "reason": "looks right"}
    status, error = _status(with_teams.decide_raw(APPROVER, body=decision))
    assert (status, "the approvers of team 'vision' (settings: teams[].approvers) do" in error) == (403, True)
    # Past every check to the resume itself: this token is no execution's, so the request ends expired.
    status, error = _status(with_teams.decide_raw(VISION_LEAD, body=decision))
    assert (status, error) == (410, f"request {request_id} timed out before the decision: the run was rejected")

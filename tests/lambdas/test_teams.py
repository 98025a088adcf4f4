"""Validate's team checks (lambdas/validate/teams.py): the team exists, its requester is a member (listed or by the
principal tag, read from IAM by the handler), its data is its own, its queued cluster fits its quota share; and the
resolved request carries the team, its priority, its cost tag and its e-mails."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from contract.execution_state import TrainingRequest
from lambdas.shared.errors import InvalidRequest, TransientError
from lambdas.validate import handler as validate
from lambdas.validate import membership, start_proof
from lambdas.validate.limits import PlatformLimits
from lambdas.validate.request import resolve
from lambdas.validate.resume import PreviousRun
from lambdas.validate.teams import QuotaShare, Team
from stacks.settings import build_settings
from tests.conftest import SERVICE_ENVIRONMENT, TEAMS, cdk_context
from tools.tp import offline_check

ACCOUNT = "123456789012"
REGION = "us-east-1"
P4D = "ml.p4d.24xlarge"
BUCKET = "tp-dev-datasets-123456789012-us-east-1"
VISION_SCIENTIST = f"arn:aws:sts::{ACCOUNT}:assumed-role/VisionScientist/alice"
LINGUIST = f"arn:aws:sts::{ACCOUNT}:assumed-role/Linguist/bob"
MACHINE = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:TrainingPipeline"
EXECUTION = f"arn:aws:states:{REGION}:{ACCOUNT}:execution:TrainingPipeline:run-1"
STARTED = "2026-11-23T21:00:00.000Z"


def _settings(**changes: Any) -> Any:
    """cdk.json's settings with the variant's two teams (tests/conftest.py TEAMS): vision (listed member,
    LEND_AND_BORROW 4 x p4d with 100 % borrowing) and language (member_tag "language", RESERVE 2 x p4d); 8 x p4d
    in the service environment."""
    base = cdk_context()["platform"]
    base["pipeline"] = {"allowed_instance_types": [P4D, "ml.p5.48xlarge"]}
    base["notifications"] = {"run_emails": ["alice@example.org"]}
    return build_settings(
        {**base, "teams": copy.deepcopy(TEAMS), "service_environment": SERVICE_ENVIRONMENT, **changes}
    )


def _limits(settings: Any) -> PlatformLimits:
    return settings.platform_limits(  # type: ignore[no-any-return]
        datasets_bucket=BUCKET,
        artifacts_bucket="tp-dev-artifacts-123456789012-us-east-1",
        fsx_file_system_id="fs-0123456789abcdef0",
        fsx_mount_name="abcdef12",
        tags={"platform": "distributed-training"},
        backends=("sagemaker", "batch", "queue"),
    )


LIMITS = _limits(_settings())
NO_TEAMS = dataclasses.replace(LIMITS, teams=(), service_capacity={})


def _input(**changes: Any) -> dict[str, Any]:
    run = {
        "run_name": "vision-run",
        "dataset": f"s3://{BUCKET}/vision/frames/",
        "instance_type": P4D,
        "instance_count": 2,
        "max_runtime_hours": 2,
        "team": "vision",
    }
    return {k: v for k, v in {**run, **changes}.items() if v is not None}


def _problems(event: dict[str, Any], limits: PlatformLimits = LIMITS, **kwargs: Any) -> str:
    with pytest.raises(InvalidRequest) as err:
        resolve(event, execution_name="exec-1", limits=limits, **kwargs)
    return str(err.value)


# -- the teams reach Validate -------------------------------------------------------------------------------
def test_the_teams_go_through_validates_environment_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    variables = LIMITS.environment()
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    read = PlatformLimits.from_environment()
    assert read == LIMITS
    assert [t.name for t in read.teams] == ["vision", "language"]
    assert read.teams[1].member_tag == "language" and read.service_capacity == {P4D: 8}
    assert json.loads(variables["TEAMS"])[0]["quota_share"]["sharing"] == "LEND_AND_BORROW"


# -- the team -----------------------------------------------------------------------------------------------
def test_a_members_run_carries_its_team_priority_cost_tag_and_e_mails() -> None:
    request = resolve(
        _input(backend="queue", priority=7, notify=["vision@example.org", "alice@example.org"]),
        execution_name="exec-1",
        limits=LIMITS,
        requested_by=VISION_SCIENTIST,
    )
    assert (request["team"], request["priority"]) == ("vision", 7)
    assert {"Key": "platform-team", "Value": "vision"} in request["tags"]
    # The team's own address is not refused for being outside notifications.run_emails, and is listed once.
    assert request["recipients"] == ["vision@example.org", "alice@example.org"]
    quiet = resolve(_input(), execution_name="exec-1", limits=LIMITS, requested_by=VISION_SCIENTIST)
    assert quiet["recipients"] == ["vision@example.org"] and quiet["priority"] == 0


def test_a_queued_run_may_wait_for_capacity_as_long_as_the_platform_allows_or_less() -> None:
    def resolved(**changes: Any) -> dict[str, Any]:
        return resolve(
            _input(backend="queue", **changes), execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST
        )

    assert resolved()["max_queue_wait_seconds"] == LIMITS.max_queue_wait_minutes * 60
    assert resolved(max_queue_wait_minutes=90)["max_queue_wait_seconds"] == 90 * 60
    longer = _problems(
        _input(backend="queue", max_queue_wait_minutes=LIMITS.max_queue_wait_minutes + 1),
        requested_by=VISION_SCIENTIST,
    )
    assert (
        f"max_queue_wait_minutes {LIMITS.max_queue_wait_minutes + 1} exceeds the platform's "
        f"{LIMITS.max_queue_wait_minutes} (service_environment.max_queue_wait_minutes)"
    ) in longer
    not_queued = _problems(_input(max_queue_wait_minutes=30), requested_by=VISION_SCIENTIST)
    assert 'max_queue_wait_minutes applies to backend "queue" only' in not_queued
    unqueued = resolve(_input(), execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST)
    assert unqueued["max_queue_wait_seconds"] is None


def test_a_run_without_a_team_has_no_team_tag() -> None:
    request = resolve(_input(team=None, dataset=f"s3://{BUCKET}/corpus/"), execution_name="e", limits=LIMITS)
    assert request["team"] is None
    assert all(tag["Key"] != "platform-team" for tag in request["tags"])
    assert request["recipients"] == ["(none)"]


def test_an_unknown_team_is_refused_with_the_teams_there_are() -> None:
    assert "team 'visoin' is not a team of this platform; use one of vision, language" in _problems(
        _input(team="visoin"), requested_by=VISION_SCIENTIST
    )
    assert "this platform has no teams (settings `teams`); remove `team`" in _problems(
        _input(dataset=f"s3://{BUCKET}/corpus/"), NO_TEAMS, requested_by=VISION_SCIENTIST
    )


def test_a_teams_run_needs_a_proven_requester() -> None:
    assert "start it with `tp start`" in _problems(_input())


def test_a_requester_is_a_member_when_listed_or_tagged() -> None:
    message = _problems(_input(), requested_by=LINGUIST)
    assert f"arn:aws:iam::{ACCOUNT}:role/Linguist is not a member of team 'vision'" in message
    # A role of the team's tag is a member; one of another tag value is not.
    language = _input(team="language", dataset=f"s3://{BUCKET}/language/web/")
    assert resolve(language, execution_name="e", limits=LIMITS, requested_by=LINGUIST, requester_tag="language")
    message = _problems(language, requested_by=LINGUIST, requester_tag="vision")
    assert "not a member of team 'language'" in message and "platform-team=language" in message


# -- data ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "uri",
    [
        f"s3://{BUCKET}/vision/frames/",
        f"s3://{BUCKET}/vision",
        "fsx:///datasets/vision/frames/",
        "fsx:///datasets/vision",
    ],
)
def test_a_teams_data_is_refused_to_runs_of_no_team_in_either_form(uri: str) -> None:
    message = _problems(_input(team=None, dataset=uri))
    assert f"dataset {uri!r} reads team 'vision''s data" in message
    assert "only a run of that team may use it" in message


def test_a_teams_run_reads_only_its_own_data() -> None:
    message = _problems(
        _input(dataset=f"s3://{BUCKET}/corpus/", validation_dataset="fsx:///datasets/language/held-out/"),
        requested_by=VISION_SCIENTIST,
    )
    assert "dataset 's3://tp-dev-datasets-123456789012-us-east-1/corpus/' is not team 'vision''s data" in message
    assert "validation_dataset 'fsx:///datasets/language/held-out/' reads team 'language''s data" in message
    fsx = _input(dataset="fsx:///datasets/vision/frames/")
    assert resolve(fsx, execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST)["team"] == "vision"


def test_a_dataset_holding_a_teams_prefix_reads_its_data() -> None:
    team = Team(name="t", members=(), dataset_prefixes=("data/vision/",), quota_share=QuotaShare(capacity={P4D: 1}))
    assert team.owns("data/") and team.owns("data/vision/x/") and not team.owns("data/visionary/")


@pytest.mark.parametrize(
    "uri",
    [
        "fsx:///datasets/./vision/",
        "fsx:///datasets//vision/",
        "fsx:///datasets/./",
        "fsx:///datasets//",
        "fsx:///datasets/",
        "fsx:///datasets/vision/..",
        f"s3://{BUCKET}//",
        f"s3://{BUCKET}/./",
        f"s3://{BUCKET}/vision/%2e%2e/",
        f"s3://{BUCKET}/vision/ ",
    ],
)
def test_a_location_not_written_as_it_normalises_is_refused_before_the_team_check(uri: str) -> None:
    """Not as team data (it reads some other folder, or the root): as a location written otherwise than it reads."""
    message = _problems(_input(dataset=uri), requested_by=VISION_SCIENTIST)
    assert f"dataset {uri!r}" in message and "written as it is read" in message, message
    assert "team 'vision''s data" not in message, message


def test_a_model_folder_is_a_location_as_a_dataset_is() -> None:
    """init_from (the model a run fine-tunes) is read as a dataset is: in its normal form, and only under the team's
    own prefixes."""
    others = _problems(_input(init_from=f"s3://{BUCKET}/language/models/base/"), requested_by=VISION_SCIENTIST)
    assert f"init_from 's3://{BUCKET}/language/models/base/' reads team 'language''s data" in others, others
    rooted = _problems(_input(init_from="fsx:///datasets/./"), requested_by=VISION_SCIENTIST)
    assert "init_from 'fsx:///datasets/./'" in rooted and "written as it is read" in rooted, rooted
    own = _input(init_from=f"s3://{BUCKET}/vision/models/base/", hyperparameters={"data.seq_len": 512})
    resolved = resolve(own, execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST)
    assert resolved["base_model"]["s3_uri"] == f"s3://{BUCKET}/vision/models/base/"


# -- the quota share ----------------------------------------------------------------------------------------
def test_a_queued_run_fits_what_its_teams_share_can_ever_hold() -> None:
    # vision: 4 of its own, borrowing 100 % -> 8, and the service environment has 8.
    assert resolve(
        _input(backend="queue", instance_count=8), execution_name="e", limits=LIMITS, requested_by=VISION_SCIENTIST
    )
    message = _problems(_input(backend="queue", instance_count=9), requested_by=VISION_SCIENTIST)
    assert "9 x ml.p4d.24xlarge can never start in team 'vision''s quota share: it holds at most 8" in message
    # language: RESERVE 2.
    language = _input(team="language", dataset=f"s3://{BUCKET}/language/", backend="queue", instance_count=3)
    message = _problems(language, requested_by=LINGUIST, requester_tag="language")
    assert "holds at most 2 (2 of its own; the service environment has 8); ask for at most 2" in message
    message = _problems(_input(backend="queue", instance_type="ml.p5.48xlarge"), requested_by=VISION_SCIENTIST)
    assert "instance_type: team 'vision''s quota share holds ml.p4d.24xlarge, not ml.p5.48xlarge" in message


def test_the_most_a_share_can_hold_counts_its_borrowing_within_the_service_environment() -> None:
    environment = {P4D: 10}
    assert QuotaShare(capacity={P4D: 3}, sharing="RESERVE").most(P4D, environment) == 3
    assert QuotaShare(capacity={P4D: 3}, sharing="LEND").most(P4D, environment) == 3
    assert QuotaShare(capacity={P4D: 3}, sharing="LEND_AND_BORROW", borrow_limit_percent=50).most(P4D, environment) == 4
    assert QuotaShare(capacity={P4D: 3}, sharing="LEND_AND_BORROW").most(P4D, environment) == 10
    assert (
        QuotaShare(capacity={P4D: 8}, sharing="LEND_AND_BORROW", borrow_limit_percent=100).most(P4D, environment) == 10
    )


def test_a_priority_off_the_queue_is_refused() -> None:
    message = _problems(_input(priority=5), requested_by=VISION_SCIENTIST)
    assert 'priority: only backend "queue" orders runs by priority' in message


# -- continuing a run ---------------------------------------------------------------------------------------
def test_a_run_cannot_continue_another_teams_run() -> None:
    earlier = resolve(
        _input(team="language", dataset=f"s3://{BUCKET}/language/"),
        execution_name="exec-0",
        limits=LIMITS,
        requested_by=LINGUIST,
        requester_tag="language",
    )
    previous = PreviousRun(execution=EXECUTION, request=TrainingRequest.parse(earlier))
    message = _problems(
        _input(team=None, dataset=f"s3://{BUCKET}/corpus/", resume_from=EXECUTION),
        requested_by=LINGUIST,
        continues=previous,
    )
    assert "resume_from: the run is team 'language''s; only a run of that team can resume it (set team" in message


# -- every problem at once ----------------------------------------------------------------------------------
def test_every_team_problem_is_listed_at_once() -> None:
    message = _problems(
        _input(backend="queue", instance_count=9, priority=3, dataset=f"s3://{BUCKET}/language/", notify=["x@y.org"]),
        requested_by=LINGUIST,
    )
    for expected in (
        "not a member of team 'vision'",
        "reads team 'language''s data",
        "can never start in team 'vision''s quota share",
        "notify: ['x@y.org'] are not subscribed",
    ):
        assert expected in message, f"{expected!r} missing from:\n{message}"


# -- offline ------------------------------------------------------------------------------------------------
def test_the_offline_check_judges_a_teams_run_but_not_who_starts_it() -> None:
    settings = _settings()
    request, _cost = offline_check(_input(backend="sagemaker"), settings, datasets_bucket=BUCKET)
    assert request["team"] == "vision"
    with pytest.raises(InvalidRequest, match="reads team 'language''s data"):
        offline_check(_input(dataset=f"s3://{BUCKET}/language/"), settings, datasets_bucket=BUCKET)


# -- the handler: membership by the principal's tag, IAM's verdict through S3 -----------------------------------------
class _Context:
    function_name = "Validate"
    memory_limit_in_mb = 256
    invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:Validate"
    aws_request_id = "req-1"


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto with the start-proof table and Validate's environment of the two teams."""
    with mock_aws():
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        for name, value in {
            **LIMITS.environment(),
            "FORBID_SELF_APPROVAL": "true",
            "BUDGET_PROBE_JOB": "budget-probe",
            "MONTHLY_BUDGET_USD": "1000",
            "BUDGET_CONTACT": "finance@example.org",
            "START_PROOFS_TABLE": "StartProofs",
        }.items():
            monkeypatch.setenv(name, value)
        boto3.resource("dynamodb").create_table(
            TableName="StartProofs",
            KeySchema=[{"AttributeName": "proof", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "proof", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield boto3.client("iam")


def _started_by(role: str, tags: list[dict[str, str]], execution_input: dict[str, Any], iam: Any) -> dict[str, Any]:
    """The Validate event of a run started (`tp start`'s proof) by a session of a new role with these tags."""
    trust = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": ACCOUNT}, "Action": "sts:AssumeRole"}]}
    arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust), Tags=tags)["Role"]["Arn"]
    creds = boto3.client("sts").assume_role(RoleArn=arn, RoleSessionName="session")["Credentials"]
    session = boto3.Session(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"], REGION)
    proven = start_proof.attach(
        execution_input,
        state_machine=MACHINE,
        execution_name="run-1",
        credentials=session.get_credentials().get_frozen_credentials(),
        artifacts_bucket=LIMITS.artifacts_bucket,
    )
    return {"input": proven, "execution_name": "run-1", "execution": EXECUTION, "started": STARTED}


LANGUAGE_RUN = {"team": "language", "dataset": f"s3://{BUCKET}/language/web/"}


def test_a_failure_to_ask_s3_for_the_tags_verdict_is_a_fault_not_a_refusal(
    deployed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Membership by tag itself is proven with IAM enforced in tests/pipeline/test_team_membership.py.
    event = _started_by("Linguist", [{"Key": "platform-team", "Value": "language"}], _input(**LANGUAGE_RUN), deployed)

    def throttled(*_: Any) -> Any:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "Reduce your request rate."}}, "ListObjectsV2")

    monkeypatch.setattr(membership, "_list", throttled)
    with pytest.raises(TransientError, match="SlowDown"):  # retried by the state machine; never a refusal
        validate.handler(event, _Context())

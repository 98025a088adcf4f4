"""Membership of a team by principal tag (settings teams[].member_tag), judged by IAM through the bucket policy.

Validate runs in the local platform with its own role, IAM enforced; the starter's membership proof is replayed to
S3, where the artifacts bucket's policy (from the template) is evaluated against the starter's role tags. The
teams platform is examples/teams.json's: team-a lists TeamAScientist, team-b admits the tag platform-team=team-b.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from lambdas.validate import membership, start_proof
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import ScriptedTraining
from tests.pipeline.test_queue import TEAM_A, TEAM_B, team_input

OTHER = f"arn:aws:iam::{ACCOUNT}:role/TeamCScientist"


@pytest.fixture(scope="module")
def local(teams_assembly: Path) -> Any:
    with LocalPlatform(teams_assembly, training=ScriptedTraining(scripts=[])) as platform:
        platform.person(TEAM_A)
        platform.person(TEAM_B, tags={"platform-team": "team-b"})
        platform.person(OTHER, tags={"platform-team": "team-a"})
        yield platform


def credentials(local: LocalPlatform, principal: str) -> Any:
    return local.person(principal, "starter").get_credentials().get_frozen_credentials()


def validate(local: LocalPlatform, execution_input: dict[str, Any], name: str) -> dict[str, Any]:
    """Validate's answer for an execution `name` of the platform's state machine with this input."""
    execution = local.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    event = {"input": execution_input, "execution_name": name, "execution": execution, "started": "2026-11-26T00:00Z"}
    return local.invoke("Validate", event)["validation"]  # type: ignore[no-any-return]


def proven(local: LocalPlatform, principal: str, execution_input: dict[str, Any], name: str) -> dict[str, Any]:
    """The input as `tp start` sends it for `principal`: both proofs, bound to execution `name`."""
    return start_proof.attach(
        execution_input,
        state_machine=local.state_machine_arn,
        execution_name=name,
        credentials=credentials(local, principal),
        artifacts_bucket=local.environment("Validate")["ARTIFACTS_BUCKET"],
    )


def b_input(local: LocalPlatform) -> dict[str, Any]:
    bucket = local.environment("Validate")["DATASETS_BUCKET"]
    return team_input(_Buckets(bucket), "team-b", f"b-{uuid.uuid4().hex[:6]}")


class _Buckets:
    def __init__(self, datasets: str) -> None:
        self.datasets_bucket = datasets


def test_a_principal_tagged_with_the_teams_member_tag_is_a_member(local: LocalPlatform) -> None:
    name = uuid.uuid4().hex
    answer = validate(local, proven(local, TEAM_B, b_input(local), name), name)
    assert answer["valid"], answer["message"]
    assert answer["request"]["team"] == "team-b"
    # IAM judged it: the tagged session listed the team's membership prefix, allowed by the bucket policy.
    (judgement,) = [
        j
        for j in local.iam.judgements
        if j.action == "s3:ListBucket"
        and j.principal.startswith(f"arn:aws:sts::{ACCOUNT}:assumed-role/TeamBScientist/")
    ]
    assert judgement.allowed and "MembershipByTag" in judgement.reason, judgement


@pytest.mark.parametrize(
    ("principal", "why"),
    [
        (TEAM_A, "no tag"),
        (OTHER, "another team's tag"),
    ],
)
def test_a_principal_without_the_teams_tag_is_refused_whatever_its_own_policies_allow(
    local: LocalPlatform, principal: str, why: str
) -> None:
    # Even a principal whose own policy allows listing the whole bucket: the bucket policy's deny decides.
    boto3.client("iam", region_name=REGION).put_role_policy(
        RoleName=principal.rsplit("/", 1)[-1],
        PolicyName="ListEverything",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    name = uuid.uuid4().hex
    answer = validate(local, proven(local, principal, b_input(local), name), name)
    assert not answer["valid"], why
    assert "is not a member of team 'team-b'" in answer["message"], answer["message"]
    assert "platform-team=team-b" in answer["message"] and "membership proof" not in answer["message"]
    # The proof held; IAM refused the listing, by the bucket policy's deny of every other tag.
    role = principal.rsplit("/", 1)[-1]
    denied = [
        j
        for j in local.iam.denials()
        if j.action == "s3:ListBucket" and j.principal.startswith(f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/")
    ]
    assert denied and all("explicit deny" in j.reason and "TeamBMembershipOnlyByTag" in j.reason for j in denied)


def test_a_membership_proof_signed_by_another_principal_is_refused(local: LocalPlatform) -> None:
    name = uuid.uuid4().hex
    execution_input = b_input(local)
    members = proven(local, TEAM_B, execution_input, name)
    outsider = proven(local, TEAM_A, execution_input, name)
    forged = {**outsider, membership.FIELD: members[membership.FIELD]}
    answer = validate(local, forged, name)
    assert not answer["valid"]
    assert "signed with different credentials" in answer["message"], answer["message"]


def test_a_membership_proof_made_for_another_run_or_team_is_refused(local: LocalPlatform) -> None:
    execution_input = b_input(local)
    bucket = local.environment("Validate")["ARTIFACTS_BUCKET"]
    session = credentials(local, TEAM_B)  # one session signs every proof below

    def signed(name: str, *, membership_for: str, team: str = "team-b") -> dict[str, Any]:
        start = start_proof.attach(
            execution_input, state_machine=local.state_machine_arn, execution_name=name, credentials=session
        )
        bound_to = start_proof.binding(
            execution_input, state_machine=local.state_machine_arn, execution_name=membership_for
        )
        proof = membership.sign(session, bucket=bucket, team=team, region=REGION, bound_to=bound_to)
        return {**start, membership.FIELD: proof}

    name = uuid.uuid4().hex
    assert validate(local, signed(name, membership_for=name), name)["valid"]  # the control: all proofs fit
    # Made for another execution of the same input.
    name = uuid.uuid4().hex
    answer = validate(local, signed(name, membership_for="another-run"), name)
    assert not answer["valid"]
    assert "membership proof was made for another request" in answer["message"], answer["message"]
    # Made for this run, but listing another team's prefix: S3 refuses the signature.
    name = uuid.uuid4().hex
    answer = validate(local, signed(name, membership_for=name, team="team-a"), name)
    assert not answer["valid"]
    assert "S3 refused the membership proof (SignatureDoesNotMatch)" in answer["message"], answer["message"]


def test_a_run_of_a_tag_team_without_a_membership_proof_is_refused(local: LocalPlatform) -> None:
    name = uuid.uuid4().hex
    execution_input = {k: v for k, v in proven(local, TEAM_B, b_input(local), name).items() if k != membership.FIELD}
    answer = validate(local, execution_input, name)
    assert not answer["valid"]
    assert "membership_proof" in answer["message"] and "tp start" in answer["message"], answer["message"]


def test_tp_start_signs_the_membership_proof_of_a_teams_run(
    local: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tools.test_tp import _answer, _env, tp

    boto3.client("iam", region_name=REGION).put_role_policy(
        RoleName=TEAM_B.rsplit("/", 1)[-1],
        PolicyName="StartRuns",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "states:StartExecution", "Resource": local.state_machine_arn}
                ],
            }
        ),
    )
    monkeypatch.setenv("TP_STATE_MACHINE", local.state_machine_arn)
    monkeypatch.setenv("TP_ARTIFACTS_BUCKET", local.environment("Validate")["ARTIFACTS_BUCKET"])
    run_input = tmp_path / "input.json"
    run_input.write_text(json.dumps(b_input(local)))
    result = tp("start", str(run_input), "--json", env=_env(local.person(TEAM_B, "engineer")))
    assert result.exit_code == 0, result.output
    arn = _answer(result.stdout)["execution_arn"]
    try:
        answer = local.wait(arn, until=lambda: any(c.event.get("execution") == arn for c in _validations(local)))
        (validation,) = [c.result for c in _validations(local) if c.event.get("execution") == arn]
        assert validation["validation"]["valid"], validation["validation"]["message"]
    finally:
        local.sfn.stop_execution(executionArn=arn)
    assert answer["executionArn"] == arn


def _validations(local: LocalPlatform) -> list[Any]:
    return [c for c in local.lambda_calls if c.handler.startswith("lambdas.validate.") and c.result]

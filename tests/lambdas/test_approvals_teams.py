"""Teams' approvals: a team's approvers alone decide its runs and list only them; its addresses hear of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambdas.approvals import handler, identity
from lambdas.approvals.environment import ApprovalsEnvironment
from lambdas.approvals.store import PENDING_INDEX, ApprovalStore
from stacks.constructs.notifications import run_filter_policies
from stacks.settings import NotificationSettings

PLATFORM = "arn:aws:iam::123456789012:role/MLLead"
VISION_LEAD = "arn:aws:iam::123456789012:role/VisionLead"
SCIENTIST = "arn:aws:iam::123456789012:role/DataScientist"
EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:"
# vision names approvers; language names none (the platform's approvers decide its runs).
TEAM_APPROVERS = {"vision": [VISION_LEAD]}


class _Context:
    function_name = "Approval"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:Approval"
    aws_request_id = "req-1"


class _Sfn:
    """Step Functions as the decision function uses it: the tokens it resumed."""

    def __init__(self) -> None:
        self.resumed: list[str] = []

    def send_task_success(self, *, taskToken: str, output: str) -> None:  # noqa: N803 - boto3's names
        self.resumed.append(taskToken)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Sfn]:
    """The approvals table (with its pending index), token key and runs topic in moto; proofs taken at their word."""
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(
            TableName="approvals",
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": name, "AttributeType": "S"} for name in ("request_id", "status", "requested_at")
            ],
            KeySchema=[{"AttributeName": "request_id", "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": PENDING_INDEX,
                    "KeySchema": [
                        {"AttributeName": "status", "KeyType": "HASH"},
                        {"AttributeName": "requested_at", "KeyType": "RANGE"},
                    ],
                    "Projection": {
                        "ProjectionType": "INCLUDE",
                        "NonKeyAttributes": ["gate", "execution", "run_name", "summary", "expires_at", "requested_by"],
                    },
                }
            ],
        )
        key = boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["Arn"]
        topic = boto3.client("sns", region_name="us-east-1").create_topic(Name="runs")["TopicArn"]
        for name, value in {
            "TABLE_NAME": "approvals",
            "TOKEN_KEY_ARN": key,
            "TOPIC_ARN": topic,
            "DECISION_URL": "https://decide.lambda-url.us-east-1.on.aws/",
            "APPROVAL_TIMEOUT_HOURS": "24",
            "APPROVERS": json.dumps([PLATFORM]),
            "TEAM_APPROVERS": json.dumps(TEAM_APPROVERS),
            "FORBID_SELF_APPROVAL": "true",
        }.items():
            monkeypatch.setenv(name, value)
        # The identity proof's own tests are test_identity.py and tests/pipeline; here a proof names its signer.
        monkeypatch.setattr(identity, "verify", lambda proof, **_: proof)
        sfn = _Sfn()
        real_store = handler._store

        def store(environment: ApprovalsEnvironment) -> ApprovalStore:
            made = real_store(environment)
            made.sfn = sfn
            return made

        monkeypatch.setattr(handler, "_store", store)
        yield sfn


def _request(run: str, team: str | None, requested_by: str = SCIENTIST) -> str:
    event = {
        "gate": "promotion",
        "token": f"token-of-{run}",
        "execution": EXECUTION + run,
        "run_name": run,
        "requested_by": requested_by,
        "team": team,
        "summary": {"evaluation": "passed"},
    }
    return str(handler.request(event, _Context())["request_id"])


def _decide(caller: str, request_id: str) -> tuple[int, dict[str, Any]]:
    event = {
        "requestContext": {"http": {"method": "POST"}},
        "headers": {identity.PROOF_HEADER: caller},
        "body": json.dumps({"request_id": request_id, "decision": "approve", "reason": "looks right"}),
    }
    response = handler.decide(event, _Context())
    return response["statusCode"], json.loads(response["body"])


def _list(caller: str, limit: int = 50, cursor: str | None = None) -> tuple[int, dict[str, Any]]:
    query = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
    event = {
        "requestContext": {"http": {"method": "GET"}},
        "headers": {identity.PROOF_HEADER: caller},
        "queryStringParameters": query,
    }
    response = handler.decide(event, _Context())
    return response["statusCode"], json.loads(response["body"])


def test_the_request_records_the_runs_team(aws: _Sfn) -> None:
    table = boto3.resource("dynamodb", region_name="us-east-1").Table("approvals")
    vision, plain = _request("cats", "vision"), _request("plain", None)
    assert table.get_item(Key={"request_id": vision})["Item"]["team"] == "vision"
    assert "team" not in table.get_item(Key={"request_id": plain})["Item"]


def test_a_teams_approvers_alone_decide_its_runs_and_the_platforms_the_rest(aws: _Sfn) -> None:
    vision, language, plain = _request("cats", "vision"), _request("poems", "language"), _request("plain", None)
    status, answer = _decide(PLATFORM, vision)
    assert (status, answer["error"]) == (
        403,
        f"{PLATFORM} may not decide request {vision} (a run of team 'vision'): the approvers of team 'vision' "
        "(settings: teams[].approvers) do",
    )
    for request_id, of in ((plain, "a run without a team"), (language, "a run of team 'language'")):
        status, answer = _decide(VISION_LEAD, request_id)
        assert (status, answer["error"]) == (
            403,
            f"{VISION_LEAD} may not decide request {request_id} ({of}): the platform's approvers (settings: "
            "approvers) do",
        )
    assert aws.resumed == []
    status, answer = _decide(VISION_LEAD, vision)
    assert (status, answer["by"]) == (200, VISION_LEAD)
    assert _decide(PLATFORM, language)[0] == 200
    assert _decide(PLATFORM, plain)[0] == 200
    assert aws.resumed == ["token-of-cats", "token-of-poems", "token-of-plain"]


def test_self_approval_is_refused_to_a_team_approver_too(aws: _Sfn) -> None:
    own = _request("own", "vision", requested_by=VISION_LEAD)
    status, answer = _decide(VISION_LEAD, own)
    assert (status, "started this run and may not decide its gates" in answer["error"]) == (403, True)


def test_each_approver_lists_only_what_they_may_decide_in_full_pages(aws: _Sfn) -> None:
    for run, team in [
        ("plain", None),
        ("cats", "vision"),
        ("dogs", "vision"),
        ("poems", "language"),
        ("owls", "vision"),
    ]:
        _request(run, team)
    status, page = _list(VISION_LEAD)
    assert status == 200 and page["next"] is None
    assert [(r["run_name"], r["team"]) for r in page["pending"]] == [
        ("owls", "vision"),
        ("dogs", "vision"),
        ("cats", "vision"),
    ]
    # One request a page: the vision requests between the platform's are skipped, never shown as empty pages.
    seen: list[tuple[str, str | None]] = []
    cursor: str | None = None
    for _ in range(4):
        status, page = _list(PLATFORM, limit=1, cursor=cursor)
        assert status == 200 and len(page["pending"]) <= 1
        seen += [(r["run_name"], r["team"]) for r in page["pending"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [("poems", "language"), ("plain", None)]
    status, answer = _list(SCIENTIST)
    assert (status, answer["error"]) == (
        403,
        f"{SCIENTIST} is not an approver of this platform (settings: approvers, teams[].approvers)",
    )


def test_a_teams_addresses_receive_its_approval_requests_and_the_runs_naming_them(aws: _Sfn) -> None:
    """The approval message's `team` attribute, through the subscriptions' filter policies as SNS applies them."""
    settings = NotificationSettings(approval_emails=["lead@example.org"], run_emails=["vision@example.org"])
    policies = run_filter_policies(settings, {"vision": ["vision@example.org"], "language": ["poets@example.org"]})
    sns, sqs = boto3.client("sns", region_name="us-east-1"), boto3.client("sqs", region_name="us-east-1")
    topic = sns.list_topics()["Topics"][0]["TopicArn"]
    queues = {}
    for email, policy in policies.items():
        url = sqs.create_queue(QueueName=email.split("@")[0])["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"FilterPolicy": json.dumps(policy)})
        queues[email] = url
    _request("cats", "vision"), _request("poems", "language"), _request("plain", None)
    for recipient in ("vision@example.org", "poets@example.org"):  # a run outcome, as the state machine sends it
        sns.publish(
            TopicArn=topic,
            Subject=f"Training run succeeded for {recipient}",
            Message="done",
            MessageAttributes={
                "kind": {"DataType": "String", "StringValue": "run"},
                "recipients": {"DataType": "String.Array", "StringValue": json.dumps([recipient])},
            },
        )

    def received(email: str) -> dict[str, dict[str, Any]]:
        messages = sqs.receive_message(QueueUrl=queues[email], MaxNumberOfMessages=10)["Messages"]
        return {body["Subject"]: body["MessageAttributes"] for body in (json.loads(m["Body"]) for m in messages)}

    def subjects(email: str) -> list[str]:
        return sorted(received(email))

    lead = received("lead@example.org")
    assert sorted(lead) == [
        "Approval needed: promotion of cats",
        "Approval needed: promotion of plain",
        "Approval needed: promotion of poems",
    ]
    assert lead["Approval needed: promotion of cats"]["team"] == {"Type": "String", "Value": "vision"}
    assert "team" not in lead["Approval needed: promotion of plain"]  # never an empty attribute
    assert subjects("vision@example.org") == [
        "Approval needed: promotion of cats",
        "Training run succeeded for vision@example.org",
    ]
    assert subjects("poets@example.org") == [
        "Approval needed: promotion of poems",
        "Training run succeeded for poets@example.org",
    ]


def test_one_subscription_per_address_whatever_roles_it_has() -> None:
    settings = NotificationSettings(
        approval_emails=["lead@example.org"], run_emails=["lead@example.org", "alice@example.org"]
    )
    policies = run_filter_policies(
        settings, {"vision": ["lead@example.org", "v@example.org"], "nlp": ["v@example.org"]}
    )
    assert policies == {
        "lead@example.org": {"$or": [{"kind": ["approval"]}, {"kind": ["run"], "recipients": ["lead@example.org"]}]},
        "alice@example.org": {"kind": ["run"], "recipients": ["alice@example.org"]},
        "v@example.org": {
            "$or": [
                {"kind": ["approval"], "team": ["nlp", "vision"]},
                {"kind": ["run"], "recipients": ["v@example.org"]},
            ]
        },
    }

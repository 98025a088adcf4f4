"""A gate's task token is usable only by the decision function, and only a recorded decision resumes a run."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError
from policy_sentry.querying.actions import get_action_data

from lambdas.shared.metrics import NAMESPACE, Metric
from localrun.aws.cfn import ACCOUNT, REGION
from tests.conftest import APPROVER
from tests.pipeline.conftest import Pipeline

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 4, "max_runtime_hours": 10}
# PowerUserAccess: everything but IAM, Organizations and Account management.
POWER_USER = f"arn:aws:iam::{ACCOUNT}:role/PowerUser"
POWER_USER_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "NotAction": ["iam:*", "organizations:*", "account:*"], "Resource": "*"}],
}


def _power_user(pipeline: Pipeline) -> boto3.Session:
    session = pipeline.local.person(POWER_USER, "insider")
    boto3.client("iam", region_name=REGION).put_role_policy(
        RoleName="PowerUser", PolicyName="PowerUserAccess", PolicyDocument=json.dumps(POWER_USER_POLICY)
    )
    return session


def _token(pipeline: Pipeline, arn: str, gate: str) -> str:
    """The gate's real task token, as only the engine (or an attacker who obtained it) holds it."""
    for event in pipeline.local.history(arn):
        details = event.get("taskScheduledEventDetails")
        if details:
            payload = json.loads(details["parameters"]).get("Payload", {})
            if payload.get("gate") == gate:
                return str(payload["token"])
    raise AssertionError(f"no {gate} gate was scheduled")


def _failed_denied(call: Any) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return str(raised.value.response["Error"]["Code"])


def test_a_power_user_reading_the_approvals_table_finds_no_token_it_can_use(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input(**EXPENSIVE))
    pipeline.run_until(arn, "Approval gate (pre-launch)")
    request_id = pipeline.pending("launch")["request_id"]
    token = _token(pipeline, arn, "launch")
    insider = _power_user(pipeline)

    table = pipeline.local.environment("ApprovalRequest")["TABLE_NAME"]
    (item,) = insider.client("dynamodb").scan(TableName=table)["Items"]
    stored = json.dumps(item)
    assert token not in stored and "task_token" not in item
    sealed = item["sealed_token"]["S"]
    kms = insider.client("kms")
    context = {k: item[k]["S"] for k in ("request_id", "execution", "gate")}
    blob = base64.b64decode(sealed)
    assert (
        _failed_denied(lambda: kms.decrypt(CiphertextBlob=blob, EncryptionContext=context)) == "AccessDeniedException"
    )
    assert any(
        d.action == "kms:Decrypt" and "insider" in d.principal and "no identity-based policy" in d.reason
        for d in pipeline.local.iam.denials()
    )
    sfn = insider.client("stepfunctions")
    for candidate in (sealed, item["request_id"]["S"]):
        code = _failed_denied(
            lambda c=candidate: sfn.send_task_success(taskToken=c, output=json.dumps({"decision": "x"}))
        )
        assert code in ("InvalidToken", "TaskDoesNotExist")
    assert pipeline.local.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"

    # The decision function opens it: the approver's decision resumes the run, which trains.
    assert pipeline.decide("launch", "approve")["request_id"] == request_id
    pipeline.run_until(arn, "Approval gate (promotion)")
    assert pipeline.jobs()


@pytest.mark.parametrize("gate", ["launch", "promotion"])
def test_a_decision_sent_with_the_token_outside_the_decision_url_fails_the_run_and_alarms(
    pipeline: Pipeline, gate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"launch": "Approval gate (pre-launch)", "promotion": "Approval gate (promotion)"}[gate]
    arn = pipeline.start(pipeline.input(**(EXPENSIVE if gate == "launch" else {})))
    pipeline.run_until(arn, state)
    request = pipeline.pending(gate)
    jobs_before = list(pipeline.jobs())
    forged = {
        "decision": "approved",
        "by": APPROVER,
        "caller": f"{APPROVER}/person",
        "reason": "looks right",
        "request_id": request["request_id"],
        "gate": gate,
        "requested_at": request["requested_at"],
        "decided_at": request["requested_at"],
    }
    insider = _power_user(pipeline)
    insider.client("stepfunctions").send_task_success(taskToken=_token(pipeline, arn, gate), output=json.dumps(forged))

    described = pipeline.finish(arn)
    assert described["status"] == "FAILED"
    error, cause = pipeline.error(described)
    assert error == "DecisionNotRecorded" and f"The {gate} gate resumed with a decision" in cause
    assert pipeline.jobs() == jobs_before  # nothing more trained
    if gate == "launch":
        assert not pipeline.jobs()
    else:
        assert all(p["ModelApprovalStatus"] != "Approved" for p in pipeline.model_packages())
    assert pipeline.pending(gate)["request_id"] == request["request_id"]  # the table never saw a decision
    emitted = [
        json.loads(line)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("{") and Metric.UNRECORDED_DECISIONS.value in line
    ]
    assert [e["_aws"]["CloudWatchMetrics"][0]["Namespace"] for e in emitted] == [NAMESPACE]
    assert emitted[0][Metric.UNRECORDED_DECISIONS.value] == [1.0]


def test_the_approvals_page_gives_a_valid_scp_that_reserves_every_task_result_call_to_the_decision_role() -> None:
    page = (Path(__file__).parents[2] / "docs" / "approver" / "approvals.md").read_text()
    section = page.split("## Service control policy: only the decision function answers a gate", 1)[1]
    policy = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    (statement,) = policy["Statement"]
    assert (policy["Version"], statement["Effect"], statement["Resource"]) == ("2012-10-17", "Deny", "*")
    # Every Step Functions operation that hands a task its result, as the service's own model names them.
    operations = botocore.session.get_session().get_service_model("stepfunctions").operation_names
    assert sorted(statement["Action"]) == sorted(f"states:{op}" for op in operations if op.startswith("SendTask"))
    # The Service Authorization Reference: each exists and takes only `*`, so no resource can narrow it.
    for action in statement["Action"]:
        (reference,) = get_action_data("states", action.split(":")[1])["states"]
        assert reference["resource_arn_format"] == "*", reference
    # aws:PrincipalArn is a global condition key; ArnNotLike exempts exactly the decision role.
    assert list(statement["Condition"]) == ["ArnNotLike"]
    (principals,) = statement["Condition"]["ArnNotLike"].values()
    assert list(statement["Condition"]["ArnNotLike"]) == ["aws:PrincipalArn"]
    assert len(principals) == 1 and ":role/" in principals[0]

"""Approval-gate handlers.

`request`: invoked by the state machine with `.waitForTaskToken`; stores the request and
notifies approvers. `decide`: behind a Lambda function URL with AWS_IAM auth, so only
SigV4-signed calls from principals granted lambda:InvokeFunctionUrl reach it; it also
checks the caller against the approver allow-list. Neither handler ever logs its event.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.approvals.store import ApprovalStore, DecisionError, now_utc
from lambdas.shared.env import env_int, env_json, env_str

logger = Logger(service="training-platform")


def _store() -> ApprovalStore:
    table = boto3.resource("dynamodb").Table(env_str("TABLE_NAME"))
    return ApprovalStore(table=table, sfn=boto3.client("stepfunctions"))


def notification(request_id: str, event: dict[str, Any], url: str, timeout_hours: int) -> tuple[str, str]:
    """Subject and body of the approvers' e-mail: what to decide and how, never the token."""
    gate, run = event["gate"], event["run_name"]
    lines = [
        f"The training run '{run}' is waiting for a {gate} decision (request {request_id}).",
        "",
        *[f"  {k}: {v}" for k, v in sorted(event["summary"].items())],
        "",
        f"Decide within {timeout_hours} h; no decision counts as a rejection. With your AWS credentials:",
        f"  python tools/approve.py --url {url} approve {request_id} --reason '...'",
        f"  python tools/approve.py --url {url} reject {request_id} --reason '...'",
        "",
        f"Execution: {event['execution']}",
    ]
    return f"Approval needed: {gate} of {run}"[:100], "\n".join(lines)


@logger.inject_lambda_context(log_event=False)
def request(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {gate, token, execution, run_name, summary}; the execution waits on the token."""
    timeout_hours = env_int("APPROVAL_TIMEOUT_HOURS")
    request_id = _store().create(
        token=event["token"],
        gate=event["gate"],
        execution=event["execution"],
        run_name=event["run_name"],
        summary=event["summary"],
        timeout_hours=timeout_hours,
        now=now_utc(),
    )
    subject, body = notification(request_id, event, env_str("DECISION_URL"), timeout_hours)
    boto3.client("sns").publish(
        TopicArn=env_str("TOPIC_ARN"),
        Subject=subject,
        Message=body,
        MessageAttributes={"kind": {"DataType": "String", "StringValue": "approval"}},
    )
    logger.info("approval requested", extra={"request_id": request_id, "gate": event["gate"]})
    return {"request_id": request_id}


def _response(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"}, "body": json.dumps(body)}


@logger.inject_lambda_context(log_event=False)
def decide(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Function URL (payload v2): GET lists pending requests; POST {request_id, decision, reason} decides."""
    http = event["requestContext"]["http"]
    caller = event["requestContext"].get("authorizer", {}).get("iam", {}).get("userArn", "")
    store = _store()
    if http["method"] == "GET":
        return _response(200, {"pending": store.pending()})
    if http["method"] != "POST":
        return _response(405, {"error": "use GET to list requests or POST to decide one"})
    try:
        body = json.loads(event.get("body") or "{}")
        result = store.decide(
            request_id=str(body.get("request_id", "")),
            decision=str(body.get("decision", "")),
            reason=str(body.get("reason", "")),
            caller=caller,
            approvers=frozenset(env_json("APPROVERS")),
            now=now_utc(),
        )
    except json.JSONDecodeError:
        return _response(400, {"error": "the body must be JSON: {request_id, decision, reason}"})
    except DecisionError as exc:
        logger.warning("decision refused", extra={"status": exc.status, "error": str(exc), "caller": caller})
        return _response(exc.status, {"error": str(exc)})
    logger.info("decision recorded", extra={k: result[k] for k in ("request_id", "gate", "decision", "by")})
    return _response(200, result)

"""Approval-gate handlers.

`request`: invoked by the state machine with `.waitForTaskToken`; seals the token, stores the
request (superseding the gate's earlier request of the execution, when it is made again with another
token) and notifies approvers. `verify`: after a gate resumes, fails the run unless the decision
it resumed with is the one `decide` recorded. `report_pending`: on a schedule, counts the requests still waiting and the
age of the oldest, as metrics. `decide`: behind a Lambda function URL with AWS_IAM auth (only principals
granted lambda:InvokeFunctionUrl reach it), it takes the caller's identity from a proof STS
attests (lambdas/approvals/identity.py), never from the event, so a direct invocation with a
made-up request context decides nothing. A run's gates are decided by its team's approvers when the
team names any, else by the platform's (lambdas/approvals/deciders.py); each approver lists only the
requests they may decide. Neither handler ever logs its event.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timedelta
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.approvals import identity
from lambdas.approvals.deciders import Deciders
from lambdas.approvals.environment import (
    ApprovalsEnvironment,
    DecideEnvironment,
    RequestEnvironment,
    TokenKeyEnvironment,
)
from lambdas.approvals.identity import IdentityError, Principal
from lambdas.approvals.store import (
    MAX_REASON,
    PAGE_SIZE,
    ApprovalStore,
    DecisionError,
    DecisionNotRecordedError,
    now_utc,
)
from lambdas.shared.errors import classified
from lambdas.shared.metrics import Metric, Stage, StageMetrics

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.APPROVAL)


# A decision body is three short strings; anything far larger is not one.
MAX_BODY_BYTES = 4 * MAX_REASON + 1024
# Nesting deeper than this is not a decision (the body is a flat object); json.loads would recurse.
MAX_BODY_DEPTH = 8
BODY_SHAPE = "{request_id, decision, reason}"


def _store(environment: ApprovalsEnvironment) -> ApprovalStore:
    table = boto3.resource("dynamodb").Table(environment.table_name)
    if isinstance(environment, TokenKeyEnvironment):
        return ApprovalStore(
            table=table,
            sfn=boto3.client("stepfunctions"),
            kms=boto3.client("kms"),
            token_key=environment.token_key_arn,
        )
    return ApprovalStore(table=table, sfn=boto3.client("stepfunctions"))


def decision_body(event: dict[str, Any]) -> dict[str, str]:
    """The decision a POST asks for, or a DecisionError(400) saying what is wrong with its body.

    Any body the handler cannot read (not UTF-8, too large, nested too deep, not JSON, not an object
    of strings) is the caller's error, answered as such.
    """
    raw: str | bytes = event.get("body") or "{}"
    if event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise DecisionError(400, f"the body is marked base64 but is not valid base64: send {BODY_SHAPE}") from None
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_BODY_BYTES:
        raise DecisionError(400, f"the body takes at most {MAX_BODY_BYTES} bytes: send {BODY_SHAPE}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DecisionError(400, f"the body must be UTF-8 JSON: {BODY_SHAPE}") from None
    depth = 0
    for char in text:  # brackets inside strings count too: a real decision body stays far below the limit
        depth += (char in "[{") - (char in "]}")
        if depth > MAX_BODY_DEPTH:
            raise DecisionError(400, f"the body is nested too deeply to be a decision: send {BODY_SHAPE}")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        raise DecisionError(400, f"the body must be JSON: {BODY_SHAPE}") from None
    if not isinstance(body, dict):
        raise DecisionError(400, f"the body must be a JSON object: {BODY_SHAPE}")
    fields = {key: body.get(key, "") for key in ("request_id", "decision", "reason")}
    wrong = sorted(key for key, value in fields.items() if not isinstance(value, str))
    if wrong:
        raise DecisionError(400, f"{', '.join(wrong)} must be a string: send {BODY_SHAPE}")
    return fields


def notification(request_id: str, event: dict[str, Any], url: str, timeout_hours: int) -> tuple[str, str]:
    """Subject and body of the approvers' e-mail: what to decide and how, never the token."""
    gate, run = event["gate"], event["run_name"]
    lines = [
        f"The training run '{run}' is waiting for a {gate} decision (request {request_id}).",
        "",
        *[f"  {k}: {v}" for k, v in sorted(event["summary"].items())],
        "",
        f"Decide within {timeout_hours} h; no decision counts as a rejection. With your AWS credentials:",
        f"  tp approve {request_id} --reason '...' --decision-url {url}",
        f"  tp reject {request_id} --reason '...' --decision-url {url}",
        *([f"Started by: {event['requested_by']}"] if event.get("requested_by") else []),
        "",
        f"Execution: {event['execution']}",
    ]
    return f"Approval needed: {gate} of {run}"[:100], "\n".join(lines)


@classified
@logger.inject_lambda_context(log_event=False)
@metrics.flushed
def request(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {gate, token, execution, run_name, requested_by, team, summary}; the execution waits on the token.

    The notification carries the run's `team` as an attribute (when it has one): the team's addresses subscribe to it.
    """
    environment = RequestEnvironment.from_environ()
    timeout_hours = environment.approval_timeout_hours
    request_id = _store(environment).create(
        token=event["token"],
        gate=event["gate"],
        execution=event["execution"],
        run_name=event["run_name"],
        summary=event["summary"],
        requested_by=event.get("requested_by"),
        team=event.get("team"),
        timeout_hours=timeout_hours,
        now=now_utc(),
    )
    subject, body = notification(request_id, event, environment.decision_url, timeout_hours)
    attributes = {"kind": {"DataType": "String", "StringValue": "approval"}}
    if event.get("team"):
        attributes["team"] = {"DataType": "String", "StringValue": event["team"]}
    boto3.client("sns").publish(
        TopicArn=environment.topic_arn, Subject=subject, Message=body, MessageAttributes=attributes
    )
    logger.info("approval requested", extra={"request_id": request_id, "gate": event["gate"]})
    metrics.record(Metric.APPROVALS_REQUESTED)
    return {"request_id": request_id}


def _response(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"}, "body": json.dumps(body)}


def _region() -> str:
    return str(boto3.session.Session().region_name)


def _deciders(environment: DecideEnvironment) -> Deciders:
    return Deciders.of(environment.approvers, environment.team_approvers)


def _caller(
    event: dict[str, Any], purpose: str, request: dict[str, Any], environment: DecideEnvironment
) -> tuple[str, Principal]:
    """Who signed this call's identity proof (for exactly this request), if they approve anything here."""
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    caller = identity.verify(
        headers.get(identity.PROOF_HEADER),
        bound_to=identity.binding(purpose, request),
        region=_region(),
        now=now_utc(),
    )
    principal = Principal.parse(caller)
    if not _deciders(environment).decide_anything(principal):
        raise IdentityError(
            403, f"{principal} is not an approver of this platform (settings: approvers, teams[].approvers)"
        )
    return caller, principal


def _list(event: dict[str, Any], store: ApprovalStore, environment: DecideEnvironment) -> dict[str, Any]:
    query = event.get("queryStringParameters") or {}
    asked = {"cursor": query.get("cursor") or "", "limit": query.get("limit") or str(PAGE_SIZE)}
    _, principal = _caller(event, "list", asked, environment)
    if not asked["limit"].isdigit() or not 1 <= int(asked["limit"]) <= PAGE_SIZE:
        return _response(400, {"error": f"limit must be a whole number from 1 to {PAGE_SIZE}"})
    deciders = _deciders(environment)
    page = store.pending(
        cursor=asked["cursor"] or None,
        limit=int(asked["limit"]),
        of_teams=lambda team: deciders.may_decide(principal, team),
    )
    return _response(200, page)


def _decide(event: dict[str, Any], store: ApprovalStore, environment: DecideEnvironment) -> dict[str, Any]:
    asked = decision_body(event)
    caller, principal = _caller(event, "decide", asked, environment)
    result = store.decide(
        **asked,
        caller=caller,
        principal=str(principal),
        deciders=_deciders(environment),
        forbid_self_approval=environment.forbid_self_approval,
        now=now_utc(),
    )
    logger.info("decision recorded", extra={k: result[k] for k in ("request_id", "gate", "decision", "by")})
    waited = datetime.fromisoformat(result["decided_at"]) - datetime.fromisoformat(result["requested_at"])
    metrics.record(Metric.APPROVALS_DECIDED)
    metrics.record(Metric.APPROVAL_WAIT, waited.total_seconds())
    return _response(200, result)


@classified
@logger.inject_lambda_context(log_event=False)
@metrics.flushed
def decide(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Function URL (payload v2): GET lists the pending requests the caller may decide (`?limit=&cursor=` pages);
    POST decides one.

    Every call carries an identity proof for what it asks (`tp` builds it).
    """
    method = (event.get("requestContext") or {}).get("http", {}).get("method")
    environment = DecideEnvironment.from_environ()
    store = _store(environment)
    try:
        if method == "GET":
            return _list(event, store, environment)
        if method == "POST":
            return _decide(event, store, environment)
        return _response(405, {"error": "use GET to list requests or POST to decide one"})
    except (IdentityError, DecisionError) as exc:
        logger.warning("request refused", extra={"status": exc.status, "error": str(exc)})
        return _response(exc.status, {"error": str(exc)})


@classified
@logger.inject_lambda_context(log_event=False)
@metrics.flushed
def verify(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {gate, execution, decision}, after a gate resumed; raises unless that decision was recorded."""
    store = _store(ApprovalsEnvironment.from_environ())
    try:
        store.verify(execution=event["execution"], gate=event["gate"], decision=event.get("decision") or {})
    except DecisionNotRecordedError:
        metrics.record(Metric.UNRECORDED_DECISIONS)
        logger.error("decision not recorded", extra={"gate": event["gate"], "execution": event["execution"]})
        raise
    return {"recorded": True}


@classified
@logger.inject_lambda_context(log_event=False)
@metrics.flushed
def report_pending(_event: Any, _context: Any) -> dict[str, Any]:
    """Scheduled: how many requests wait for a decision and how long the oldest has waited (0 when none)."""
    now = now_utc()
    waiting = _store(ApprovalsEnvironment.from_environ()).open_requests(now=now)
    oldest = max((now - datetime.fromisoformat(r["requested_at"]) for r in waiting), default=timedelta(0))
    metrics.record(Metric.APPROVALS_PENDING, len(waiting))
    metrics.record(Metric.OLDEST_PENDING_APPROVAL, oldest.total_seconds())
    logger.info("approvals pending", extra={"pending": len(waiting), "oldest_seconds": oldest.total_seconds()})
    return {"pending": len(waiting), "oldest_seconds": oldest.total_seconds()}

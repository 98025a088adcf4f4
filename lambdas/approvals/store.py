"""Approval requests in DynamoDB: create, list, decide exactly once, deliver the decision, verify it.

The task token is sealed before it is stored: encrypted under the approval token key, whose key
policy lets only the request function encrypt and only the decision function decrypt, with an
encryption context naming the request, its execution and its gate. Whoever reads the table (it is
also encrypted with the platform key) finds ciphertext no one else can open. The token is never
logged, never sent in a notification, never listed and never part of a URL: approvers refer to a
request by its ID. Pending requests are listed from an index that does not hold it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from contract.execution_state import Decision
from lambdas.approvals.deciders import Deciders
from lambdas.approvals.identity import Principal

PENDING, APPROVED, REJECTED, EXPIRED = "PENDING", "APPROVED", "REJECTED", "EXPIRED"
# A gate's request made again (the state machine retried it after a fault) replaces the one before it.
SUPERSEDED = "SUPERSEDED"
DECISIONS = {"approve": APPROVED, "reject": REJECTED}
# Keep decided requests this long after they expire, as the audit record.
AUDIT_DAYS = 90
# The model registry's ApprovalDescription takes 1024 characters: "Approved by <principal>: <reason>".
MAX_REASON = 512
PENDING_INDEX = "by-status"
PAGE_SIZE = 50


class DecisionNotRecordedError(Exception):
    """A gate resumed with a decision the decision function did not record: the run must stop."""


class DecisionError(Exception):
    """A decision that cannot be recorded; `status` is the HTTP status for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_id_for(token: str) -> str:
    """A stable ID per task token, so a retried request Lambda stores the same request."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def token_context(item: dict[str, Any]) -> dict[str, str]:
    """The encryption context a request's sealed token is bound to: that request, execution and gate."""
    return {"request_id": item["request_id"], "execution": item["execution"], "gate": item["gate"]}


@dataclass
class ApprovalStore:
    table: Any  # boto3 DynamoDB Table
    sfn: Any  # boto3 Step Functions client
    kms: Any = None  # boto3 KMS client (request and decision functions)
    token_key: str = ""  # the approval token key's ARN (request and decision functions)

    def create(
        self,
        *,
        token: str,
        gate: str,
        execution: str,
        run_name: str,
        summary: dict[str, Any],
        requested_by: str | None,
        team: str | None,
        timeout_hours: int,
        now: datetime,
    ) -> str:
        request_id = request_id_for(token)
        expires = now + timedelta(hours=timeout_hours)
        item = {
            "request_id": request_id,
            "gate": gate,
            "execution": execution,
            "run_name": run_name,
            "summary": json.dumps(summary, sort_keys=True, default=str),
            "status": PENDING,
            "requested_at": now.isoformat(),
            "expires_at": expires.isoformat(),
            "ttl": int((expires + timedelta(days=AUDIT_DAYS)).timestamp()),
        }
        if requested_by:
            item["requested_by"] = requested_by
        if team:
            item["team"] = team
        item["sealed_token"] = self._seal(token, token_context(item))
        try:
            self.table.put_item(Item=item, ConditionExpression="attribute_not_exists(request_id)")
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        self._supersede(execution=execution, gate=gate, by=request_id)
        return request_id

    def _supersede(self, *, execution: str, gate: str, by: str) -> None:
        """Mark the gate's earlier pending requests of `execution` superseded by request `by`.

        The state machine retries a gate's request after a fault; a retry may carry another task token,
        and the request an earlier attempt stored waits on a token nothing resumes. It leaves the
        approvers' list, and deciding it says which request to decide instead.
        """
        start: dict[str, Any] | None = None
        while True:
            page = self._pending_page(start, PAGE_SIZE)
            for earlier in page["Items"]:
                if earlier["execution"] != execution or earlier["gate"] != gate or earlier["request_id"] == by:
                    continue
                try:
                    self.table.update_item(
                        Key={"request_id": earlier["request_id"]},
                        UpdateExpression="SET #s = :s, superseded_by = :by",
                        ConditionExpression="#s = :p",
                        ExpressionAttributeNames={"#s": "status"},
                        ExpressionAttributeValues={":s": SUPERSEDED, ":by": by, ":p": PENDING},
                    )
                except ClientError as exc:  # decided or expired meanwhile: that record stands
                    if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                        raise
            start = page.get("LastEvaluatedKey")
            if not start:
                return

    def pending(
        self,
        *,
        cursor: str | None = None,
        limit: int = PAGE_SIZE,
        of_teams: Callable[[str | None], bool] | None = None,
    ) -> dict[str, Any]:
        """One page of open requests, newest first (the index holds no tokens); `next` continues it.

        With `of_teams`, only the requests whose run's team (None: no team) it accepts, each with its
        `team`; the page is filled from as many index pages as it takes.
        """
        shown: list[dict[str, Any]] = []
        start = _decode_cursor(cursor) if cursor else None
        while True:
            page = self._pending_page(start, limit)
            items = [{k: v for k, v in item.items() if k not in ("sealed_token", "ttl")} for item in page["Items"]]
            last = page.get("LastEvaluatedKey")
            if of_teams is None:
                return {"pending": items, "next": _encode_cursor(last) if last else None}
            teams = self._teams([item["request_id"] for item in items])
            for i, item in enumerate(items):
                team = teams.get(item["request_id"])
                if not of_teams(team):
                    continue
                shown.append({**item, "team": team})
                if len(shown) == limit:
                    more = (
                        last if i == len(items) - 1 else {k: item[k] for k in ("request_id", "status", "requested_at")}
                    )
                    return {"pending": shown, "next": _encode_cursor(more) if more else None}
            if not last:
                return {"pending": shown, "next": None}
            start = last

    def _pending_page(self, start: dict[str, Any] | None, limit: int) -> dict[str, Any]:
        """One page of the pending index, newest first, from `start` (a LastEvaluatedKey)."""
        query: dict[str, Any] = {
            "IndexName": PENDING_INDEX,
            "KeyConditionExpression": "#s = :p",
            "ExpressionAttributeNames": {"#s": "status"},
            "ExpressionAttributeValues": {":p": PENDING},
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if start:
            query["ExclusiveStartKey"] = start
        return self.table.query(**query)  # type: ignore[no-any-return]

    def _teams(self, request_ids: list[str]) -> dict[str, str | None]:
        """The team of each request (None: none); the pending index does not hold it."""
        found: dict[str, str | None] = {}
        keys: list[dict[str, Any]] = [{"request_id": request_id} for request_id in request_ids]
        while keys:
            # The resource's own client: it (de)serializes attribute values as the table does.
            answer = self.table.meta.client.batch_get_item(
                RequestItems={
                    self.table.name: {
                        "Keys": keys,
                        "ProjectionExpression": "#id, #t",
                        "ExpressionAttributeNames": {"#id": "request_id", "#t": "team"},
                    }
                }
            )
            for item in answer["Responses"].get(self.table.name, []):
                found[item["request_id"]] = item.get("team")
            keys = answer.get("UnprocessedKeys", {}).get(self.table.name, {}).get("Keys", [])
        return found

    def open_requests(self, *, now: datetime) -> list[dict[str, Any]]:
        """Every request still waiting for a decision (pending and not yet past its deadline), tokens left out."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.pending(cursor=cursor, limit=PAGE_SIZE)
            found += [r for r in page["pending"] if datetime.fromisoformat(r["expires_at"]) > now]
            cursor = page["next"]
            if cursor is None:
                return found

    def decide(
        self,
        *,
        request_id: str,
        decision: str,
        reason: str,
        caller: str,
        principal: str,
        deciders: Deciders,
        forbid_self_approval: bool,
        now: datetime,
    ) -> dict[str, Any]:
        """Record the first decision on a request and resume the execution with it.

        `caller` is who signed (as STS names them), `principal` the approver it counts as; it decides
        only if `deciders` names it for the request's team.
        """
        item = self._decidable(
            request_id,
            decision=decision,
            reason=reason,
            principal=principal,
            deciders=deciders,
            forbid_self_approval=forbid_self_approval,
            now=now,
        )
        status = DECISIONS[decision]
        record = {"decision": status.lower(), "by": principal, "caller": caller, "reason": reason.strip()}
        record, decided_at = self._record(request_id, status, record, now)
        output = Decision(
            **record,
            request_id=request_id,
            gate=item["gate"],
            requested_at=item["requested_at"],
            decided_at=decided_at.isoformat(),
        )
        self._deliver(request_id, status, self._unseal(item), output.model_dump())
        return output.model_dump()

    def verify(self, *, execution: str, gate: str, decision: dict[str, Any]) -> None:
        """Raise DecisionNotRecordedError unless `decision`, which resumed `gate` of `execution`, is the one recorded.

        A gate can be resumed by anyone holding its task token and states:SendTaskSuccess; only a
        decision the decision function wrote to the table (same request, execution, gate, outcome
        and approver) counts.
        """
        request_id = decision.get("request_id")
        item = (
            self.table.get_item(Key={"request_id": request_id}, ConsistentRead=True).get("Item")
            if isinstance(request_id, str) and request_id
            else None
        )
        expected = {
            "execution": execution,
            "gate": gate,
            "status": str(decision.get("decision", "")).upper(),
            "decided_by": decision.get("by"),
        }
        if (
            item is None
            or expected["status"] not in DECISIONS.values()
            or any(item.get(k) != v for k, v in expected.items())
        ):
            raise DecisionNotRecordedError(
                f"the {gate} gate of {execution} resumed with a {decision.get('decision')!r} decision that the "
                "decision function did not record; someone called states:SendTaskSuccess with the gate's task "
                "token outside the decision URL. The run stops; nothing it would have done was done."
            )

    def _seal(self, token: str, context: dict[str, str]) -> str:
        sealed = self.kms.encrypt(KeyId=self.token_key, Plaintext=token.encode(), EncryptionContext=context)
        return base64.b64encode(sealed["CiphertextBlob"]).decode()

    def _unseal(self, item: dict[str, Any]) -> str:
        opened = self.kms.decrypt(
            KeyId=self.token_key,
            CiphertextBlob=base64.b64decode(item["sealed_token"]),
            EncryptionContext=token_context(item),
        )
        return str(opened["Plaintext"].decode())

    def _decidable(
        self,
        request_id: str,
        *,
        decision: str,
        reason: str,
        principal: str,
        deciders: Deciders,
        forbid_self_approval: bool,
        now: datetime,
    ) -> dict[str, Any]:
        """The pending request `principal` may decide, or the DecisionError that says why not."""
        if decision not in DECISIONS:
            raise DecisionError(400, f"decision must be one of {sorted(DECISIONS)}, not {decision!r}")
        if not reason.strip():
            raise DecisionError(400, "a decision needs a reason; it is recorded with the run")
        if len(reason.strip()) > MAX_REASON:
            raise DecisionError(400, f"a reason takes at most {MAX_REASON} characters (the model registry keeps it)")
        item: dict[str, Any] | None = self.table.get_item(Key={"request_id": request_id}).get("Item")
        if item is None:
            raise DecisionError(404, f"no approval request {request_id}")
        team = item.get("team")
        if not deciders.may_decide(Principal.parse(principal), team):
            of = f"a run of team {team!r}" if team else "a run without a team"
            raise DecisionError(
                403, f"{principal} may not decide request {request_id} ({of}): {deciders.named(team)} do"
            )
        if item["status"] == SUPERSEDED:
            raise DecisionError(
                410,
                f"request {request_id} was made again as request {item['superseded_by']} (the gate's request was "
                "retried after a fault): decide that one",
            )
        if item["status"] == EXPIRED:
            raise DecisionError(410, f"request {request_id} expired at {item['expires_at']}: the run was rejected")
        if item["status"] == PENDING and now > datetime.fromisoformat(item["expires_at"]):
            self._expire(request_id)
            raise DecisionError(410, f"request {request_id} expired at {item['expires_at']}: the run was rejected")
        if forbid_self_approval and item.get("requested_by") == principal:
            raise DecisionError(
                403, f"{principal} started this run and may not decide its gates (pipeline.forbid_self_approval)"
            )
        return item

    def _record(
        self, request_id: str, status: str, record: dict[str, str], now: datetime
    ) -> tuple[dict[str, str], datetime]:
        """Write the decision once. The same approver's same decision, not yet delivered, is a retry."""
        try:
            self.table.update_item(
                Key={"request_id": request_id},
                UpdateExpression="SET #s = :s, decided_by = :by, decided_at = :at, reason = :r, caller = :c",
                ConditionExpression="#s = :pending",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":s": status,
                    ":by": record["by"],
                    ":at": now.isoformat(),
                    ":r": record["reason"],
                    ":c": record["caller"],
                    ":pending": PENDING,
                },
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            current = self.table.get_item(Key={"request_id": request_id})["Item"]
            if current.get("delivered") or current["status"] != status or current.get("decided_by") != record["by"]:
                raise DecisionError(
                    409,
                    f"request {request_id} was already {current['status'].lower()}"
                    + (f" by {current['decided_by']} at {current['decided_at']}" if "decided_by" in current else ""),
                ) from None
            # Same approver, same decision, not yet delivered: a retry after a failed delivery.
            return {**record, "reason": current["reason"]}, datetime.fromisoformat(current["decided_at"])
        return record, now

    def _deliver(self, request_id: str, status: str, token: str, output: dict[str, Any]) -> None:
        """Resume the waiting execution with the decision, then mark it delivered."""
        try:
            self.sfn.send_task_success(taskToken=token, output=json.dumps(output))
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken"):
                self._refuse(request_id, status, output)
                raise DecisionError(
                    410, f"request {request_id} timed out before the decision: the run was rejected"
                ) from None
            raise
        self.table.update_item(
            Key={"request_id": request_id},
            UpdateExpression="SET delivered = :t",
            ExpressionAttributeValues={":t": True},
        )

    def _refuse(self, request_id: str, status: str, output: dict[str, Any]) -> None:
        """A decision recorded but refused by the execution (its gate had timed out): the record no longer says
        the request was decided; it says it expired, and keeps the refused decision apart."""
        refused = {k: output[k] for k in ("decision", "by", "caller", "reason", "decided_at")}
        try:
            self.table.update_item(
                Key={"request_id": request_id},
                UpdateExpression=(
                    "SET #s = :e, refused_decision = :refused, refused_because = :why "
                    "REMOVE decided_by, decided_at, reason, caller"
                ),
                ConditionExpression="#s = :decided AND decided_by = :by AND attribute_not_exists(delivered)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":e": EXPIRED,
                    ":refused": refused,
                    ":why": "the gate had timed out: the run was rejected, and this decision was not delivered",
                    ":decided": status,
                    ":by": refused["by"],
                },
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise

    def _expire(self, request_id: str) -> None:
        """Mark a request expired (its task timed out), unless a decision got there first."""
        try:
            self.table.update_item(
                Key={"request_id": request_id},
                UpdateExpression="SET #s = :e",
                ConditionExpression="#s = :p",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":e": EXPIRED, ":p": PENDING},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise


def now_utc() -> datetime:
    return datetime.now(UTC)


def _encode_cursor(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode()


def _decode_cursor(cursor: str) -> dict[str, Any]:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, ValueError, RecursionError):
        raise DecisionError(400, "cursor is not one this service returned as `next`") from None
    if not isinstance(key, dict) or set(key) != {"request_id", "status", "requested_at"}:
        raise DecisionError(400, "cursor is not one this service returned as `next`")
    return key

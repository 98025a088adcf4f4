"""The retrain triggers' windows of new data, and the one execution each quiet window starts.

Each trigger has one item in the windows table. An object created under its prefix opens or extends
the trigger's window (`window_start`, `last_seen`). The sweep starts one execution for a window once
nothing newer has arrived for `quiet_minutes`, named from the trigger and the window, then closes it
(`started_through` = its `last_seen`). Every write is conditional: a duplicate or late event of data a
started run already covers opens no window, a retried sweep asks for the same execution name (Step
Functions starts a name once), and data that arrives while a run starts keeps its window open for a
run of its own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from lambdas.validate import start_proof

# The execution name: "retrain-<trigger>-<16 hex>", within Step Functions' 80 characters.
NAME_PREFIX = "retrain-"


@dataclass(frozen=True)
class Trigger:
    """A registered prefix of the datasets bucket and the execution input its new data starts."""

    name: str
    prefix: str
    quiet_minutes: int = 30
    input: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Trigger:
        return cls(
            name=data["name"],
            prefix=data["prefix"],
            quiet_minutes=int(data.get("quiet_minutes", 30)),
            input=dict(data.get("input") or {}),
        )


def matching(triggers: list[Trigger], key: str) -> list[Trigger]:
    """The triggers whose prefix holds this object key."""
    return [t for t in triggers if key.startswith(t.prefix)]


def stamp(moment: datetime) -> str:
    """One sortable text form for every time the table holds (DynamoDB compares strings)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """An EventBridge event time (`2026-11-23T05:00:00Z`) or a stamp."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def execution_name(trigger: str, window_start: str, last_seen: str) -> str:
    """Deterministic per window: a duplicate event or retried sweep asks for the same name."""
    digest = hashlib.sha256(f"{trigger}|{window_start}|{last_seen}".encode()).hexdigest()[:16]
    return f"{NAME_PREFIX}{trigger}-{digest}"


def execution_input(trigger: Trigger, datasets_bucket: str) -> dict[str, Any]:
    """The trigger's template, reading the registered prefix (unless it names the prefix's FSx path)."""
    return {**trigger.input, "dataset": trigger.input.get("dataset") or f"s3://{datasets_bucket}/{trigger.prefix}"}


def _conditional(exc: ClientError) -> bool:
    return bool(exc.response["Error"]["Code"] == "ConditionalCheckFailedException")


def record(table: Any, trigger: str, created: datetime) -> str:
    """Note an object created at `created`: "recorded" in the open window, or "covered" by a started run."""
    at = stamp(created)
    if _count_object_if(
        table,
        trigger,
        at,
        update="SET window_start = if_not_exists(window_start, :at), last_seen = :at ADD objects :one",
        condition="(attribute_not_exists(started_through) OR started_through < :at) "
        "AND (attribute_not_exists(last_seen) OR last_seen <= :at)",
    ):
        return "recorded"
    # Older than the open window's newest object (delivered late): it joins that window.
    if _count_object_if(
        table,
        trigger,
        at,
        update="ADD objects :one",
        condition="attribute_exists(last_seen) AND (attribute_not_exists(started_through) OR started_through < :at)",
    ):
        return "recorded"
    return "covered"  # created before the newest object a started run saw: that run reads it


def _count_object_if(table: Any, trigger: str, at: str, *, update: str, condition: str) -> bool:
    """Apply `update` (which counts the object created `at`) if `condition` holds; False if it does not."""
    try:
        table.update_item(
            Key={"trigger": trigger},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues={":at": at, ":one": 1},
        )
    except ClientError as exc:
        if not _conditional(exc):
            raise
        return False
    return True


@dataclass(frozen=True)
class Started:
    trigger: str
    execution_name: str
    objects: int
    already: bool
    """True when Step Functions had started this name before (a retried sweep)."""


def sweep(
    table: Any,
    sfn: Any,
    trigger: Trigger,
    *,
    state_machine_arn: str,
    datasets_bucket: str,
    now: datetime,
    credentials: Any,
    region: str,
) -> Started | None:
    """Start the run of the trigger's window if it has been quiet for `quiet_minutes`; None otherwise."""
    item = table.get_item(Key={"trigger": trigger.name}, ConsistentRead=True).get("Item")
    if not item or "last_seen" not in item:
        return None
    last_seen = str(item["last_seen"])
    if now - parse_time(last_seen) < timedelta(minutes=trigger.quiet_minutes):
        return None
    name = execution_name(trigger.name, str(item["window_start"]), last_seen)
    run_input = execution_input(trigger, datasets_bucket)
    # The trigger proves who starts the run, as `tp start` does for a person: the run's
    # requested_by is this function's role, and forbid_self_approval's proof requirement is met.
    proven = start_proof.attach(
        run_input, state_machine=state_machine_arn, execution_name=name, credentials=credentials
    )
    already = False
    try:
        sfn.start_execution(stateMachineArn=state_machine_arn, name=name, input=json.dumps(proven))
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ExecutionAlreadyExists":
            raise
        already = True  # started by an earlier sweep of this window (its proof was signed then)
    try:
        table.update_item(
            Key={"trigger": trigger.name},
            UpdateExpression="SET started_through = :last, execution_name = :name "
            "REMOVE window_start, last_seen, objects",
            ConditionExpression="last_seen = :last",
            ExpressionAttributeValues={":last": last_seen, ":name": name},
        )
    except ClientError as exc:
        if not _conditional(exc):
            raise
        # Newer objects arrived while the run started: the window stays open and gets its own run.
    return Started(trigger.name, name, int(item.get("objects", 0)), already)

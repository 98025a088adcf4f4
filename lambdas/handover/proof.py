"""Whether an execution was truly handed a run: the proof a hand-over input must pass before its state is trusted.

A hand-over input (`{"handover": {"from": <execution ARN>, "state": {...}}}`) says that another execution of this
state machine made its budget of polls and started this one to follow the same job (stacks/pipeline/polled_job.py).
Anyone who may start executions can write such an input; trusting it would let them skip Validate and the approval
gates. It is accepted only when the `from` execution is of the same state machine, is running or has succeeded, and
its history holds the StartExecution task that started the reading execution: its state is then read from that
task's own parameters in the history, never from the input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from contract.execution_state import HandOver
from lambdas.shared.errors import TransientError

HANDED_OVER_NAME = re.compile(r"-handover-\d+$")
"""How an execution a run was handed over to is named: `<job_name_base>-handover-<n>`."""
STARTED = ("TaskSucceeded", "TaskSubmitted")
"""The history events whose output is a StartExecution's answer, which names the execution it started."""
STARTING = "startExecution"
HANDED_OVER_FROM = ("RUNNING", "SUCCEEDED")
"""What the execution that hands a run over is while, and just after, it does."""


class HandOverRefused(Exception):  # noqa: N818 - the name is the execution's error
    """A hand-over input that its `from` execution's history does not prove: the run is refused."""


def state_machine_of(execution: str) -> str:
    """The state machine an execution ARN (`arn:<p>:states:<r>:<a>:execution:<machine>:<name>`) is of."""
    parts = execution.split(":")
    if len(parts) != 8 or parts[2] != "states" or parts[5] != "execution":
        raise HandOverRefused(f"{execution!r} is not a Step Functions execution ARN")
    return ":".join([*parts[:5], "stateMachine", parts[6]])


def proven_state(sfn: Any, claim: HandOver, reader: str) -> dict[str, Any]:
    """The state the `from` execution handed to `reader`, read from its history; HandOverRefused when it did not."""
    source = claim.from_
    if state_machine_of(source) != state_machine_of(reader):
        raise HandOverRefused(
            f"hand-over refused: {source} is not an execution of this state machine "
            f"({state_machine_of(reader)}); start a run with a training input instead"
        )
    status = sfn.describe_execution(executionArn=source)["status"]
    if status not in HANDED_OVER_FROM:
        raise HandOverRefused(f"hand-over refused: {source} is {status}, and only a running execution hands a run over")
    state, pending = _handed_state(sfn, source, reader)
    if state is not None:
        return state
    if status == "RUNNING" and pending:
        # It is starting an execution and has not recorded the answer yet: a moment later it has.
        raise TransientError(f"{source} has not recorded whom its StartExecution started yet")
    raise HandOverRefused(
        f"hand-over refused: {source} never started {reader}; start a run with a training input instead"
    )


def _handed_state(sfn: Any, source: str, reader: str) -> tuple[dict[str, Any] | None, bool]:
    """The state `source`'s StartExecution task handed to `reader` (None when no such task started it), and whether
    a StartExecution task of `source` awaits its answer."""
    scheduled: dict[int, dict[str, Any]] = {}
    answered: set[int] = set()
    for page in sfn.get_paginator("get_execution_history").paginate(executionArn=source):
        for event in page["events"]:
            details = event.get("taskScheduledEventDetails")
            if details and details.get("resource") == STARTING:
                scheduled[event["id"]] = json.loads(details["parameters"])
                continue
            if not event["type"].startswith("Task") or not scheduled:
                continue
            answer = event.get(f"{event['type'][0].lower()}{event['type'][1:]}EventDetails", {})
            if answer.get("resource") != STARTING or event["type"] in ("TaskStarted", "TaskScheduled"):
                continue
            task = max(eid for eid in scheduled if eid < event["id"])
            answered.add(task)
            if event["type"] in STARTED and _started(answer.get("output")) == reader:
                handed = HandOver.model_validate(_as_json(scheduled[task].get("Input"))["handover"])
                return handed.state, False
    return None, bool(set(scheduled) - answered)


def _started(output: str | None) -> str | None:
    answer = _as_json(output)
    return answer.get("ExecutionArn") if isinstance(answer, dict) else None


def _as_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class FirstExecution:
    """The run an execution goes on with: its first execution, when that started, and its job_name_base."""

    execution: str
    start_date: Any
    job_name_base: str


def first_execution(sfn: Any, execution: str) -> FirstExecution | None:
    """For an execution a run was proven handed over to, the run's first execution (whose ARN its jobs are tagged
    with); None for any other execution. A cleanup of an ended execution stops the jobs it followed by this."""
    if not HANDED_OVER_NAME.search(execution):
        return None
    given = _as_json(sfn.describe_execution(executionArn=execution).get("input"))
    if not isinstance(given, dict) or not isinstance(given.get("handover"), dict):
        return None
    state = proven_state(sfn, HandOver.model_validate(given["handover"]), execution)
    first = str(state["run"]["execution"])
    started = sfn.describe_execution(executionArn=first)["startDate"]
    return FirstExecution(first, started, str(state["request"]["job_name_base"]))


def handed_run(sfn: Any, execution: str) -> FirstExecution | None:
    """`first_execution`, and None for an execution whose hand-over was refused (it ran nothing of a run)."""
    try:
        return first_execution(sfn, execution)
    except HandOverRefused:
        return None

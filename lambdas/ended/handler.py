"""TellEndedRun handler: a run that ended without its states telling anyone is told to its recipients.

The state machine tells a run's `notify` list how it ended on every way out it takes itself (training failed,
below its quality gate, rejected, no decision in time). An execution that ends otherwise does not: stopped by a
person (ABORTED), out of time (TIMED_OUT), failed by Step Functions itself (a `States.*` error such as
States.Runtime, which no Catch catches: the 25,000-event history limit among them), or failed in one of the few
Fail states that no notification precedes (`UNTOLD`). EventBridge delivers each of those ends here, and the run's
recipients (from the request its history holds) get the cause in words.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field

from lambdas.handover.proof import handed_run
from lambdas.shared.env import HandlerEnvironment
from lambdas.shared.errors import classified
from lambdas.validate.resume import resolved_request

logger = Logger(service="training-platform")

UNTOLD = {
    "NothingToContinueError": "the run resume_from names has no checkpoint to resume from",
    "DecisionNotRecorded": "a gate's decision was not recorded by the decision function (the run was stopped)",
    "HandOverRefused": "the execution the run was handed over to could not go on with it (stacks/pipeline/handover.py)",
}
"""The errors of the state machine's Fail states that no notification precedes, and what they mean."""
RUNTIME = "States."
"""Errors of Step Functions itself, which no Catch catches."""


class TellEnvironment(HandlerEnvironment):
    """TellEndedRun's: the topic run notifications go to."""

    runs_topic: str


class EndedStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")

    executionArn: str  # noqa: N815 (EventBridge's names)
    name: str
    status: str
    error: str | None = None
    cause: str | None = None


class EndedEvent(EventBridgeModel):
    """Step Functions Execution Status Change, as the rule matches it (ABORTED, TIMED_OUT, FAILED)."""

    detail_type: str = Field(alias="detail-type")
    detail: EndedStatus


def untold(ended: EndedStatus) -> str | None:  # noqa: PLR0911 - one answer per way an execution ends
    """How the execution ended, in words, when no state of the run has told its recipients; None when one has."""
    error, cause = ended.error or "", (ended.cause or "").strip()
    if ended.status == "ABORTED":
        return f"stopped: {cause or 'no reason given'}" + (f" ({error})" if error else "")
    if ended.status == "TIMED_OUT":
        return "the execution reached the state machine's time limit before the run ended"
    if ended.status != "FAILED":
        return None
    if error.startswith(RUNTIME):
        if "history" in cause.lower():
            return f"the execution reached Step Functions' limit of 25,000 history events ({error}: {cause})"
        return f"Step Functions ended the execution ({error}): {cause or 'no cause given'}"
    if error in UNTOLD:
        return f"{UNTOLD[error]}: {cause}" if cause else UNTOLD[error]
    return None


def tell(ended: EndedStatus, *, sfn: Any, sns: Any, topic: str) -> dict[str, Any] | None:
    """Publish the run's end to its recipients when no state of it did; what was published, or None."""
    reason = untold(ended)
    if reason is None:
        return None
    request = resolved_request(sfn, ended.executionArn)
    if request is None:  # it ended before Validate resolved a request: no recipients, the starter sees it
        return None
    # A run handed over to new executions is named by its first execution, as its states name it.
    first = handed_run(sfn, ended.executionArn)
    message = {
        "run_name": request.run_name,
        "execution": first.execution if first is not None else ended.executionArn,
        "ended_execution": ended.executionArn,
        "status": ended.status,
        "error": ended.error,
        "cause": ended.cause,
        "reason": reason,
    }
    sns.publish(
        TopicArn=topic,
        Subject=f"Training run ended: {ended.status.lower().replace('_', ' ')}",
        Message=json.dumps(message),
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "run"},
            "recipients": {"DataType": "String.Array", "StringValue": json.dumps(request.recipients)},
        },
    )
    return message


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any] | None:
    """Event: EventBridge's Step Functions Execution Status Change of an execution that ended."""
    ended = EndedEvent.model_validate(event).detail
    told = tell(
        ended,
        sfn=boto3.client("stepfunctions"),
        sns=boto3.client("sns"),
        topic=TellEnvironment.from_environ().runs_topic,
    )
    logger.info("run's end told" if told else "run's end told by its states", extra={"execution": ended.executionArn})
    return told

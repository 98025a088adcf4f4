"""TakeOver handler: a hand-over execution's first state. It proves the hand-over (lambdas/handover/proof.py) and
answers the state the run goes on with, at the polling loop of the job that was running (stacks/pipeline/handover.py):
the same job, request, approvals and run (`$.run`, the run's first execution), this execution's count of polls at
zero. An unproven hand-over fails the execution with HandOverRefused and its cause; nothing of it runs.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger

from contract.execution_state import TakeOverEvent
from lambdas.handover.proof import proven_state
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def taken_over(state: dict[str, Any]) -> dict[str, Any]:
    """The handed state as this execution goes on with it: no polls made yet, nothing to hand over."""
    taken = {key: value for key, value in state.items() if key != "handed_to"}
    taken["job"] = {**taken.get("job", {}), "polls": 0, "hand_over": False}
    taken["train"] = {**taken.get("train", {}), "polls": 0}
    return taken


@classified
@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {"handover": {"from", "state"}, "execution": this execution's ARN}."""
    claim = TakeOverEvent.model_validate(event)
    state = proven_state(boto3.client("stepfunctions"), claim.handover, claim.execution)
    logger.info(
        "run taken over",
        extra={"execution": claim.execution, "from": claim.handover.from_, "run": state.get("run")},
    )
    return taken_over(state)

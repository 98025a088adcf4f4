"""What a hand-over's proof reads before any AWS call: whose execution an ARN is, which executions were handed a
run. The proof against real histories is executed in tests/pipeline/test_handover.py."""

from __future__ import annotations

import pytest

from lambdas.handover.proof import HandOverRefused, first_execution, state_machine_of

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:training-platform-dev"
EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:training-platform-dev:run-1"


def test_an_execution_is_of_the_state_machine_its_arn_names() -> None:
    assert state_machine_of(EXECUTION) == MACHINE
    assert state_machine_of(EXECUTION.replace("training-platform-dev", "other")) != MACHINE
    for wrong in ("run-1", MACHINE, "arn:aws:lambda:us-east-1:123456789012:function:x:y:z"):
        with pytest.raises(HandOverRefused, match="not a Step Functions execution ARN"):
            state_machine_of(wrong)


def test_only_an_execution_named_as_a_hand_over_is_looked_up() -> None:
    # A run's first execution is cleaned up as itself: no Step Functions call is made (the client is None).
    assert first_execution(None, EXECUTION) is None
    assert first_execution(None, EXECUTION.replace("run-1", "handover-run")) is None

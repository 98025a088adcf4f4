"""The local platform authorizes calls on the resources AWS's Service Authorization Reference names.

A permission scoped to a resource the action cannot name grants nothing in AWS; locally it must
grant nothing too, or a run passes here that fails in every deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import APPROVER
from tests.pipeline.test_iam_enforced import _assembly_with


def _send_task_success_on_the_state_machine(template: dict[str, Any]) -> None:
    """The decision function's grant as it was: SendTaskSuccess on the pipeline's state machine ARN."""
    (machine,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    (policy,) = [
        r
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Policy" and k.startswith("ApprovalResumeExecutions")
    ]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "states:SendTaskSuccess"
    statement["Resource"] = {"Ref": machine}


def test_send_task_success_scoped_to_the_state_machine_resumes_nothing(
    platform: Any, tmp_path: Path, open_platform: Any
) -> None:
    pipeline = open_platform(_assembly_with(platform, tmp_path, _send_task_success_on_the_state_machine))
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request_id = pipeline.pending("promotion")["request_id"]
    with pytest.raises(ClientError, match=r"not authorized to perform: states:SendTaskSuccess on resource: \*"):
        pipeline.decide_raw(APPROVER, body={"request_id": request_id, "decision": "approve", "reason": "ok"})

    denied = [(d.action, d.resource) for d in pipeline.local.iam.denials()]
    assert denied == [("states:SendTaskSuccess", "*")]
    assert pipeline.local.states_entered(arn)[-1] == "Approval gate (promotion)"

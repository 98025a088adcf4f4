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
from tests.pipeline.test_tuning import BILLED, LOSSES, _trial, tuning_input
from tests.support.iam_reference import actions_matching, resource_matches


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


@pytest.mark.parametrize("tuning", [False, True], ids=["training job", "tuning job"])
def test_every_call_of_a_run_is_authorized_on_a_resource_the_reference_names(
    pipeline_factory: Any, tuning: bool
) -> None:
    """The request model names, for each call, the resource AWS authorizes it on: "*" exactly for an
    action that takes no resource type, otherwise an ARN of a type the action accepts."""
    if tuning:
        pipeline = pipeline_factory(scripts=[_trial(loss, billed) for loss, billed in zip(LOSSES, BILLED, strict=True)])
        arn = pipeline.start(tuning_input(pipeline))
    else:
        pipeline = pipeline_factory()
        arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"

    judged = {(j.action, j.resource) for j in pipeline.local.iam.judgements if not j.action.startswith("s3:")}
    assert len({action for action, _ in judged}) >= 15
    wrong = []
    for action, resource in sorted(judged):
        (found,) = actions_matching(action)
        if resource == "*":
            if found.resource_formats:
                wrong.append(f"{action} on *: the reference names {[t for t, _ in found.resource_formats]}")
        elif not any(resource_matches(resource, f) for _, f in found.resource_formats):
            wrong.append(f"{action} on {resource}: the reference takes {found.resource_formats or 'only *'}")
    assert wrong == []

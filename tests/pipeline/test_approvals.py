"""Approval decisions rest on an identity STS attests, on every invocation path."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lambdas.approvals import identity
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from tests.conftest import APPROVER, PATH_APPROVER
from tests.pipeline.conftest import COMPLETED, Pipeline
from tools.start_run import with_proof

EXPENSIVE = {"instance_type": "ml.p5.48xlarge", "instance_count": 4, "max_runtime_hours": 10}


def _status(response: dict[str, Any]) -> tuple[int, str]:
    return response["statusCode"], json.loads(response["body"]).get("error", "")


def test_a_direct_invocation_with_a_made_up_identity_decides_nothing(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request_id = pipeline.pending("promotion")["request_id"]
    # What anyone with lambda:InvokeFunction could send: the function URL's request context, forged.
    forged = {
        "requestContext": {"http": {"method": "POST"}, "authorizer": {"iam": {"userArn": APPROVER}}},
        "body": json.dumps({"request_id": request_id, "decision": "approve", "reason": "trust me"}),
    }
    status, error = _status(pipeline.local.invoke("ApprovalDecide", forged))
    assert (status, "no identity proof" in error) == (401, True)
    listing = {"requestContext": {"http": {"method": "GET"}, "authorizer": {"iam": {"userArn": APPROVER}}}}
    assert _status(pipeline.local.invoke("ApprovalDecide", listing))[0] == 401
    assert pipeline.pending("promotion")["request_id"] == request_id  # still undecided
    assert pipeline.local.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"


def test_a_proof_for_another_decision_or_altered_is_refused(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request_id = pipeline.pending("promotion")["request_id"]
    session = pipeline.local.person(APPROVER)
    rejection = {"request_id": request_id, "decision": "reject", "reason": "not yet"}
    url = pipeline.local.environment("ApprovalRequest")["DECISION_URL"]
    from tools.approve import signed_request

    signed = signed_request(url, "POST", rejection, session)
    headers = {k.lower(): v for k, v in signed.header_items()}

    def send(body: dict[str, Any], proof: str) -> tuple[int, str]:
        event = {
            "requestContext": {"http": {"method": "POST"}},
            "headers": {identity.PROOF_HEADER: proof},
            "body": json.dumps(body),
        }
        return _status(pipeline.local.invoke("ApprovalDecide", event))

    proof = headers[identity.PROOF_HEADER]
    # The approver's proof for "reject", replayed with "approve": bound to the other decision.
    assert send({**rejection, "decision": "approve", "reason": "looks right"}, proof)[1].startswith(
        "the identity proof was made for another request"
    )
    # Its binding header rewritten to match: the signature no longer holds and STS refuses it.
    altered = json.loads(base64.b64decode(proof))
    approval = {**rejection, "decision": "approve", "reason": "looks right"}
    altered[identity.BINDING_HEADER] = identity.binding("decide", approval)
    status, error = send(approval, base64.b64encode(json.dumps(altered).encode()).decode())
    assert (status, error) == (403, "STS refused the identity proof (SignatureDoesNotMatch)")
    assert send(rejection, proof)[0] == 200  # the untouched proof does what it was made for
    assert pipeline.finish(arn)["error"] == "PromotionRejected"


def test_listing_is_for_approvers_only_and_paged(pipeline: Pipeline) -> None:
    arns = [pipeline.start(pipeline.input(**EXPENSIVE, run_name=f"big-run-{i}"), name=f"big-{i}") for i in range(3)]
    for arn in arns:
        pipeline.run_until(arn, "Approval gate (pre-launch)")
    status, error = _status(pipeline.decide_raw("arn:aws:iam::123456789012:role/DataScientist", method="GET"))
    assert (status, "is not an approver" in error) == (403, True)
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(3):
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = json.loads(pipeline.decide_raw(APPROVER, method="GET", query=query)["body"])
        assert len(page["pending"]) <= 2 and all("task_token" not in r for r in page["pending"])
        seen += [r["run_name"] for r in page["pending"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == ["big-run-0", "big-run-1", "big-run-2"]
    assert _status(pipeline.decide_raw(APPROVER, method="GET", query={"limit": "500"}))[0] == 400


def test_a_reason_fits_the_model_registry(pipeline: Pipeline) -> None:
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    request_id = pipeline.pending("promotion")["request_id"]
    too_long = {"request_id": request_id, "decision": "approve", "reason": "x" * 513}
    status, error = _status(pipeline.decide_raw(APPROVER, body=too_long))
    assert (status, "at most 512 characters" in error) == (400, True)
    fits = pipeline.decide_raw(APPROVER, body={**too_long, "reason": "y" * 512})
    assert fits["statusCode"] == 200
    assert pipeline.finish(arn)["status"] == "SUCCEEDED"


@pytest.fixture(scope="module")
def guarded(guarded_assembly: Path) -> Iterator[Pipeline]:
    """A platform where nobody decides their own run, with an approver role that has a path."""
    training = ScriptedTraining(scripts=[[Poll(), COMPLETED]])
    with LocalPlatform(guarded_assembly, training=training) as local:
        yield Pipeline(local, training)


def _started_by(pipeline: Pipeline, starter: str, name: str) -> str:
    execution_input = pipeline.input(instance_type="ml.p4d.24xlarge", run_name=name)
    session = pipeline.local.person(starter, "starter")
    return pipeline.local.start(with_proof(execution_input, pipeline.local.state_machine_arn, name, session), name=name)


def test_runs_must_prove_who_started_them_where_self_approval_is_forbidden(guarded: Pipeline) -> None:
    unproven = guarded.local.start(
        guarded.input(instance_type="ml.p4d.24xlarge", run_name="anonymous"), name="anon", requester=None
    )
    error, cause = guarded.error(guarded.finish(unproven))
    assert (error, "start runs with `tp start`" in cause) == ("InvalidRequest", True)
    # A proof made for another execution name does not carry over.
    session = guarded.local.person(APPROVER, "starter")
    stolen = with_proof(
        guarded.input(instance_type="ml.p4d.24xlarge", run_name="stolen"),
        guarded.local.state_machine_arn,
        "other-name",
        session,
    )
    error, cause = guarded.error(guarded.finish(guarded.local.start(stolen, name="stolen")))
    assert (error, "made for another request" in cause) == ("InvalidRequest", True)


def test_nobody_decides_their_own_run_and_role_paths_match(guarded: Pipeline) -> None:
    arn = _started_by(guarded, APPROVER, "own-run")
    guarded.run_until(arn, "Approval gate (promotion)")
    request = guarded.pending("promotion", caller=PATH_APPROVER)
    assert request["requested_by"] == APPROVER
    own = {"request_id": request["request_id"], "decision": "approve", "reason": "my own run looks great"}
    status, error = _status(guarded.decide_raw(APPROVER, body=own))
    assert (status, "started this run and may not decide its gates" in error) == (403, True)
    # An approver configured with a path (role/ml-team/TeamLead) signs as assumed-role/TeamLead/...
    decided = guarded.decide_raw(PATH_APPROVER, body={**own, "reason": "reviewed by the team lead"})
    assert decided["statusCode"] == 200, decided
    assert json.loads(decided["body"])["by"] == "arn:aws:iam::123456789012:role/TeamLead"
    assert guarded.finish(arn)["status"] == "SUCCEEDED"

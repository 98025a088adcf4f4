"""Identity proofs: what the decision function accepts before it asks STS who signed."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
from botocore.credentials import Credentials

from lambdas.approvals import identity
from lambdas.approvals.identity import IdentityError

KEYS = Credentials("ASIAEXAMPLE", "secret", "token")
DECISION = identity.binding("decide", {"request_id": "r1", "decision": "approve", "reason": "ok"})


def _check(proof: str | None, *, bound_to: str = DECISION, now: datetime | None = None) -> dict[str, str]:
    return identity.check(proof, bound_to=bound_to, region="eu-west-1", now=now or datetime.now(UTC))


def test_a_fresh_proof_for_this_request_passes_on_to_sts() -> None:
    headers = _check(identity.make_proof(KEYS, "eu-west-1", DECISION))
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=ASIAEXAMPLE/")
    assert identity.BINDING_HEADER.lower() in headers["Authorization"]  # the binding is signed
    assert headers["X-Amz-Security-Token"] == "token"


@pytest.mark.parametrize(
    ("proof", "status", "message"),
    [
        (None, 401, "no identity proof"),
        ("not base64!", 401, "not base64-encoded JSON"),
        (base64.b64encode(b"[1]").decode(), 401, "JSON object"),
        (identity.make_proof(KEYS, "us-east-1", DECISION), 403, "for STS in eu-west-1"),
        (
            identity.make_proof(KEYS, "eu-west-1", identity.binding("decide", {"request_id": "r2"})),
            403,
            "another request",
        ),
    ],
)
def test_proofs_that_cannot_prove_this_request_are_refused(proof: str | None, status: int, message: str) -> None:
    with pytest.raises(IdentityError, match=message) as refused:
        _check(proof)
    assert refused.value.status == status


def test_a_binding_header_outside_the_signature_is_refused() -> None:
    headers = json.loads(base64.b64decode(identity.make_proof(KEYS, "eu-west-1", DECISION)))
    signed = f";{identity.BINDING_HEADER.lower()},"
    assert signed in headers["Authorization"]
    headers["Authorization"] = headers["Authorization"].replace(signed, ",")
    with pytest.raises(IdentityError, match="another request"):
        _check(base64.b64encode(json.dumps(headers).encode()).decode())


def test_a_proof_older_than_fifteen_minutes_is_refused() -> None:
    proof = identity.make_proof(KEYS, "eu-west-1", DECISION)
    with pytest.raises(IdentityError, match="older than 15 minutes"):
        _check(proof, now=datetime.now(UTC) + timedelta(minutes=16))

"""Who is asking: an identity AWS attests, bound to the one request it was made for.

The caller signs an STS GetCallerIdentity request with its own credentials and adds a header
holding a hash of what it asks (a decision, a listing, a run to start). The platform sends that
exact request to STS and reads back who signed it. STS verifies the signature, so no caller can
claim another's identity; the hash is signed, so a proof made for one request cannot carry
another; and STS refuses signatures older than 15 minutes, which the platform checks as well.
This is the pattern of HashiCorp Vault's AWS IAM auth method; it holds on every invocation path,
including a direct `lambda:InvokeFunction` with a made-up event.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

BINDING_HEADER = "X-Training-Platform-Binding"
PROOF_HEADER = "x-training-platform-identity"
BODY = "Action=GetCallerIdentity&Version=2011-06-15"
CONTENT_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
MAX_AGE = timedelta(minutes=15)
_REPLAYED = (
    "Authorization",
    "X-Amz-Date",
    "X-Amz-Security-Token",
    "X-Amz-Content-SHA256",  # S3's (lambdas/validate/membership.py)
    BINDING_HEADER,
    "Content-Type",
)
_SCOPE = re.compile(r"Credential=([^/]+)/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
_SIGNED = re.compile(r"SignedHeaders=([^,\s]+)")
_PRINCIPAL = re.compile(r"^arn:(aws[a-z-]*):(iam|sts)::(\d{12}):(role|user|assumed-role)/(.+)$")


class IdentityError(Exception):
    """The proof is missing, malformed, stale, made for another request, or refused by STS."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def binding(purpose: str, request: Mapping[str, Any]) -> str:
    """The hash a proof must carry: what is asked, canonically encoded."""
    canonical = json.dumps({"purpose": purpose, **request}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def make_proof(credentials: Any, region: str, bound_to: str) -> str:
    """The caller's side: a signed GetCallerIdentity request, as a header value."""
    from botocore.auth import SigV4Auth  # noqa: PLC0415 - only callers build proofs
    from botocore.awsrequest import AWSRequest  # noqa: PLC0415

    request = AWSRequest(
        method="POST",
        url=f"https://sts.{region}.amazonaws.com/",
        data=BODY,
        headers={"Content-Type": CONTENT_TYPE, BINDING_HEADER: bound_to},
    )
    SigV4Auth(credentials, "sts", region).add_auth(request)
    return as_proof(request.headers)


def as_proof(headers: Mapping[str, str | bytes]) -> str:
    """A signed request's headers that a replay needs, as a header value (base64 of a JSON object)."""
    replayed = {name: _text(headers[name]) for name in _REPLAYED if name in headers}
    return base64.b64encode(json.dumps(replayed).encode()).decode()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def signature_digest(proof: str | None) -> str:
    """A SHA-256 of the proof's signature: what a record of a used proof keeps instead of the proof."""
    authorization = _proof_headers(proof).get("Authorization", "")
    return hashlib.sha256(authorization.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """An IAM role or user, as an allow-list names it; a role's path does not take part."""

    partition: str
    account: str
    kind: str
    name: str

    @classmethod
    def parse(cls, arn: str) -> Principal:
        match = _PRINCIPAL.match(arn)
        if match is None:
            raise ValueError(f"not an IAM role, user or assumed-role ARN: {arn}")
        partition, _, account, kind, rest = match.groups()
        if kind == "assumed-role":  # arn:aws:sts::1:assumed-role/<role>/<session>
            return cls(partition, account, "role", rest.split("/")[0])
        return cls(partition, account, kind, rest.rsplit("/", 1)[-1])

    def __str__(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:{self.kind}/{self.name}"


def _proof_headers(proof: str | None) -> dict[str, str]:
    if not proof:
        raise IdentityError(
            401,
            f"no identity proof: send a signed STS GetCallerIdentity request in {PROOF_HEADER} (tp does)",
        )
    try:
        headers = json.loads(base64.b64decode(proof, validate=True))
    except (binascii.Error, ValueError, RecursionError):
        raise IdentityError(401, "the identity proof is not base64-encoded JSON") from None
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise IdentityError(401, "the identity proof must be a JSON object of header names to values")
    return {name: headers[name] for name in _REPLAYED if name in headers}


def access_key(proof: str | None) -> str:
    """The access key that signed a proof (a session's, for temporary credentials): two proofs signed with the
    same key were signed by the same principal."""
    scope = _SCOPE.search(_proof_headers(proof).get("Authorization", ""))
    if scope is None:
        raise IdentityError(403, "the identity proof is not a SigV4 signature")
    return scope.group(1)


def check(
    proof: str | None,
    *,
    bound_to: str,
    region: str,
    now: datetime,
    max_age: timedelta = MAX_AGE,
    service: str = "sts",
) -> dict[str, str]:
    """The proof's headers, once they are fresh (signed within `max_age`), for this Region's `service` and this
    request."""
    headers = _proof_headers(proof)
    authorization = headers.get("Authorization", "")
    scope, signed = _SCOPE.search(authorization), _SIGNED.search(authorization)
    if scope is None or signed is None or scope.group(2, 3) != (region, service):
        raise IdentityError(403, f"the identity proof must be a SigV4 signature for {service.upper()} in {region}")
    if BINDING_HEADER.lower() not in signed.group(1).split(";") or headers.get(BINDING_HEADER) != bound_to:
        raise IdentityError(403, "the identity proof was made for another request; sign a new one for this one")
    try:
        signed_at = datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except (KeyError, ValueError):
        raise IdentityError(403, "the identity proof has no valid X-Amz-Date") from None
    if abs(now - signed_at) > max_age:
        minutes = int(max_age.total_seconds() // 60)
        raise IdentityError(403, f"the identity proof is older than {minutes} minutes; sign a new one")
    return headers


def verify(
    proof: str | None,
    *,
    bound_to: str,
    region: str,
    now: datetime,
    sts: Any = None,
    max_age: timedelta = MAX_AGE,
) -> str:
    """Who signed the proof, as STS answers it (an ARN); IdentityError if anything does not hold."""
    headers = check(proof, bound_to=bound_to, region=region, now=now, max_age=max_age)
    if sts is None:
        import boto3  # noqa: PLC0415
        from botocore import UNSIGNED  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        sts = boto3.client("sts", region_name=region, config=Config(signature_version=UNSIGNED))

    def replay(request: Any, **_: Any) -> None:
        for name, value in headers.items():
            request.headers[name] = value  # the caller's signature, sent unchanged

    from botocore.exceptions import ClientError  # noqa: PLC0415

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", replay)
    try:
        return str(sts.get_caller_identity()["Arn"])
    except ClientError as exc:
        raise IdentityError(403, f"STS refused the identity proof ({exc.response['Error']['Code']})") from None
    finally:
        sts.meta.events.unregister("before-sign.sts.GetCallerIdentity", replay)

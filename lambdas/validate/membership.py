"""Membership by principal tag, judged by IAM itself (settings `teams[].member_tag`).

A team's member is a role or user its `members` names, or any principal whose `platform-team` principal tag
(aws:PrincipalTag: a role's or user's IAM tag, or a session tag such as IAM Identity Center's attributes for
access control) equals the team's `member_tag`. Validate can neither see a session's tags nor reach IAM from
the VPC, so it lets IAM evaluate the tag. The starter signs one request beside its start proof: an S3
ListObjectsV2 of the artifacts bucket's prefix `team-membership/<team>/`, bound to the same execution and input.
The bucket policy (stacks/data_stack.py) denies that listing to every principal whose tag differs and allows it
to those whose tag matches. Validate sends the signed request unchanged, so S3 answers with a listing only for a
member. The request must be signed with the start proof's access key (the same principal and session) and
bound to the same execution, so it proves nothing for another principal or another run.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from lambdas.approvals import identity

FIELD = "membership_proof"
"""The execution input's field that holds the proof (`tp start` adds it to every input that names a team)."""
PREFIX = "team-membership/"
"""The artifacts bucket's key prefix whose listing, one prefix per team, only the team's tagged principals get."""
_OPERATION = "ListObjectsV2"
# S3's answers that are a platform fault, to retry, though S3 sends some as 4xx: the rest of 400 and 403 is the
# proof's (SignatureDoesNotMatch, ExpiredToken, a missing X-Amz-Content-SHA256, ...), AccessDenied IAM's verdict.
_RETRIED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestTimeout"})


class MembershipProofError(Exception):
    """The proof is malformed, stale, made for another run or signed by another principal."""


def prefix(team: str) -> str:
    """The key prefix whose listing proves membership of `team` by tag."""
    return f"{PREFIX}{team}/"


def _client(region: str, credentials: Any = None) -> Any:
    """The one way both sides build the request: same endpoint, addressing and parameters, so the same signature."""
    import boto3  # noqa: PLC0415
    from botocore import UNSIGNED  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    keys = {}
    if credentials is not None:
        keys = {
            "aws_access_key_id": credentials.access_key,
            "aws_secret_access_key": credentials.secret_key,
            "aws_session_token": credentials.token,
        }
    # The endpoint pinned, whatever the starter's configuration says (a regional us-east-1 endpoint, FIPS, dual
    # stack, AWS_ENDPOINT_URL): a proof signed for another host never matches Validate's replay.
    config = Config(
        signature_version="s3v4" if credentials is not None else UNSIGNED,
        s3={"addressing_style": "virtual", "us_east_1_regional_endpoint": "regional"},
        use_fips_endpoint=False,
        use_dualstack_endpoint=False,
        ignore_configured_endpoint_urls=True,
    )
    return boto3.client("s3", region_name=region, config=config, **keys)


def _list(s3: Any, bucket: str, team: str) -> Any:
    return s3.list_objects_v2(Bucket=bucket, Prefix=prefix(team), MaxKeys=0)


class _Signed(Exception):  # noqa: N818 - not an error: the signed request, caught before it is sent
    def __init__(self, headers: Any) -> None:
        super().__init__("signed")
        self.headers = headers


def sign(credentials: Any, *, bucket: str, team: str, region: str, bound_to: str) -> str:
    """The starter's side: the listing of the team's prefix, signed with `credentials` and bound to `bound_to`
    (the start proof's binding); never sent by the starter."""
    s3 = _client(region, credentials)

    def bind(request: Any, **_: Any) -> None:
        request.headers[identity.BINDING_HEADER] = bound_to  # signed with the rest

    def capture(request: Any, **_: Any) -> None:
        raise _Signed(request.headers)

    s3.meta.events.register(f"before-sign.s3.{_OPERATION}", bind)
    s3.meta.events.register(f"before-send.s3.{_OPERATION}", capture)
    try:
        _list(s3, bucket, team)
    except _Signed as signed:
        return identity.as_proof(signed.headers)
    raise AssertionError("the signed listing was sent")  # pragma: no cover - before-send always raises


def verify(
    proof: Any,
    *,
    bucket: str,
    team: str,
    region: str,
    bound_to: str,
    signer_key: str,
    now: datetime,
    max_age: timedelta,
    s3: Any = None,
) -> bool:
    """Whether S3 lets the proof's signer list the team's prefix: the bucket policy's verdict on its tag.

    MembershipProofError when the proof is not one for this run by the start proof's signer; a throttled or failed
    call to S3 is raised as it is (a platform fault, retried, never a refusal)."""
    if not isinstance(proof, str):
        raise MembershipProofError(f"{FIELD} must be the string `tp start` signs; start the run with `tp start`")
    try:
        headers = identity.check(proof, bound_to=bound_to, region=region, now=now, max_age=max_age, service="s3")
        signer = identity.access_key(proof)
    except identity.IdentityError as exc:
        raise MembershipProofError(str(exc).replace("identity proof", "membership proof")) from None
    if signer != signer_key:
        raise MembershipProofError(
            "the membership proof and the start proof were signed with different credentials; sign both with one "
            "session (tp start does)"
        )
    from botocore.exceptions import ClientError  # noqa: PLC0415

    s3 = s3 or _client(region)

    def replay(request: Any, **_: Any) -> None:
        for name, value in headers.items():
            request.headers[name] = value  # the starter's signature, sent unchanged

    s3.meta.events.register(f"before-sign.s3.{_OPERATION}", replay)
    try:
        _list(s3, bucket, team)
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "AccessDenied":
            return False
        if status in (400, 403) and code not in _RETRIED:
            raise MembershipProofError(f"S3 refused the membership proof ({code}); sign a new one") from None
        raise
    finally:
        s3.meta.events.unregister(f"before-sign.s3.{_OPERATION}", replay)
    return True

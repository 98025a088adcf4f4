"""The start proof: who starts a run, attested by STS, for one execution of one state machine, once.

The starter signs an STS GetCallerIdentity request (lambdas/approvals/identity.py) bound to the
state machine's ARN (hence account, Region and stage), the execution name and the input, whose `code.sha256`
names the run's own code (which Validate holds the stored archive to). Validate
accepts it only within `WINDOW` of its signing and only for one execution: a digest of its
signature is recorded with a conditional write against the execution's ARN and start time (an ARN
alone comes back when a deployment replaces the state machine), so the same proof cannot start a
second run, and a retried Validate of the same execution finds its own record and goes on. Validate then drops
the proof from the execution's state: only the proven identity travels on.

An input that names a team carries a second proof, bound the same way and signed with the same credentials: the
membership proof of lambdas/validate/membership.py, which lets IAM judge the starter's `platform-team` tag.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from lambdas.approvals import identity
from lambdas.validate import membership

FIELD = "requester_proof"
"""The execution input's field that holds the proof."""
WINDOW = timedelta(minutes=5)
"""How long after signing a proof starts a run: the time to start one, tighter than STS's 15 minutes."""
RECORD_TTL = timedelta(days=1)
"""How long a used proof's record is kept: well past WINDOW, so an expired proof is refused by its age."""


class ProofError(Exception):
    """The proof is missing, not STS's, made for another execution, expired or already used."""


def execution_parts(execution_arn: str) -> tuple[str, str]:
    """(state machine ARN, execution name) of a standard execution's ARN."""
    parts = execution_arn.split(":")
    if len(parts) != 8 or parts[:3] != ["arn", parts[1], "states"] or parts[5] != "execution":
        raise ValueError(f"not a Step Functions execution ARN: {execution_arn}")
    return ":".join([*parts[:5], "stateMachine", parts[6]]), parts[7]


def without_proof(execution_input: dict[str, Any]) -> dict[str, Any]:
    """The input as the run carries it on: everything but the proofs."""
    return {k: v for k, v in execution_input.items() if k not in (FIELD, membership.FIELD)}


def binding(execution_input: dict[str, Any], *, state_machine: str, execution_name: str) -> str:
    """What a start proof is bound to: the state machine, the execution name, the input (less the proof) and the
    digest of the run's own code, which Validate holds the stored archive to."""
    canonical = json.dumps(without_proof(execution_input), sort_keys=True, separators=(",", ":"))
    code = execution_input.get("code")
    return identity.binding(
        "start",
        {
            "state_machine": state_machine,
            "execution_name": execution_name,
            "input_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
            **({"code_sha256": code.get("sha256")} if isinstance(code, dict) else {}),
        },
    )


def attach(
    execution_input: dict[str, Any],
    *,
    state_machine: str,
    execution_name: str,
    credentials: Any,
    artifacts_bucket: str | None = None,
) -> dict[str, Any]:
    """The starter's side: the input plus a proof signed with `credentials` (botocore credentials), and, when the
    input names a team and `artifacts_bucket` is given, the membership proof of that team."""
    region = state_machine.split(":")[3]
    bound_to = binding(execution_input, state_machine=state_machine, execution_name=execution_name)
    proven = {**without_proof(execution_input), FIELD: identity.make_proof(credentials, region, bound_to)}
    team = execution_input.get("team")
    if isinstance(team, str) and artifacts_bucket:
        proven[membership.FIELD] = membership.sign(
            credentials, bucket=artifacts_bucket, team=team, region=region, bound_to=bound_to
        )
    return proven


def prove_membership(
    execution_input: dict[str, Any], *, execution_arn: str, team: str, bucket: str, now: datetime, s3: Any = None
) -> bool:
    """Whether IAM lets the start proof's signer list `team`'s membership prefix (its `platform-team` tag is the
    team's `member_tag`). Call it only once `prove` accepted the start proof; ProofError if the membership proof
    is missing or does not hold."""
    state_machine, execution_name = execution_parts(execution_arn)
    proof = execution_input.get(membership.FIELD)
    if proof is None:
        raise ProofError(
            f"{membership.FIELD}: a run of team {team!r} started by a principal its `members` do not name must "
            "prove the principal's team tag; start it with `tp start`, which adds the proof"
        )
    try:
        return membership.verify(
            proof,
            bucket=bucket,
            team=team,
            region=state_machine.split(":")[3],
            bound_to=binding(execution_input, state_machine=state_machine, execution_name=execution_name),
            signer_key=identity.access_key(execution_input.get(FIELD)),
            now=now,
            max_age=WINDOW,
            s3=s3,
        )
    except membership.MembershipProofError as exc:
        raise ProofError(str(exc)) from None


def prove(
    execution_input: dict[str, Any], *, execution_arn: str, started: str, table: Any, now: datetime, sts: Any = None
) -> str:
    """Who started `execution_arn`, as an IAM principal ARN; ProofError if the proof does not hold.

    `started` is the execution's start time ($$.Execution.StartTime); `table` is the boto3 Table of
    used proofs (key `proof`), where the proof is recorded for this execution before its signer is returned.
    """
    state_machine, execution_name = execution_parts(execution_arn)
    proof = execution_input.get(FIELD)
    try:
        caller = identity.verify(
            proof,
            bound_to=binding(execution_input, state_machine=state_machine, execution_name=execution_name),
            region=state_machine.split(":")[3],
            now=now,
            sts=sts,
            max_age=WINDOW,
        )
    except identity.IdentityError as exc:
        raise ProofError(str(exc)) from None
    from botocore.exceptions import ClientError  # noqa: PLC0415

    execution = f"{execution_arn}@{started}"
    try:
        table.put_item(
            Item={
                "proof": identity.signature_digest(proof),
                "execution": execution,
                "ttl": int((now + RECORD_TTL).timestamp()),
            },
            ConditionExpression="attribute_not_exists(#proof) OR #execution = :execution",
            ExpressionAttributeNames={"#proof": "proof", "#execution": "execution"},
            ExpressionAttributeValues={":execution": execution},
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        raise ProofError("this proof has already started another run; sign a new one for this run") from None
    return str(identity.Principal.parse(caller))

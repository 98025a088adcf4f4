"""`tp check`: whether tp can reach a stage, one line per thing it needs, each OK or what to fix.

The Region, the credentials, who they sign in as, the stage's pipeline stack and its outputs, and the caller's
team and approver standing under the settings (cdk.json, as `tp validate` reads them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3

from contract.service_requests import TEAM_TAG
from lambdas.approvals.identity import Principal
from stacks import outputs as stack_outputs
from stacks.settings import PlatformSettings, stage_prefix
from tools import aws_session
from tools.cli_errors import REGION_FIX, SIGN_IN, explain


@dataclass(frozen=True)
class Line:
    ok: bool | None
    """True: OK; False: something to fix; None: a note (neither)."""
    text: str


def check(
    stage: str,
    region: str | None,
    settings: Callable[[], PlatformSettings],
    *,
    given: dict[str, str | None] | None = None,
    session: Any = None,
) -> Iterator[Line]:
    """The lines of `tp check`, in order; each failure that the next lines need ends them. `settings` reads the
    settings (raising what they raise); `given`: the stack's outputs the flags or TP_* variables name (all of them:
    the stack is not read); `session` replaces the one the Region and credentials make (tests)."""
    found = aws_session.find_region(region)
    if found.name is None:
        yield Line(False, f"Region: none found; {REGION_FIX}")
        return
    yield Line(True, f"Region {found.name} (from {found.source})")
    if os.environ.get("AWS_ENDPOINT_URL"):
        yield Line(None, f"endpoint {os.environ['AWS_ENDPOINT_URL']} (AWS_ENDPOINT_URL: every AWS call goes there)")
    session = session or boto3.Session(region_name=found.name)
    credentials = session.get_credentials()
    if credentials is None:
        yield Line(False, f"credentials: none found; {SIGN_IN}")
        return
    yield Line(True, f"credentials from {credentials.method}")
    try:
        caller = session.client("sts").get_caller_identity()["Arn"]
    except Exception as exc:
        if (said := explain(exc)) is None:
            raise
        yield Line(False, f"identity: {said}")
        return
    yield Line(True, f"signed in as {caller}")
    if given and all(given.values()):
        yield Line(True, f"the stack's outputs are given ({', '.join(given)}): the stack is not read")
    else:
        yield from _stack(session, stage, found.name)
    yield from _standing(session, caller, settings)


def _stack(session: Any, stage: str, region: str) -> Iterator[Line]:
    name = stack_outputs.pipeline_stack_name(stage_prefix(stage))
    try:
        (stack,) = session.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
    except Exception as exc:
        said = explain(exc)
        if said is None:
            raise
        if "does not exist" in said:
            said = (
                f"not found in {region}: deploy the stage (make deploy), or name its stage (--stage, TP_STAGE) "
                "and Region"
            )
        yield Line(False, f"stack {name}: {said}")
        return
    found = {o["OutputKey"] for o in stack.get("Outputs", [])}
    missing = [key for key in stack_outputs.OUTPUTS if key not in found]
    if missing:
        yield Line(False, f"stack {name} has no output {', '.join(missing)}: deploy this revision (make deploy)")
    else:
        yield Line(True, f"stack {name} ({stack['StackStatus']}) with its {len(stack_outputs.OUTPUTS)} outputs")


def _standing(session: Any, caller: str, settings: Callable[[], PlatformSettings]) -> Iterator[Line]:
    """The caller's teams and approver standing, as the settings say (membership by tag read from IAM)."""
    try:
        read = settings()
    except Exception as exc:  # any unreadable settings are a note here, not the end of the check
        yield Line(None, f"team: the settings cannot be read ({exc}); --cdk-json or TP_CDK_JSON names them")
        return
    try:
        principal = Principal.parse(caller)
    except ValueError:
        yield Line(None, f"team: {caller} is no IAM role or user, which teams list")
        return
    tag, tag_note = _team_tag(session, principal)
    teams = [
        team.name
        for team in read.teams
        if any(_same(member, principal) for member in team.members) or (tag and team.member_tag == tag)
    ]
    if teams:
        yield Line(True, f"team {', '.join(teams)}: your runs may name it (`team`)")
    elif read.teams:
        yield Line(None, f"team: none of {', '.join(t.name for t in read.teams)} admits you{tag_note}")
    else:
        yield Line(None, "team: the settings name no teams; runs are the platform's")
    approves = [t.name for t in read.teams if any(_same(a, principal) for a in t.approvers)]
    if any(_same(a, principal) for a in read.approvers):
        approves.insert(0, "the platform")
    if approves:
        yield Line(True, f"approver of {', '.join(approves)}'s gates (tp pending, tp approve)")


def _same(arn: str, principal: Principal) -> bool:
    try:
        return Principal.parse(arn) == principal
    except ValueError:
        return False


def _team_tag(session: Any, principal: Principal) -> tuple[str | None, str]:
    """The role's `platform-team` tag, and a note when it cannot be read."""
    if principal.kind != "role":
        return None, ""
    try:
        tags = session.client("iam").list_role_tags(RoleName=principal.name)["Tags"]
    except Exception as exc:
        said = explain(exc)
        if said is None:
            raise
        return None, f" by name (your role's {TEAM_TAG} tag cannot be read: {said.splitlines()[0]})"
    return next((t["Value"] for t in tags if t["Key"] == TEAM_TAG), None), ""

"""Teams as Validate enforces them (settings `teams`, docs/platform-team/teams.md): who may run for a team, on
which data, in which shape of its quota share; and what a team's run carries (its cost tag, its e-mails).

The settings build these models (`PlatformSettings.platform_limits`) and the stack writes them into Validate's
environment (lambdas/validate/limits.py). Membership by tag is IAM's verdict on the requester's membership proof,
which the handler obtains (`tag_to_prove`, lambdas/validate/membership.py) before `resolve` judges the rest
(`request_team_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from contract.layout import FSX_DATASETS, FSX_SCHEME
from contract.service_requests import TEAM_TAG
from lambdas.approvals.identity import Principal
from lambdas.backends.queue import QUEUE
from lambdas.validate.inputs import ExecutionInput


class QuotaShare(BaseModel):
    """A team's quota share of the service environment, as far as Validate judges a request against it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    capacity: dict[str, int]
    sharing: Literal["RESERVE", "LEND", "LEND_AND_BORROW"] = "RESERVE"
    borrow_limit_percent: int | None = None

    def most(self, instance_type: str, service_capacity: Mapping[str, int]) -> int:
        """The most instances of a type one job of the share can ever hold: its own limit, plus what it may
        borrow (with LEND_AND_BORROW: limit x percent / 100 rounded down, or without a limit all the service
        environment has), never more than the service environment has."""
        own = self.capacity.get(instance_type, 0)
        environment = service_capacity.get(instance_type, 0)
        if own == 0:
            return 0
        if self.sharing == "LEND_AND_BORROW":
            own = environment if self.borrow_limit_percent is None else own + own * self.borrow_limit_percent // 100
        return min(own, environment)


class Team(BaseModel):
    """One team of the settings: its members, e-mails, data and quota share."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    members: tuple[str, ...] = ()
    member_tag: str | None = None
    notification_emails: tuple[str, ...] = ()
    dataset_prefixes: tuple[str, ...] = ()
    monthly_budget_usd: float | None = None
    """The team's budget: when spent, its stop refuses its runs (lambdas/validate/budget.py)."""
    quota_share: QuotaShare

    def listed(self, principal: Principal) -> bool:
        """Whether `members` names the principal (a role's path does not take part)."""
        return any(_principal(member) == principal for member in self.members)

    def owns(self, key: str) -> bool:
        """Whether a datasets-bucket key prefix reads any of the team's data (it lies under, or holds, a prefix)."""
        return any(key.startswith(prefix) or prefix.startswith(key) for prefix in self.dataset_prefixes)


def teams_json(teams: Sequence[Team]) -> list[dict[str, Any]]:
    return [team.model_dump(mode="json") for team in teams]


def teams_from_json(value: Sequence[Mapping[str, Any]]) -> tuple[Team, ...]:
    return tuple(Team.model_validate(team) for team in value)


def _principal(arn: str | None) -> Principal | None:
    try:
        return Principal.parse(arn) if arn else None
    except ValueError:  # e.g. a federated user or the root user: no role or user to be a member
        return None


def named_team(name: str | None, teams: Sequence[Team]) -> Team | None:
    return next((team for team in teams if team.name == name), None)


def tag_to_prove(team_name: Any, requested_by: str | None, teams: Sequence[Team]) -> Team | None:
    """The team whose `member_tag` the proven requester must be shown to carry, when only the tag can make it a
    member: the input names a team with a member_tag, and the team's `members` do not list the requester (its
    proof: lambdas/validate/membership.py)."""
    team = named_team(team_name, teams) if isinstance(team_name, str) else None
    if team is None or team.member_tag is None or requested_by is None:
        return None
    principal = _principal(requested_by)
    return None if principal is not None and team.listed(principal) else team


def request_team_problems(
    request: ExecutionInput,
    *,
    teams: Sequence[Team],
    service_capacity: Mapping[str, int],
    datasets: Mapping[str, str],
    instance_type: str | None,
    instance_count: int,
    requested_by: str | None,
    requester_tag: str | None,
    check_membership: bool,
    resumes_team: str | None,
) -> list[str]:
    """Why the request's team (or its lack of one) cannot run it, one line each with what to do (empty when it can).

    `datasets` are the request's datasets by input key, each the datasets-bucket key prefix it reads in normal form
    (request.dataset_prefixes; one refused there is not among them). `instance_type` and `instance_count` are the
    cluster's (None: the cluster check refused it), `requester_tag`
    the requester's `platform-team` tag as IAM proved it (the team's member_tag, or None), `resumes_team` the
    team of the run `resume_from` names (None: none, or a run of no team). Without `check_membership` (offline
    checks, which know no requester) who starts the run is not judged.
    """
    problems: list[str] = []
    team = named_team(request.team, teams)
    if request.team is not None and team is None:
        problems.append(
            f"team {request.team!r} is not a team of this platform; use one of {', '.join(t.name for t in teams)}"
            if teams
            else f"team {request.team!r}: this platform has no teams (settings `teams`); remove `team`"
        )
    if request.priority and request.backend != QUEUE:
        problems.append(
            f'priority: only backend "{QUEUE}" orders runs by priority (within the team\'s quota share); '
            f'remove it or use backend "{QUEUE}"'
        )
    if team is not None and check_membership:
        problems.extend(_membership(team, requested_by, requester_tag))
    problems.extend(_data(datasets, request, team, teams))
    if team is not None and request.backend == QUEUE and instance_type is not None:
        problems.extend(_quota_shape(team, service_capacity, instance_type, instance_count, request))
    if resumes_team is not None and resumes_team != request.team:
        problems.append(
            f"resume_from: the run is team {resumes_team!r}'s; only a run of that team can resume it"
            + (f" (set team {resumes_team!r})" if request.team is None else "")
        )
    return problems


def _membership(team: Team, requested_by: str | None, requester_tag: str | None) -> list[str]:
    if requested_by is None:
        return [
            f"team: a run of team {team.name!r} must prove who starts it (a member); start it with `tp start`, which "
            "adds requester_proof"
        ]
    principal = _principal(requested_by)
    if principal is not None and (team.listed(principal) or (team.member_tag and requester_tag == team.member_tag)):
        return []
    ways = ["its members"] + (
        [
            f"the principal tag {TEAM_TAG}={team.member_tag}, which IAM judges: a policy of the principal's own (an "
            "SCP, a permissions boundary) that denies s3:ListBucket on the artifacts bucket refuses a tagged member too"
        ]
        if team.member_tag
        else []
    )
    return [
        f"team: {principal or requested_by} is not a member of team {team.name!r}; start the run as a member, or ask "
        f"the platform team to make it one ({' or '.join(ways)})"
    ]


def _data(datasets: Mapping[str, str], request: ExecutionInput, team: Team | None, teams: Sequence[Team]) -> list[str]:
    problems = []
    for field, key in datasets.items():
        uri = getattr(request, field)
        owners = [t.name for t in teams if t.owns(key)]
        others = [name for name in owners if team is None or name != team.name]
        if others:
            problems.append(
                f"{field} {uri!r} reads team {' and '.join(repr(o) for o in others)}'s data (datasets-bucket key "
                f"{key!r}); only a run of that team may use it: set `team` and start the run as a member, or use "
                "other data"
            )
        elif team is not None and team.dataset_prefixes and not any(key.startswith(p) for p in team.dataset_prefixes):
            problems.append(
                f"{field} {uri!r} is not team {team.name!r}'s data; a run of the team reads only datasets under its "
                f"dataset_prefixes ({', '.join(team.dataset_prefixes)} of the datasets bucket, also as "
                f"{FSX_SCHEME}{FSX_DATASETS}<prefix>)"
            )
    return problems


def _quota_shape(
    team: Team, service_capacity: Mapping[str, int], instance_type: str, count: int, request: ExecutionInput
) -> list[str]:
    share = team.quota_share
    field = "instance_type" if request.instance_groups is None else "instance_groups"
    if instance_type not in share.capacity:
        return [
            f"{field}: team {team.name!r}'s quota share holds {', '.join(sorted(share.capacity))}, not "
            f"{instance_type}; use one of those"
        ]
    most = share.most(instance_type, service_capacity)
    if count <= most:
        return []
    field = "instance_count" if request.instance_groups is None else "instance_groups"
    own = share.capacity[instance_type]
    percent = share.borrow_limit_percent
    limit = "all idle capacity" if percent is None else f"{percent}%"
    borrowing = f", borrowing up to {limit}" if share.sharing == "LEND_AND_BORROW" else ""
    return [
        f"{field}: {count} x {instance_type} can never start in team {team.name!r}'s quota share: it holds at most "
        f"{most} ({own} of its own{borrowing}; the service environment has {service_capacity.get(instance_type, 0)});"
        f" ask for at most {most}"
    ]


def recipients(notify: Sequence[str], team: Team | None) -> list[str]:
    """Who hears about the run: its `notify` and its team's e-mails, each once."""
    return list(dict.fromkeys([*notify, *(team.notification_emails if team else ())]))

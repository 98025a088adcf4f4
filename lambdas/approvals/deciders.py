"""Who decides an approval request: the approvers of its run's team when the team names any, else the platform's."""

from __future__ import annotations

from dataclasses import dataclass

from lambdas.approvals.identity import Principal


@dataclass(frozen=True)
class Deciders:
    platform: frozenset[Principal]
    """settings `approvers`: the runs without a team, and those of teams that name no approvers."""
    teams: dict[str, frozenset[Principal]]
    """Each team that names approvers (settings `teams[].approvers`): they alone decide its runs."""

    @classmethod
    def of(cls, platform: list[str], teams: dict[str, list[str]]) -> Deciders:
        return cls(
            platform=frozenset(map(Principal.parse, platform)),
            teams={team: frozenset(map(Principal.parse, arns)) for team, arns in teams.items() if arns},
        )

    def of_team(self, team: str | None) -> frozenset[Principal]:
        """Who decides the gates of a run of `team` (None: a run without a team)."""
        return self.teams.get(team or "", self.platform)

    def may_decide(self, principal: Principal, team: str | None) -> bool:
        return principal in self.of_team(team)

    def decide_anything(self, principal: Principal) -> bool:
        return principal in self.platform or any(principal in approvers for approvers in self.teams.values())

    def named(self, team: str | None) -> str:
        """Who decides a run of `team`, as the settings name them."""
        if team in self.teams:
            return f"the approvers of team {team!r} (settings: teams[].approvers)"
        return "the platform's approvers (settings: approvers)"

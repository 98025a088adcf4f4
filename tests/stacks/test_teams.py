"""Teams: the settings."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stacks.settings import SettingsError, build_settings
from tests.conftest import SERVICE_ENVIRONMENT, TEAMS, cdk_context

P4D = "ml.p4d.24xlarge"


def teams_settings(**changes: Any) -> dict[str, Any]:
    """cdk.json's settings with the variant's teams (p4d allowed), `changes` replacing top-level keys."""
    base = cdk_context()["platform"]
    base["pipeline"] = {"allowed_instance_types": [P4D, "ml.p5.48xlarge"]}
    return {**base, "teams": copy.deepcopy(TEAMS), "service_environment": SERVICE_ENVIRONMENT, **changes}


# -- settings -----------------------------------------------------------------------------------------------
def test_the_shipped_settings_have_no_teams_and_the_variant_two() -> None:
    assert build_settings(cdk_context()["platform"]).teams == []
    settings = build_settings(teams_settings())
    assert [t.name for t in settings.teams] == ["vision", "language"]
    vision = settings.teams[0].quota_share
    assert (vision.sharing, vision.borrow_limit_percent, vision.in_share_preemption) == ("LEND_AND_BORROW", 100, True)
    assert settings.teams[1].quota_share.sharing == "RESERVE"


def test_every_problem_of_a_team_is_listed_at_once() -> None:
    vision, language = copy.deepcopy(TEAMS)
    vision["name"] = "Vision"
    vision["members"] = ["not-an-arn"]
    vision["quota_share"] = {"capacity": {P4D: 1, "ml.p9.huge": 1}, "sharing": "RESERVE", "borrow_limit_percent": 50}
    language.pop("member_tag")
    language["quota_share"] = {
        "capacity": {
            f"ml.{t}": 1 for t in ("p4d.24xlarge", "p5.48xlarge", "g5.xlarge", "g5.2xlarge", "g6.xlarge", "m5.xlarge")
        }
    }
    language["dataset_prefixes"] = ["/language"]
    with pytest.raises(SettingsError) as err:
        build_settings(teams_settings(teams=[vision, language]))
    message = str(err.value)
    for expected in (
        "teams.0.name = 'Vision': must start with a lowercase letter",
        "teams.0.members = ['not-an-arn']: must be IAM role/user ARNs",
        "unknown training instance type 'ml.p9.huge'",
        "teams.0.quota_share.borrow_limit_percent = 50: applies only to sharing LEND_AND_BORROW, not RESERVE",
        "teams.1.quota_share.capacity",
        "must name 1 to 5 instance types; it names 6",
        "teams.1.dataset_prefixes = ['/language']: must be key prefixes ending with '/'",
        "teams.1.member_tag: the team has no members: name IAM role ARNs in `members` or set `member_tag`",
    ):
        assert expected in message, f"{expected!r} missing from:\n{message}"


def test_teams_that_do_not_fit_the_service_environment_are_refused_with_every_reason() -> None:
    vision, language = copy.deepcopy(TEAMS)
    vision["quota_share"]["capacity"] = {P4D: 12, "ml.p5.48xlarge": 1}
    language["name"] = "vision"
    language["dataset_prefixes"] = ["vision/frames/"]
    with pytest.raises(SettingsError) as err:
        build_settings(teams_settings(teams=[vision, language], service_environment={"capacity": {P4D: 8}}))
    message = str(err.value)
    for expected in (
        "the name 'vision' is used 2 times; give each team its own name",
        "teams[0].quota_share.capacity['ml.p4d.24xlarge'] = 12: above the service environment's 8; lower it or "
        "raise service_environment.capacity['ml.p4d.24xlarge']",
        "teams[0].quota_share.capacity['ml.p5.48xlarge'] = 1: the service environment has no ml.p5.48xlarge; add it",
        "teams[0].dataset_prefixes 'vision/' (vision) overlaps teams[1].dataset_prefixes 'vision/frames/' (vision)",
    ):
        assert expected in message, f"{expected!r} missing from:\n{message}"


def test_the_service_environment_needs_teams_capacity_and_allowed_types() -> None:
    with pytest.raises(SettingsError, match=r"service_environment.capacity is empty but teams are set"):
        build_settings(teams_settings(service_environment={"capacity": {}}))
    with pytest.raises(SettingsError, match=r"service_environment.capacity is set but no teams are"):
        build_settings(teams_settings(teams=[]))
    with pytest.raises(SettingsError, match=r"capacity\['ml.g5.xlarge'\] = 2: ml.g5.xlarge is not in pipeline.allowed"):
        build_settings(teams_settings(service_environment={"capacity": {P4D: 8, "ml.g5.xlarge": 2}}))

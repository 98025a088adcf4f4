"""The teams scenario file: examples/teams.json parses; every mistake is named with its fix."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from localrun.demo.scenario import After, ScenarioError, is_scenario, parse
from tests.conftest import TEAMS_SCENARIO

SHIPPED = json.loads(TEAMS_SCENARIO.read_text())


ROLE = "arn:aws:iam::123456789012:role/TeamBScientist"


def test_the_shipped_scenario_parses_with_its_teams_runs_and_budget_stop() -> None:
    scenario = parse(SHIPPED)
    assert scenario.teams == ["team-a", "team-b"]
    assert [r.id for r in scenario.runs] == [
        "b-own", "b-borrow", "a-first", "a-second", "b-as-a", "b-reads-a", "a-as-b", "a-over-budget", "b-twin",
    ]  # fmt: skip
    assert scenario.principal_tags == {ROLE: {"platform-team": "team-b"}}
    assert [s.budget_stop for s in scenario.steps if s.budget_stop] == ["team-a"]
    assert scenario.steps[2].after == After(condition="reached_step", run="b-borrow", step=20)
    (twin,) = [r for r in scenario.runs if r.uninterrupted_twin_of]
    assert twin.input == next(r.input for r in scenario.runs if r.id == twin.uninterrupted_twin_of)
    assert is_scenario(SHIPPED) and not is_scenario({"run_name": "x", "model": "tiny"})


def _broken(change: Any) -> str:
    document = copy.deepcopy(SHIPPED)
    change(document)
    with pytest.raises(ScenarioError) as raised:
        parse(document)
    return str(raised.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("settings"), "settings: give the platform settings to merge, with `teams`"),
        (lambda d: d.update(steps=[]), "steps: give a list of steps, each a `run` or a `budget_stop`"),
        (lambda d: d.update(extra=1), "unknown keys ['extra']"),
        (lambda d: d["steps"][0].update(budget_stop="team-a"), "steps[0]: give exactly one of `run` or `budget_stop`"),
        (lambda d: d["steps"][0]["run"].pop("as"), "steps[0].run: missing ['as']"),
        (lambda d: d["steps"][1]["run"].update(id="b-own"), "steps[1].run.id: 'b-own' is used by an earlier run"),
        (lambda d: d["steps"][0]["run"].update({"as": "alice"}), "steps[0].run.as: 'alice' is not an IAM role ARN"),
        (lambda d: d["steps"][0]["run"].update(expect="DONE"), "steps[0].run.expect: 'DONE'; give one of SUCCEEDED"),
        (lambda d: d["steps"][0].update(after={"started": "a-first"}), "steps[0].after: started 'a-first' names no"),
        (lambda d: d["steps"][1].update(after={"soon": "b-own"}), "steps[1].after: give seconds, or one of started"),
        (lambda d: d["steps"][1].update(after=-1), "steps[1].after: -1 seconds; give 0 or more"),
        (lambda d: d["steps"][2].update(after={"reached_step": "b-own"}), "reached_step takes [run id, step]"),
        (lambda d: d["steps"][7].update(budget_stop="team-c"), "'team-c' is not a team of settings.teams"),
        (lambda d: d.update(principal_tags={"TeamB": {"platform-team": "b"}}), "principal_tags: give role ARNs"),
        (lambda d: d.update(principal_tags={ROLE: {"platform-team": 2}}), "principal_tags: give role ARNs"),
        (
            lambda d: d["steps"][8]["run"].update(uninterrupted_twin_of="b-later"),
            "steps[8].run.uninterrupted_twin_of: 'b-later' names no earlier run",
        ),
    ],
)
def test_a_broken_scenario_is_refused_saying_what_to_fix(change: Any, message: str) -> None:
    assert message in _broken(change)


def test_every_problem_is_named_at_once() -> None:
    def two(document: dict[str, Any]) -> None:
        document["steps"][0]["run"]["expect"] = "DONE"
        document["steps"][7]["budget_stop"] = "team-c"

    assert _broken(two).count("\n    ") == 2


@pytest.mark.parametrize(
    ("status", "waited", "holds"),
    [("RUNNABLE", False, True), ("RUNNING", True, True), ("SUCCEEDED", True, True), ("RUNNING", False, False)],
)
def test_queued_holds_once_the_scheduler_held_the_job_even_if_it_has_started_since(
    status: str, waited: bool, holds: bool
) -> None:
    # The driver looks now and then: a job that waited briefly and started between two looks was still queued.
    from localrun.backends.queue import ServiceJob
    from localrun.demo.cli import _Driver

    held_for = "waiting for capacity: share team-a uses 1 of 1 ml.m5.xlarge" if waited else ""
    job = ServiceJob("j", "a-second", "q", "team-a", "ml.m5.xlarge", 1, 10, "{}", 0, 0, {}, status, held_for=held_for)
    driver = object.__new__(_Driver)
    driver.service_job = lambda _run: job  # type: ignore[method-assign]
    assert driver.holds(After(condition="queued", run="a-second"), since=0.0) is holds


def test_the_terminal_says_once_that_a_job_waited_even_if_it_started_between_two_looks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import localrun.demo.cli
    from localrun.backends.queue import ServiceJob
    from localrun.demo.cli import _Driver

    reason = "waiting for capacity: share team-a uses 1 of 1 ml.m5.xlarge"
    job = ServiceJob("j", "a-second", "q", "team-a", "ml.m5.xlarge", 1, 10, "{}", 0, 0, {}, "RUNNING", held_for=reason)

    class Platform:
        class queue:  # noqa: N801
            @staticmethod
            def advance() -> None:
                return None

        @staticmethod
        def states_entered(_arn: str) -> list[str]:
            return []

        @staticmethod
        def history(_arn: str) -> list[dict[str, Any]]:
            return []

    monkeypatch.setattr(localrun.demo.cli, "_answer_gates", lambda *_args, **_kwargs: [])
    driver = object.__new__(_Driver)
    driver.platform = Platform()  # type: ignore[assignment]
    driver.service_job = lambda _run: job  # type: ignore[method-assign]
    driver.arns, driver.seen, driver.recent, driver.finished = {"a-second": "arn"}, {}, {}, set()
    driver.ended = lambda _run: False  # type: ignore[method-assign]
    driver.queue_states, driver.told_queued, driver.started, driver.verbose = {}, set(), 0.0, False
    driver.approver = driver.session = None  # type: ignore[assignment]
    driver.follow()
    driver.follow()
    assert capsys.readouterr().out.count(f"a-second queued: {reason}") == 1

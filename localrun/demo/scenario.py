"""A teams scenario for `make demo` (docs/demo.md: "Teams, in the demo"): settings, and runs started by team members.

A scenario file is a JSON object, not one execution input:

    {"settings": {"service_environment": {...}, "teams": [...]},      merged over the demo's platform settings
     "principal_tags": {"<IAM role ARN>": {"platform-team": "..."}},    optional: the roles' tags, as the account's
                                                                        identity provider gives its people
     "steps": [                                                         carried out in order
        {"run": {"id": "a1", "as": "<IAM role ARN>", "input": {...}, "expect": "SUCCEEDED"}, "after": ...},
        {"budget_stop": "<team>", "after": ...}]}

A run is an execution started by `as` (a session of that role signs its start proof); `expect` is how it must
end (SUCCEEDED, the default, or FAILED: refused); `uninterrupted_twin_of` names an earlier run of the same input
whose losses after its resume must equal this run's. A budget stop applies the team's budget action (its deny
policy on the roles the action names) as AWS Budgets does at 100% of the team's spend.

`after` is when the step is carried out, once the previous one was: a number of seconds, or one of
{"started": id} (the run's service job holds capacity and its training job runs), {"queued": id} (its service
job has waited in the queue for capacity), {"reached_step": [id, n]} (its training logged step n), {"ended": id}
(its execution ended). Without `after`, at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.scenario_files import is_scenario

__all__ = ["After", "Run", "Scenario", "ScenarioError", "Step", "is_scenario", "parse"]

CONDITIONS = ("started", "queued", "reached_step", "ended")
OUTCOMES = ("SUCCEEDED", "FAILED")


class ScenarioError(ValueError):
    """What is wrong with a scenario file, and how to fix it."""


@dataclass(frozen=True)
class After:
    """When a step is carried out: `seconds` after the previous step, or once `condition` holds of run `run`."""

    seconds: float = 0.0
    condition: str | None = None
    run: str | None = None
    step: int = 0

    def describe(self) -> str:
        if self.condition is None:
            return f"{self.seconds:g} s later" if self.seconds else "at once"
        if self.condition == "reached_step":
            return f"once {self.run} reached step {self.step}"
        return f"once {self.run} {self.condition}"


@dataclass(frozen=True)
class Run:
    id: str
    principal: str
    input: dict[str, Any]
    expect: str = "SUCCEEDED"
    uninterrupted_twin_of: str | None = None


@dataclass(frozen=True)
class Step:
    after: After
    run: Run | None = None
    budget_stop: str | None = None
    """The team whose budget stop is applied."""


@dataclass(frozen=True)
class Scenario:
    settings: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    principal_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    """Tags of the roles that start runs, by role ARN (a team's `member_tag` admits the roles tagged with it)."""

    @property
    def runs(self) -> list[Run]:
        return [s.run for s in self.steps if s.run is not None]

    @property
    def teams(self) -> list[str]:
        return [t["name"] for t in self.settings.get("teams", [])]


def parse(document: Any) -> Scenario:
    """The scenario of a JSON document, or ScenarioError saying every problem with its fix."""
    problems: list[str] = []
    if not isinstance(document, dict):
        raise ScenarioError("a scenario is a JSON object with `settings` and `steps`")
    unknown = sorted(set(document) - {"settings", "steps", "description", "principal_tags"})
    if unknown:
        problems.append(
            f"unknown keys {unknown}: a scenario has `settings`, `steps`, and optionally `principal_tags` and "
            "`description`"
        )
    principal_tags = document.get("principal_tags", {})
    if not (
        isinstance(principal_tags, dict)
        and all(
            _is_role(arn) and isinstance(tags, dict) and all(isinstance(v, str) for v in [*tags, *tags.values()])
            for arn, tags in principal_tags.items()
        )
    ):
        problems.append(
            'principal_tags: give role ARNs and their tags, e.g. {"arn:aws:iam::123456789012:role/Name": '
            '{"platform-team": "team-b"}}'
        )
        principal_tags = {}
    settings = document.get("settings")
    if not isinstance(settings, dict) or not settings.get("teams"):
        problems.append("settings: give the platform settings to merge, with `teams` and `service_environment`")
        settings = {}
    teams = [t.get("name") for t in settings.get("teams", []) if isinstance(t, dict)]
    raw_steps = document.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        problems.append("steps: give a list of steps, each a `run` or a `budget_stop`")
        raw_steps = []
    steps: list[Step] = []
    seen: list[str] = []
    for i, raw in enumerate(raw_steps):
        where = f"steps[{i}]"
        if not isinstance(raw, dict) or len({"run", "budget_stop"} & set(raw)) != 1:
            problems.append(f"{where}: give exactly one of `run` or `budget_stop` (and optionally `after`)")
            continue
        extra = sorted(set(raw) - {"run", "budget_stop", "after"})
        if extra:
            problems.append(f"{where}: unknown keys {extra}; a step has `run` or `budget_stop`, and `after`")
        after = _after(raw.get("after"), where, seen, problems)
        if "budget_stop" in raw:
            if raw["budget_stop"] not in teams:
                problems.append(f"{where}.budget_stop: {raw['budget_stop']!r} is not a team of settings.teams {teams}")
            steps.append(Step(after=after, budget_stop=raw["budget_stop"]))
            continue
        run = _run(raw["run"], f"{where}.run", seen, problems)
        if run is not None:
            seen.append(run.id)
            steps.append(Step(after=after, run=run))
    if problems:
        raise ScenarioError("the scenario is not valid:\n    " + "\n    ".join(problems))
    return Scenario(settings=settings, steps=steps, principal_tags=principal_tags)


def _is_role(arn: Any) -> bool:
    return str(arn).startswith("arn:aws:iam::") and ":role/" in str(arn)


def _after(raw: Any, where: str, seen: list[str], problems: list[str]) -> After:
    if raw is None:
        return After()
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if raw < 0:
            problems.append(f"{where}.after: {raw} seconds; give 0 or more")
        return After(seconds=float(raw))
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in CONDITIONS:
        problems.append(f"{where}.after: give seconds, or one of {', '.join(CONDITIONS)} naming an earlier run")
        return After()
    ((condition, value),) = raw.items()
    step = 0
    if condition == "reached_step":
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], int) and value[1] > 0):
            problems.append(f'{where}.after: reached_step takes [run id, step], e.g. {{"reached_step": ["b2", 20]}}')
            return After()
        value, step = value
    if value not in seen:
        problems.append(f"{where}.after: {condition} {value!r} names no earlier run; earlier runs: {seen}")
    return After(condition=condition, run=value, step=step)


def _run(raw: Any, where: str, seen: list[str], problems: list[str]) -> Run | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: give an object with id, as and input")
        return None
    missing = [k for k in ("id", "as", "input") if k not in raw]
    extra = sorted(set(raw) - {"id", "as", "input", "expect", "uninterrupted_twin_of"})
    if missing:
        problems.append(f"{where}: missing {missing}")
    if extra:
        problems.append(f"{where}: unknown keys {extra}")
    if missing:
        return None
    if raw["id"] in seen:
        problems.append(f"{where}.id: {raw['id']!r} is used by an earlier run; give each run its own id")
    if not _is_role(raw["as"]):
        problems.append(f"{where}.as: {raw['as']!r} is not an IAM role ARN (arn:aws:iam::123456789012:role/Name)")
    if not isinstance(raw["input"], dict):
        problems.append(f"{where}.input: give the execution input as an object")
    expect = raw.get("expect", "SUCCEEDED")
    if expect not in OUTCOMES:
        problems.append(f"{where}.expect: {expect!r}; give one of {', '.join(OUTCOMES)}")
    twin = raw.get("uninterrupted_twin_of")
    if twin is not None and twin not in seen:
        problems.append(f"{where}.uninterrupted_twin_of: {twin!r} names no earlier run; earlier runs: {seen}")
    return Run(id=raw["id"], principal=raw["as"], input=raw["input"], expect=expect, uninterrupted_twin_of=twin)

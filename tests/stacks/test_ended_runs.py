"""Every way a run ends reaches its recipients: each Fail state of the definition follows a notification, or its
error is one TellEndedRun tells (lambdas/ended/handler.py), as it tells an execution stopped, timed out or failed by
Step Functions itself; the rule that invokes it watches the pipeline's executions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lambdas.ended.handler import UNTOLD
from tests.support.iam import AssemblyIam, named_states
from tests.support.templates import template

# A request Validate refused has no recipients: its starter hears of it (tp validate and tp start say why).
NO_RECIPIENTS = {"InvalidRequest"}


def _edges(state: dict[str, Any]) -> list[str]:
    nexts = [state.get("Next"), state.get("Default")]
    nexts += [choice.get("Next") for choice in state.get("Choices", [])]
    nexts += [catch["Next"] for catch in state.get("Catch", [])]
    return [n for n in nexts if n]


@pytest.mark.parametrize("built", ["platform", "variant"])
def test_every_fail_state_follows_a_notification_or_is_told_when_the_execution_ends(
    built: str, request: pytest.FixtureRequest
) -> None:
    iam = AssemblyIam(Path(request.getfixturevalue(built).assembly.directory))
    ((stack, logical, _),) = [m for m in iam.resources("AWS::StepFunctions::StateMachine") if "Pipeline" in m[1]]
    states = named_states(iam.definition(stack, logical))
    before: dict[str, set[str]] = {}
    for name, state in states.items():
        for following in _edges(state):
            before.setdefault(following, set()).add(name)

    def notified(name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a run notification is published on every way into `name` (through Pass states)."""
        into = before.get(name, set()) - seen
        return bool(into) and all(
            states[p].get("Resource", "").endswith(":::sns:publish")
            or (states[p]["Type"] == "Pass" and notified(p, seen | {name}))
            for p in into
        )

    untold = {
        name: state.get("Error", state.get("ErrorPath"))
        for name, state in states.items()
        if state["Type"] == "Fail" and not notified(name)
    }
    assert untold, "no Fail state is left untold: TellEndedRun's table would be dead"
    assert set(untold.values()) <= {*UNTOLD, *NO_RECIPIENTS}, untold


def test_the_rule_tells_the_runs_recipients_of_ended_executions(platform: Any) -> None:
    t = template(platform, platform.pipeline)
    rules = [
        r["Properties"]
        for r in t.find_resources("AWS::Events::Rule").values()
        if "RunEnded" in str(r) or "TellEndedRun" in str(r["Properties"].get("Targets"))
    ]
    (rule,) = [r for r in rules if "TellEndedRun" in str(r["Targets"])]
    assert rule["EventPattern"]["detail"]["status"] == ["ABORTED", "TIMED_OUT", "FAILED"]
    assert rule["Targets"][0]["RetryPolicy"]["MaximumRetryAttempts"] == 8
    assert "DeadLetterConfig" in rule["Targets"][0]

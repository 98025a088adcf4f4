"""`--new-data`: a retrain example played as the S3 event that starts it (stacks/pipeline/retrain.py).

The demo's platform is synthesized with the example's retrain trigger (RETRAIN, as docs/platform-team/retraining.md
registers it). The demo writes the new data under the trigger's prefix of the datasets bucket; S3 sends "Object
Created" to EventBridge, whose rule invokes RetrainRecord (lambdas/retrain/handler.py), as deployed; the local
Clock then lets the trigger's quiet period pass, and the five-minute schedule's next event invokes RetrainSweep,
which starts the execution. The demo follows that execution; it starts none itself.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the tests' settings read RETRAIN without starting moto's imports
    from localrun.aws.engine import LocalPlatform

REPO = Path(__file__).resolve().parents[2]
RETRAIN = {
    "name": "web-text",
    "prefix": "incoming/web-text/",
    "input": "examples/retrain-on-new-data.json",
    "quiet_minutes": 30,
}
"""The retrain trigger of docs/platform-team/retraining.md: new objects under its prefix start its input."""
TRIGGERS = (RETRAIN,)


class NewDataError(ValueError):
    """The new data could not be played: the message says why and what to do."""


def trigger_of(input_path: Path) -> dict[str, Any] | None:
    """The retrain trigger whose input is this file (None: no trigger starts it)."""
    return next((t for t in TRIGGERS if (REPO / str(t["input"])).resolve() == input_path.resolve()), None)


def chosen(input_path: Path, asked: bool | None) -> dict[str, Any] | None:
    """The trigger to play, by `--new-data` / `--no-new-data` (`asked`; None: played for a trigger's input)."""
    trigger = trigger_of(input_path)
    if asked and trigger is None:
        inputs = ", ".join(str(t["input"]) for t in TRIGGERS)
        raise NewDataError(
            f"--new-data: no retrain trigger starts {input_path}; the demo's triggers start {inputs} "
            "(leave --new-data out to start this input as an ordinary run)"
        )
    return trigger if asked is not False else None


def _deliveries(platform: LocalPlatform, function: str) -> list[dict[str, Any]]:
    name = platform.functions.named(function).name
    return [d for d in platform.events.deliveries if d["function"] == name]


def _failed(deliveries: list[dict[str, Any]]) -> list[str]:
    return [
        d.get("error") or f"not permitted for rule {d['rule']}"
        for d in deliveries
        if not d["permitted"] or "error" in d
    ]


def play(platform: LocalPlatform, trigger: dict[str, Any], say: Callable[[str], None]) -> str:
    """Once the new data is written: its events recorded, the quiet period passed, the sweep run. The ARN of the
    execution the sweep started."""
    platform.events.drain()
    recorded = _deliveries(platform, "RetrainRecord")
    if failed := _failed(recorded):
        raise NewDataError(f"RetrainRecord failed on the new data's events: {'; '.join(failed)}")
    if not recorded:
        raise NewDataError(
            f"no object was written under s3://<datasets bucket>/{trigger['prefix']}: the input's dataset must be "
            f"fsx:///datasets/{trigger['prefix']}"
        )
    say(f"new data: {len(recorded)} objects under {trigger['prefix']}, each an S3 event RetrainRecord recorded")
    platform.clock.advance(timedelta(minutes=int(trigger["quiet_minutes"])))
    before = len(_deliveries(platform, "RetrainSweep"))
    platform.events.schedule_due(platform.functions.named("RetrainSweep").name)
    platform.events.drain()
    swept = _deliveries(platform, "RetrainSweep")[before:]
    if failed := _failed(swept):
        raise NewDataError(f"RetrainSweep failed: {'; '.join(failed)}")
    started = [run for delivery in swept for run in delivery["result"] if run["trigger"] == trigger["name"]]
    if not started:
        raise NewDataError(f"RetrainSweep started no run of trigger {trigger['name']} after its quiet period")
    name = started[-1]["execution_name"]
    say(f"{trigger['quiet_minutes']} quiet minutes later (on the local clock) RetrainSweep started execution {name}")
    executions = platform.sfn.list_executions(stateMachineArn=platform.state_machine_arn)["executions"]
    return str(next(e["executionArn"] for e in executions if e["name"] == name))

"""The retrain handlers' environments (stacks/pipeline/retrain.py sets them).

RETRAIN_TRIGGERS holds each trigger as `Trigger.parse` reads it (lambdas/retrain/window.py).
"""

from __future__ import annotations

from typing import Any

from lambdas.shared.env import HandlerEnvironment


class RecordEnvironment(HandlerEnvironment):
    """RetrainRecord's: the triggers' names and prefixes are enough to record new data."""

    table_name: str
    datasets_bucket: str
    retrain_triggers: list[dict[str, Any]]


class SweepEnvironment(HandlerEnvironment):
    """RetrainSweep's: the whole triggers, and the state machine their runs start."""

    table_name: str
    datasets_bucket: str
    state_machine_arn: str
    retrain_triggers: list[dict[str, Any]]

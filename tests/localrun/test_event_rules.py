"""EventBridge deliveries, played locally: `drain` waits for every delivery a test can already see."""

from __future__ import annotations

import threading
import time
from typing import Any

from localrun.aws.services import EventRules


class _SlowPolicy(EventRules):
    """Lambda's resource-policy check takes a while (as it may when the assembly is large)."""

    def _permitted(self, function_arn: str, rule_arn: str) -> bool:
        time.sleep(0.3)
        return True


def test_drain_waits_for_a_delivery_already_listed() -> None:
    def invoke(_name: str, _event: Any) -> dict[str, str]:
        time.sleep(0.2)
        return {"done": "yes"}

    rules = _SlowPolicy(assembly=None, resolver=None, invoke=invoke)  # type: ignore[arg-type]
    props = {"Targets": [{"Arn": "arn:aws:lambda:us-east-1:123456789012:function:Cleanup"}]}
    sender = threading.Thread(target=rules._targets, args=("arn:aws:events:rule/Ended", props, {"detail": {}}))
    sender.start()
    deadline = time.monotonic() + 10
    while not rules.deliveries:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    rules.drain()
    (delivery,) = rules.deliveries
    assert delivery["permitted"] and delivery["result"] == {"done": "yes"}
    sender.join(timeout=10)

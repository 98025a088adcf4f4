"""The executions a run goes on in: its first, then each one a hand-over started (stacks/pipeline/handover.py).

An execution that hands its run over succeeds with `{"continues_in": <the next execution>, "run": ...}`
(contract/execution_state.py `HandedOver`): whoever asks how a run stands (`tp watch`, `tp stop`, Validate's
`resume_from`) follows that chain to the execution the run is in now.
"""

from __future__ import annotations

import json
from typing import Any


def continues_in(described: dict[str, Any]) -> str | None:
    """The execution a DescribeExecution answer's run was handed over to; None for one that did not hand over."""
    if described.get("status") != "SUCCEEDED":
        return None
    try:
        output = json.loads(described.get("output") or "null")
    except ValueError:
        return None
    following = output.get("continues_in") if isinstance(output, dict) else None
    return following if isinstance(following, str) else None


def executions(sfn: Any, arn: str) -> list[tuple[str, dict[str, Any]]]:
    """Each execution of the run that `arn` starts, oldest first, with its description; the last is the run now."""
    chain: list[tuple[str, dict[str, Any]]] = []
    seen = set()
    following: str | None = arn
    while following is not None and following not in seen:
        seen.add(following)
        described: dict[str, Any] = sfn.describe_execution(executionArn=following)
        chain.append((following, described))
        following = continues_in(described)
    return chain

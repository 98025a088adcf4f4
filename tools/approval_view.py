"""The approver's screen: a pending request as a short card of what to decide on, which fits 80 columns.

A launch request shows the cluster, the runtime limit and the cost against the threshold and the budgets; a
promotion request the evaluation, the model package and its lineage. Every value is shown whole, on a line of
its own: the request id to paste into `tp approve`, the run and the requester are never cut or folded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lambdas.approvals.store import DECISIONS

REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")
"""An approval request's id (lambdas/approvals/store.py request_id_for), as `tp show` tells it from a run's name."""


def summary(request: dict[str, Any]) -> dict[str, Any]:
    """The gate's summary: the store keeps it as a JSON string; tp shows and prints it as an object."""
    raw = request.get("summary")
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError):
        return {"summary": raw}
    return parsed if isinstance(parsed, dict) else {"summary": parsed}


def as_json(request: dict[str, Any]) -> dict[str, Any]:
    """The request as `--json` prints it: its summary an object, not a string of JSON."""
    return {**request, "summary": summary(request)}


def card(request: dict[str, Any], *, full: bool = False) -> list[str]:
    """The request's lines: a heading, then one `name  value` line each; `full` adds the execution and times."""
    facts = summary(request)
    team = f" (team {request['team']})" if request.get("team") else ""
    rows: list[tuple[str, str]] = [
        ("request", str(request.get("request_id", ""))),
        ("run", f"{request.get('run_name', '')}{team}"),
        ("requested by", str(request.get("requested_by") or "(not recorded)")),
    ]
    if request.get("gate") == "launch":
        rows += _launch(facts)
    else:
        rows += [
            ("evaluation", str(facts.get("evaluation") or "")),
            ("model", str(facts.get("model_package") or "")),
            ("lineage", str(facts.get("lineage") or "")),
        ]
    known = {"instances", "spot", "max_cost_usd", "worst_case", "threshold_usd", "max_runtime_seconds"}
    known |= {"budget_warning", "dataset", "evaluation", "model_package", "lineage"}
    rows += [(key, str(value)) for key, value in sorted(facts.items()) if key not in known]
    if full:
        rows += [
            ("execution", str(request.get("execution", ""))),
            ("requested at", str(request.get("requested_at", ""))),
            ("expires at", str(request.get("expires_at", ""))),
        ]
    width = max(len(name) for name, _ in rows)
    heading = f"{request.get('gate', '?')} gate, waiting since {str(request.get('requested_at', '?'))[:16]}"
    return [heading, *(f"  {name:<{width}}  {value}" for name, value in rows if value)]


def _launch(facts: dict[str, Any]) -> list[tuple[str, str]]:
    spot = " on spot" if str(facts.get("spot")).lower() == "true" else " on demand"
    runtime = _hours(facts.get("max_runtime_seconds"))
    cost = _usd(facts.get("max_cost_usd"))
    threshold = _usd(facts.get("threshold_usd"))
    rows = [
        ("cluster", f"{facts.get('instances', '?')}{spot}" + (f", at most {runtime}" if runtime else "")),
        ("cost", f"at most {cost}" + (f" (approval threshold {threshold})" if threshold else "")),
    ]
    worst = str(facts.get("worst_case") or "")
    if worst and not worst.startswith("the run's own cluster"):
        rows.append(("worst case", worst))
    if facts.get("budget_warning"):
        rows.append(("budget", str(facts["budget_warning"])))
    rows.append(("dataset", str(facts.get("dataset") or "")))
    return rows


def _usd(value: Any) -> str:
    try:
        return f"${float(value):,.2f}"
    except (TypeError, ValueError):
        return str(value or "?")


def _hours(seconds: Any) -> str:
    try:
        hours = float(seconds) / 3600
    except (TypeError, ValueError):
        return ""
    return f"{hours:g} h"


def decided(decision: str) -> str:
    """A decision's verb in the past tense, from the statuses the store records ("approved", "rejected")."""
    return DECISIONS[decision].lower()

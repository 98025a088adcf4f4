"""A run on the terminal: `tp watch`'s lines (one fact a line, never one long line) and `tp show`'s card of a run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from tools import run_state

BudgetWords = Callable[[str, Any], str]
"""A failure cause as the person reads it (tp's `_in_words`): a budget stop's raw deny as whose budget, whom to ask."""


def watch_lines(state: dict[str, Any], in_words: BudgetWords) -> list[str]:
    """`tp watch`: the run's state, then its job's step, losses, ETA, cost, goodput and interruptions, a line each."""
    where = f" at {state['state']!r}" if state["state"] and state["status"] == "RUNNING" else ""
    lines = [f"run {state['run']}: {state['status']}{where}"]
    rows: list[tuple[str, str]] = []
    if state.get("queued"):
        rows.append(("queued", str(state["queued"])))
    if state.get("preemptions"):
        rows.append(("preempted", f"{state['preemptions']} times, resumed from checkpoints"))
    job = state["job"]
    if job is not None and not state.get("queued"):
        rows += _job_rows(job)
    if state["cost_so_far_usd"] is not None:
        bound = f", of at most ${state['max_cost_usd']:,.2f}" if state["max_cost_usd"] is not None else ""
        rows.append(("cost", f"${state['cost_so_far_usd']:,.2f} so far{bound}"))
    if state.get("running_goodput") is not None:
        rows.append(("goodput", f"{state['running_goodput']['summary']} so far (this job)"))
    if state["goodput"] is not None:
        rows.append(("finished", f"goodput of the finished jobs {state['goodput']['summary']}"))
    if state["interruptions"]:
        rows.append(("spot", f"{state['interruptions']} interruptions"))
    if state["status"] not in ("RUNNING", "SUCCEEDED") and (state.get("error") or state.get("cause")):
        cause = in_words(str(state.get("cause") or ""), state.get("team"))
        rows.append(("ended", f"{state.get('error') or state['status']}: {cause}"))
    rows += [("note", note) for note in state.get("notes", [])]
    return lines + _aligned(rows)


def _job_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("job", f"{job['name']}: {job['status']} / {job['secondary_status']}")]
    latest = job.get("latest")
    of = f" of {job['max_steps']}" if job["max_steps"] else ""
    if latest is not None:
        checkpoint = f"; last checkpoint at step {job['checkpointed_step']}" if job["checkpointed_step"] else ""
        rows.append(("step", f"{latest['step']}{of}, logged at {latest['logged_at'][11:19]} UTC{checkpoint}"))
    elif job["checkpointed_step"] is not None:
        rows.append(("step", f"{job['checkpointed_step']}{of} (last checkpoint; no log lines read)"))
    losses = []
    if job["loss"] is not None:
        losses.append(f"{job['loss']:.4g}")
    if job.get("validation_loss") is not None:
        at = f" at step {latest['validation_step']}" if latest and latest.get("validation_step") else ""
        losses.append(f"validation {job['validation_loss']:.4g}{at}")
    if losses:
        rows.append(("loss", ", ".join(losses)))
    if job["tokens_per_sec"] is not None:
        rows.append(("speed", f"{job['tokens_per_sec']:,.0f} tokens/s"))
    if job["eta_seconds"] is not None and job["status"] == "InProgress":
        rate = " at the current rate" if latest and latest.get("steps_per_second") else ""
        rows.append(("ETA", f"{timedelta(seconds=job['eta_seconds'])}{rate}"))
    return rows


def progress(state: dict[str, Any]) -> tuple[int, int | None]:
    """(step, max_steps) for a progress bar."""
    job = state["job"] or {}
    return int(job.get("step") or 0), job.get("max_steps")


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(name) for name, _ in rows), default=0)
    return [f"  {name:<{width}}  {value}" for name, value in rows if value]


def run_facts(session: Any, execution_arn: str) -> dict[str, Any]:
    """What `tp show <run>` prints: the run's request, estimate, decisions, jobs, model and end, from its history."""
    sfn = session.client("stepfunctions")
    described = sfn.describe_execution(executionArn=execution_arn)
    events = run_state.history(sfn, execution_arn)
    results = run_state.task_results(events)
    answer = run_state.validation(events) or {}
    return {
        "run": described["name"],
        "execution_arn": execution_arn,
        "status": described["status"],
        "started": _iso(described.get("startDate")),
        "stopped": _iso(described.get("stopDate")),
        "error": described.get("error"),
        "cause": described.get("cause"),
        "refusal": None if answer.get("valid", True) else answer.get("message"),
        "request": answer.get("request"),
        "estimate": run_state.estimate(results),
        "decisions": run_state.decisions(results),
        "training_jobs": run_state.training_jobs(events),
        "tuning_jobs": run_state.tuning_jobs(events),
        "batch_jobs": run_state.batch_jobs(events),
        "model_package": run_state.model_package(results),
        "goodput": run_state.finished_goodput(results),
    }


def run_lines(facts: dict[str, Any], in_words: BudgetWords) -> list[str]:
    """`tp show <run>`: a heading, then one fact a line."""
    request = facts["request"] or {}
    ended = f", ended {facts['stopped'][:19]}" if facts["stopped"] else ""
    lines = [f"run {facts['run']}: {facts['status']} (started {str(facts['started'])[:19]}{ended})"]
    rows: list[tuple[str, str]] = [("execution", facts["execution_arn"])]
    if request:
        spot = "spot" if request.get("spot") else "on demand"
        runtime = request.get("stopping_condition", {}).get("MaxRuntimeInSeconds", 0) / 3600
        rows += [
            ("requested by", str(request.get("requested_by") or "(not recorded)")),
            ("team", str(request.get("team") or "")),
            ("cluster", f"{request.get('cluster')} on {spot}, at most {runtime:g} h, backend {request.get('backend')}"),
            ("dataset", str((request.get("dataset") or {}).get("uri", ""))),
        ]
    if facts["estimate"]:
        cost = facts["estimate"]
        rows.append(
            ("estimate", f"at most ${cost['max_cost_usd']:,.2f} (approval threshold ${cost['threshold_usd']:,.2f})")
        )
        if cost.get("budget_warning"):
            rows.append(("budget", str(cost["budget_warning"])))
    for decision in facts["decisions"]:
        said = f"{decision['decision']} by {decision['by']} at {decision['decided_at'][:19]}: {decision['reason']}"
        rows.append((f"{decision['gate']} gate", said))
    jobs = facts["training_jobs"] + facts["tuning_jobs"] + facts["batch_jobs"]
    rows.append(("jobs", ", ".join(jobs) or "none yet"))
    if facts["goodput"] is not None:
        rows.append(("goodput", str(facts["goodput"]["summary"])))
    rows.append(("model", str(facts["model_package"] or "")))
    if facts["refusal"]:
        rows.append(("refused", in_words(str(facts["refusal"]), request.get("team"))))
    elif facts["status"] not in ("RUNNING", "SUCCEEDED"):
        rows.append(("ended", f"{facts['error']}: {in_words(str(facts['cause'] or ''), request.get('team'))}"))
    return lines + _aligned(rows)


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else (str(value) if value else None)

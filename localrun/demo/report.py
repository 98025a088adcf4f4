"""The run report of `make demo`: collect a finished run's facts, save its files, render them as markdown.

`collect` reads everything from the local platform while it is still open (the execution's
history, the jobs' logs and descriptions, the checkpoints in S3, the registered model and its
lineage, the IAM judgements); `save` writes the job logs, loss curves and lineage.json;
`render` turns the facts into report.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from contract import goodput
from contract.execution_state import JobCost
from contract.goodput import RunLedger
from contract.layout import split_s3_uri
from contract.metrics import TOKENS_PER_SEC, metric_series
from contract.model_folder import FINE_TUNED_FOLDER
from localrun.aws.cfn import REGION
from localrun.aws.engine import LocalPlatform
from localrun.aws.iam import Judgement
from localrun.backends.sagemaker import LocalTraining, cluster_of
from localrun.demo.jobs import Job, checkpoint_steps, interruptions, loss_curve, started_from
from tools.run_state import task_results
from training import stragglers

RUN_LOSS = "run-loss.png"
"""The chart of every job's loss of a run of several jobs (a retry, a tuning job's trials), beside report.md."""
RUN_TOKENS = "run-tokens.png"
"""The chart of every job's training throughput (tokens/s by step) across the run, beside report.md."""
LOOP_STATES = 4
"""A state entered again within this many states is a loop (polling): the terminal shows it once, the report's
states table gives each of its states one row."""


@dataclass
class Registration:
    """A registered model package and the lineage record Register wrote for it."""

    package_arn: str
    approval_status: str
    lineage_uri: str
    lineage: dict[str, Any]


@dataclass
class RoleCalls:
    """The calls one role made, each judged against that role's synthesized policies."""

    role: str
    calls: int
    actions: list[str]


@dataclass
class StandIn:
    """Something the local run scaled down: what the request asked for, and what ran here instead."""

    what: str
    requested: str
    local: str


@dataclass
class TrialRow:
    """One trial of a tuning job: its tuned hyperparameters, objective value (if it reported one) and status."""

    name: str
    hyperparameters: dict[str, str]
    objective: float | None
    status: str
    metric: str = ""
    """The objective's metric (e.g. validation:loss); "" when the trial reported none."""
    best: bool = False
    """The tuning job's best trial, as SageMaker names it (BestTrainingJob)."""


@dataclass
class Charge:
    """What one of the run's jobs cost once it ended, as its progress handler priced it: billed seconds at the list
    price per hour of its cluster, the estimate's (lambdas/sagemaker/monitor.py job_cost and its kin)."""

    job: str
    billed_seconds: int | None
    cost: JobCost
    jobs: int = 1
    """The training jobs the cost is of: a tuning job's billed trials."""


@dataclass
class RunFacts:
    """Everything the report says about one execution."""

    execution: str  # the execution's name
    status: str
    error: str | None
    cause: str | None
    states: list[tuple[str, float]]  # (state, seconds) in the order entered
    estimate: Any
    jobs: list[Job]
    registrations: list[Registration]
    decisions: list[dict[str, Any]]
    roles: list[RoleCalls]
    denials: list[Judgement]
    stand_ins: list[StandIn]
    trials: list[TrialRow]
    goodput: RunLedger | None = None
    charges: list[Charge] = field(default_factory=list)

    @property
    def actual_usd(self) -> float:
        """What the run's jobs cost together, at list price."""
        return round(sum(charge.cost.actual_usd for charge in self.charges), 4)


# -- collect -----------------------------------------------------------------------------------------
def collect(
    platform: LocalPlatform,
    training: LocalTraining,
    execution_arn: str,
    described: dict[str, Any],
    decisions: list[dict[str, Any]],
    *,
    stand_ins: list[StandIn],
) -> RunFacts:
    """The facts of a finished execution, read while the local platform is open."""
    history = platform.history(execution_arn)
    return RunFacts(
        execution=execution_arn.rsplit(":", 1)[-1],
        status=described["status"],
        error=described.get("error"),
        cause=described.get("cause"),
        states=durations(history),
        estimate=next((c.result for c in platform.lambda_calls if c.handler.startswith("lambdas.estimate")), None),
        jobs=[_job(platform, training, name) for name in platform.training_requests]
        + [job for player in platform.players.values() for job in player.job_facts()],
        registrations=_registrations(platform),
        decisions=decisions,
        roles=_roles(platform),
        denials=platform.iam.denials(),
        stand_ins=stand_ins,
        trials=_trials(platform.tuning.trial_summaries()),
        goodput=_goodput(platform, execution_arn),
        charges=charges(history),
    )


def charges(history: list[dict[str, Any]]) -> list[Charge]:
    """Each ended job's cost, from the progress polls' answers in the execution history (a job's last answer). A
    tuning job's is every trial's, summed (lambdas/tuning/handler.py); a team's service job's, every attempt's."""
    ended: dict[str, Charge] = {}
    for result in task_results(history):
        if not (result.get("finished") and result.get("cost") and "job_name" in result):
            continue
        tuning = result.get("tuning")
        job = f"{tuning['tuning_job']} ({tuning['trials_billed']} trials)" if tuning else str(result["job_name"])
        cost = JobCost.model_validate(result["cost"])
        ended[job] = Charge(job, result.get("billable_seconds"), cost, tuning["trials_billed"] if tuning else 1)
    return list(ended.values())


def _trials(summaries: list[dict[str, Any]]) -> list[TrialRow]:
    """Every trial of the run's tuning jobs, each tuning job's best marked as its description names it."""
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    tuning_jobs = dict.fromkeys(summary["TuningJobName"] for summary in summaries)
    described = (sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=t) for t in tuning_jobs)
    best = {d["BestTrainingJob"]["TrainingJobName"] for d in described if "BestTrainingJob" in d}
    rows = []
    for summary in summaries:
        objective = summary.get("FinalHyperParameterTuningJobObjectiveMetric", {})
        rows.append(
            TrialRow(
                name=summary["TrainingJobName"],
                hyperparameters=summary["TunedHyperParameters"],
                objective=objective.get("Value"),
                status=summary["TrainingJobStatus"],
                metric=objective.get("MetricName", ""),
                best=summary["TrainingJobName"] in best,
            )
        )
    return rows


def best_trials(trials: list[TrialRow]) -> list[str]:
    """Each tuning job's best trial in words: its name and objective value."""
    return [f"{t.name} ({t.metric} {t.objective:.4f})" for t in trials if t.best and t.objective is not None]


def _goodput(platform: LocalPlatform, execution_arn: str) -> RunLedger | None:
    """The run's goodput ledgers, as the progress handlers wrote them into its lineage (None: none written)."""
    requests = (c.event.get("request") for c in platform.lambda_calls if isinstance(c.event, dict))
    run = next((r["job_name_base"] for r in requests if isinstance(r, dict) and "job_name_base" in r), None)
    if run is None:
        return None
    bucket = platform.environment("Monitor")["ARTIFACTS_BUCKET"]
    ledgers = goodput.stored_ledgers(boto3.client("s3", region_name=REGION), bucket, run)
    return ledgers if ledgers.jobs else None


def durations(history: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(state, seconds) in the order entered, from the execution history's timestamps."""
    out: list[tuple[str, float]] = []
    open_state: tuple[str, datetime] | None = None
    for event in history:
        stamp = event["timestamp"]
        if event["type"].endswith("StateEntered"):
            if open_state:
                out.append((open_state[0], (stamp - open_state[1]).total_seconds()))
            open_state = (event["stateEnteredEventDetails"]["name"], stamp)
        elif event["type"].endswith("StateExited") and open_state:
            out.append((open_state[0], (stamp - open_state[1]).total_seconds()))
            open_state = None
    if open_state:
        out.append((open_state[0], 0.0))
    return out


def _job(platform: LocalPlatform, training: LocalTraining, name: str) -> Job:
    log = training.logs(name)
    train, val = loss_curve(log)
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    checkpoints_uri = platform.training_requests[name]["CheckpointConfig"]["S3Uri"]
    return Job(
        name=name,
        log=log,
        train_loss=train,
        val_loss=val,
        status=described["TrainingJobStatus"],
        secondary_status=described.get("SecondaryStatus"),
        failure=described.get("FailureReason"),
        notes=list(training.jobs[name].notes),
        transitions=[t["Status"] for t in described.get("SecondaryStatusTransitions", [])],
        metrics={m["MetricName"]: m["Value"] for m in described.get("FinalMetricDataList", [])},
        checkpoints_uri=checkpoints_uri,
        checkpoint_steps=checkpoint_steps(checkpoints_uri),
        model_folder=next(iter(sorted(training.root.glob(f"{name}/gen-*/*/model/{FINE_TUNED_FOLDER}"))[-1:]), None),
        cluster=cluster_of(platform.training_requests[name]),
    )


def _registrations(platform: LocalPlatform) -> list[Registration]:
    """The model packages in the group Register registers into, each with the lineage Register wrote."""
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    group = platform.environment("Register")["MODEL_PACKAGE_GROUP"]
    packages = sagemaker.list_model_packages(ModelPackageGroupName=group)["ModelPackageSummaryList"]
    registered = [c.result for c in platform.lambda_calls if c.handler.startswith("lambdas.register") and c.result]
    out = []
    for summary, registration in zip(packages, registered, strict=False):
        package = sagemaker.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
        lineage_uri = registration["lineage_uri"]
        bucket, key = split_s3_uri(lineage_uri)
        lineage = json.loads(boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read())
        out.append(
            Registration(
                package_arn=package["ModelPackageArn"],
                approval_status=package["ModelApprovalStatus"],
                lineage_uri=lineage_uri,
                lineage=lineage,
            )
        )
    return out


def _roles(platform: LocalPlatform) -> list[RoleCalls]:
    """Which role made how many calls, and which actions, by role name."""
    by_role: dict[str, list[Judgement]] = {}
    for judgement in platform.iam.judgements:
        by_role.setdefault(judgement.principal.split("/")[1], []).append(judgement)
    return [
        RoleCalls(role=role, calls=len(judgements), actions=sorted({j.action for j in judgements}))
        for role, judgements in sorted(by_role.items())
    ]


# -- save --------------------------------------------------------------------------------------------
def save(facts: RunFacts, run_dir: Path) -> None:
    """Each job's log and loss curve (`<job>.log`, `<job>-loss.png`) and the lineage record (lineage.json)."""
    for job in facts.jobs:
        (run_dir / f"{job.name}.log").write_text(job.log)
        if job.train_loss:
            _plot(job, facts.stand_ins, run_dir / f"{job.name}-loss.png")
    if len(curves := [job for job in facts.jobs if job.train_loss]) > 1:
        _plot_run(curves, {trial.name for trial in facts.trials if trial.best}, run_dir / RUN_LOSS)
    if rates := throughputs(facts.jobs):
        _plot_tokens(rates, run_dir / RUN_TOKENS)
    for registration in facts.registrations:
        (run_dir / "lineage.json").write_text(json.dumps(registration.lineage, indent=2, sort_keys=True))


def _plot(job: Job, stand_ins: list[StandIn], path: Path) -> None:
    """The loss curves, a red line where the job was interrupted and a green one at the step it resumed from,
    and the local stand-ins below."""
    import matplotlib  # noqa: PLC0415 - the backend must be chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(7, 4 + 0.2 * len(stand_ins)), dpi=110)
    if job.train_loss:
        axes.plot(*zip(*job.train_loss, strict=True), label="train loss")
    if job.val_loss:
        axes.plot(*zip(*job.val_loss, strict=True), "o-", label="validation loss")
    for number, (interrupted, resumed) in enumerate(interruptions(job.log)):
        first = number == 0
        axes.axvline(interrupted, color="tab:red", linestyle="--", label="interrupted" if first else None)
        axes.axvline(resumed, color="tab:green", linestyle=":", label="resumed from checkpoint" if first else None)
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.set_title(job.name)
    axes.grid(alpha=0.3)
    axes.legend()
    if stand_ins:
        text = "Local stand-ins (requested -> run here):\n" + "\n".join(_stand_in_line(s) for s in stand_ins)
        figure.text(0.01, 0.01, text, fontsize=7, va="bottom", family="monospace")
        figure.tight_layout(rect=(0, 0.04 + 0.045 * len(stand_ins), 1, 1))
    else:
        figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _plot_run(jobs: list[Job], best: set[str], path: Path) -> None:
    """Every job's loss curves on one chart, by step, each job in its own colour; a tuning job's best trial bold."""
    with _chart(path, title=f"Loss across the run's {len(jobs)} jobs", ylabel="loss (nats/token)") as axes:
        for job in jobs:
            width, label = (2.5, f"{job.name} (best trial)") if job.name in best else (1.2, job.name)
            (line,) = axes.plot(*zip(*job.train_loss, strict=True), linewidth=width, label=f"{label}: train")
            if job.val_loss:
                axes.plot(*zip(*job.val_loss, strict=True), "o--", color=line.get_color(), label=f"{label}: validation")


@contextlib.contextmanager
def _chart(path: Path, *, title: str, ylabel: str) -> Iterator[Any]:
    """The axes of a chart by step, saved to `path` once the block has drawn on them."""
    import matplotlib  # noqa: PLC0415 - as in _plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=110)
    try:
        yield axes
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
        figure.tight_layout()
        figure.savefig(path)
    finally:
        plt.close(figure)


def throughputs(jobs: list[Job]) -> dict[str, list[tuple[int, float]]]:
    """Each job's training throughput, (step, tokens/s) as its log reported it; jobs that reported none left out."""
    rates = {job.name: sorted(metric_series(job.log).get(TOKENS_PER_SEC, {}).items()) for job in jobs}
    return {name: series for name, series in rates.items() if series}


def _plot_tokens(rates: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Every job's tokens/s by step on one chart, each job in its own colour."""
    title = f"Training throughput across the run's {len(rates)} job{'s' if len(rates) != 1 else ''}"
    with _chart(path, title=title, ylabel="tokens/s (all hosts)") as axes:
        for name, series in rates.items():
            axes.plot(*zip(*series, strict=True), marker=".", linewidth=1.2, label=name)
        axes.set_ylim(bottom=0)


def _render_throughput(jobs: list[Job]) -> list[str]:
    if not (rates := throughputs(jobs)):
        return []
    lines = [
        "",
        "## Throughput",
        "",
        f"![tokens/s across the run's jobs]({RUN_TOKENS})",
        "",
        "| Job | Steps reported | Median tokens/s | Last tokens/s |",
        "| --- | --- | --- | --- |",
    ]
    for name, series in rates.items():
        median = statistics.median(value for _, value in series)
        lines.append(f"| {name} | {len(series)} | {median:,.0f} | {series[-1][1]:,.0f} |")
    return lines


def _stand_in_line(stand_in: StandIn) -> str:
    return f"{stand_in.what}: {stand_in.requested} -> {stand_in.local}"


# -- render ------------------------------------------------------------------------------------------
def render(facts: RunFacts, run_dir: Path) -> str:
    """report.md: outcome, states, estimate, jobs, registered model, decisions, IAM."""
    lines = [f"# Training run report: {facts.execution}", "", f"Outcome: **{facts.status}**"]
    if facts.status != "SUCCEEDED":
        lines.append(f"Error: `{facts.error}`; cause: {facts.cause}")
    if cluster_outcomes := clusters(facts.jobs):
        lines.append(f"Clusters (as requested; the local stand-ins below ran them): {cluster_outcomes}")
    lines += _render_states(facts.states)
    lines += _render_stand_ins(facts.stand_ins)
    if facts.estimate:
        lines += ["", "## Cost estimate", "", "```json", json.dumps(facts.estimate, indent=2), "```"]
    lines += _render_charges(facts)
    lines += _render_trials(facts.trials)
    if len([job for job in facts.jobs if job.train_loss]) > 1:
        lines += ["", "## Loss across the run's jobs", "", f"![loss across the run's jobs]({RUN_LOSS})"]
    lines += _render_throughput(facts.jobs)
    if facts.goodput is not None:
        lines += render_goodput(facts.goodput)
    for job in facts.jobs:
        lines += _render_job(job, run_dir)
    for registration in facts.registrations:
        lines += ["", "## Registered model", "", f"{registration.package_arn}: **{registration.approval_status}**"]
        lineage = json.dumps(registration.lineage, indent=2, sort_keys=True)
        lines += [f"Lineage ({registration.lineage_uri}):", "", "```json", lineage, "```"]
    for decision in facts.decisions:
        who = f"{decision.get('decision')} by {decision.get('by')}"
        lines.append(f"\nDecision on {decision.get('gate')}: {who}: {decision.get('reason')}")
    lines += _render_iam(facts)
    return "\n".join(lines)


def compact_states(states: list[tuple[str, float]]) -> list[tuple[str, int, float]]:
    """(state, times entered, seconds in all) in the order entered: the states of a loop entered again and again
    (a poll: wait, check, finished?) are each one row, with the times and seconds of every pass."""
    names = [name for name, _ in states]
    rows: list[tuple[str, int, float]] = []
    i = 0
    while i < len(states):
        length = next((n for n in range(1, LOOP_STATES + 1) if names[i : i + n] == names[i + n : i + 2 * n]), 1)
        passes = 1
        while names[i + passes * length : i + (passes + 1) * length] == names[i : i + length]:
            passes += 1
        entered = passes * length
        while (
            i + entered < len(states)
            and entered < (passes + 1) * length
            and names[i + entered] == names[i + entered - length]
        ):
            entered += 1  # the last pass left the loop part of the way through
        for k in range(length):
            own = states[i + k : i + entered : length]
            rows.append((names[i + k], len(own), sum(seconds for _, seconds in own)))
        i += entered
    return rows


def clusters(jobs: list[Job]) -> str:
    """The clusters the run's jobs asked for, in order, each with what its jobs came to: `2 x ml.p5.48xlarge:
    failed (CapacityError); 4 x ml.p4d.24xlarge: completed`."""
    outcomes: dict[str, dict[str, int]] = {}
    for job in jobs:
        if job.cluster:
            outcome = status_words(job.status) + (f" ({job.failure.split(':', 1)[0]})" if job.failure else "")
            counted = outcomes.setdefault(job.cluster, {})
            counted[outcome] = counted.get(outcome, 0) + 1
    return "; ".join(
        f"{cluster}: " + ", ".join(f"{n} {o}" if n > 1 else o for o, n in counted.items())
        for cluster, counted in outcomes.items()
    )


def _render_states(states: list[tuple[str, float]]) -> list[str]:
    rows = compact_states(states)
    lines = ["", "## States", ""]
    if len(rows) < len(states):
        lines += [f"{len(states)} states entered; a loop's states (polling) are one row each, with how often.", ""]
    lines += ["| State | Entered | Seconds |", "| --- | --- | --- |"]
    return lines + [f"| {name} | {times} | {seconds:.2f} |" for name, times, seconds in rows]


def render_goodput(ledgers: RunLedger) -> list[str]:
    """Where the run's billed time went: each job's parts, and the run's goodput."""
    lines = [
        "",
        "## Goodput",
        "",
        f"Goodput: {ledgers.summary()}",
        "",
        "Each job's parts (seconds of the job's cluster; contract/goodput.py says what each part holds):",
        "",
        "| Job | Instances | Billed s | " + " | ".join(goodput.PARTS) + " | Goodput |",
        "| --- | --- | --- | " + " | ".join("---" for _ in goodput.PARTS) + " | --- |",
    ]
    for job in ledgers.jobs:
        parts = " | ".join(f"{job.parts[p]:.1f}" for p in goodput.PARTS)
        lines.append(f"| {job.job} | {job.instances} | {job.billed_seconds:.1f} | {parts} | {100 * job.goodput:.1f}% |")
    return lines


def _render_charges(facts: RunFacts) -> list[str]:
    if not facts.charges:
        return []
    lines = [
        "",
        "## Actual cost",
        "",
        f"{usd(facts.actual_usd)} at list price: each job's billed seconds at the price per hour of its cluster that "
        "the estimate uses, as the progress handlers priced it when the job ended (the lineage's and the cost "
        "metrics' figures).",
        "",
        "| Job | Billed s | Actual | On demand | Spot savings |",
        "| --- | --- | --- | --- | --- |",
    ]
    for charge in facts.charges:
        cost = charge.cost
        billed = "-" if charge.billed_seconds is None else str(charge.billed_seconds)
        lines.append(
            f"| {charge.job} | {billed} | {usd(cost.actual_usd)} | {usd(cost.on_demand_usd)} "
            f"| {usd(cost.spot_savings_usd)} |"
        )
    return lines


def usd(amount: float) -> str:
    """Dollars, to the cent; below a dollar (a local run's seconds) to a hundredth of a cent."""
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4f}"


def _render_stand_ins(stand_ins: list[StandIn]) -> list[str]:
    if not stand_ins:
        return ["", "## Local stand-ins", "", "None: this machine ran the request as given."]
    lines = [
        "",
        "## Local stand-ins",
        "",
        "What this machine ran in place of the request (the request, the job and the lineage keep the input's values).",
        "",
        "| What | Requested | Run here |",
        "| --- | --- | --- |",
    ]
    return lines + [f"| {s.what} | {s.requested} | {s.local} |" for s in stand_ins]


def _render_trials(trials: list[TrialRow]) -> list[str]:
    if not trials:
        return []
    lines = [
        "",
        "## Tuning trials",
        "",
        *(f"Best trial: {best}\n" for best in best_trials(trials)),
        "| Trial | Hyperparameters | Objective | Status |",
        "| --- | --- | --- | --- |",
    ]
    for trial in trials:
        tuned = ", ".join(f"{k}={v}" for k, v in sorted(trial.hyperparameters.items()))
        objective = "-" if trial.objective is None else f"{trial.objective:.4f}"
        lines.append(f"| {trial.name} | {tuned} | {objective} | {status_words(trial.status)} |")
    return lines


def status_words(status: str) -> str:
    """A service's status enum as words: SUCCEEDED -> succeeded, InProgress -> in progress."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", status).replace("_", " ").lower()


def _render_job(job: Job, run_dir: Path) -> list[str]:
    lines = ["", f"## Training job {job.name}", "", f"Log: `{run_dir / (job.name + '.log')}`"]
    if job.train_loss:
        lines += [
            f"Loss curve: ![loss]({job.name}-loss.png)",
            f"First/last train loss: {job.train_loss[0][1]:.4f} -> {job.train_loss[-1][1]:.4f}",
        ]
    status = status_words(job.status)
    if job.secondary_status and job.secondary_status != job.status:
        status += f" ({status_words(job.secondary_status)})"
    lines.append(f"Status: {status}")
    if job.cluster:
        lines.append(f"Cluster: {job.cluster}")
    if job.failure:
        lines.append(f"Failure: {job.failure}")
    lines += [f"Note: {note}" for note in job.notes]
    if job.secondary_status is not None:
        lines.append(f"Secondary statuses: {' -> '.join(job.transitions)}")
    if (start := started_from(job.log)) is not None:
        lines.append(f"Started from the checkpoint of step {start}")
    for interrupted, resumed in interruptions(job.log):
        lines.append(f"Interrupted after step {interrupted}; resumed from the checkpoint of step {resumed}")
    lines += [f"Straggler: {straggler}" for straggler in stragglers.named(job.log)]
    if job.metrics:
        lines += ["Final metrics (MetricDefinitions on the log):", ""]
        lines += [f"- `{k}` = {v}" for k, v in sorted(job.metrics.items())]
    lines.append(f"Checkpoints in {job.checkpoints_uri}: steps {job.checkpoint_steps}")
    if job.model_folder is not None:
        files = ", ".join(sorted(p.name for p in job.model_folder.iterdir()))
        lines.append(
            f"Fine-tuned model folder: `{job.model_folder}` ({files}); "
            "`transformers.AutoModelForCausalLM.from_pretrained` loads it"
        )
    return lines


def _render_iam(facts: RunFacts) -> list[str]:
    lines = [
        "",
        "## IAM, enforced",
        "",
        "Every AWS call of the handlers, the state machine and the training job was signed by the role AWS",
        "would use and judged against that role's policies in the synthesized templates.",
        "",
        "| Role | Calls | Actions |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {r.role} | {r.calls} | {', '.join(r.actions)} |" for r in facts.roles]
    lines.append(f"\nDenied: {len(facts.denials)}")
    lines += [f"- {j.principal}: {j.action} on {j.resource} ({j.reason})" for j in facts.denials]
    return lines


# -- teams (localrun/demo/cli.py run_scenario) -----------------------------------------------------------------
@dataclass
class TeamAttempt:
    """One attempt of a run's service job: its training job, its log and train losses by step."""

    name: str
    log: str
    losses: dict[int, float]
    status_reason: str
    preempted: bool


@dataclass
class TeamRun:
    """One run of a teams scenario: who started it for which team, how it ended, and its time in the queue."""

    id: str
    team: str
    requester: str
    execution: str
    status: str
    expected: str
    error: str | None
    cause: str | None
    queue_wait_seconds: float | None
    """From submission to its first training job; None when it never reached the queue."""
    service_job_status: str | None
    jobs: list[TeamAttempt]
    first_started_ms: int | None = None
    """When the scheduler first gave its service job capacity (epoch ms)."""
    ended_ms: int | None = None
    """When its service job ended (epoch ms)."""
    twin_of: str | None = None
    twin_matches: bool | None = None
    twin_note: str = ""
    charges: list[Charge] = field(default_factory=list)
    """What its jobs cost once they ended, as its progress handler priced them (`charges`)."""

    @property
    def as_expected(self) -> bool:
        return self.status == self.expected

    @property
    def preemptions(self) -> int:
        return sum(1 for job in self.jobs if job.preempted)


def render_teams(runs: list[TeamRun], scheduler_log: list[str], denials: list[Judgement]) -> str:
    """report.md of a teams scenario: each run's team, outcome, queue wait and preemptions; the scheduler's log."""
    lines = [
        "# Teams scenario report",
        "",
        "| Run | Team | Requester | Outcome | Expected | Queue wait | Preemptions | Attempts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        wait = "-" if run.queue_wait_seconds is None else f"{run.queue_wait_seconds:.1f} s"
        who = run.requester.rsplit("/", 1)[-1]
        lines.append(
            f"| {run.id} | {run.team} | {who} | {status_words(run.status)} | {status_words(run.expected)} | {wait} "
            f"| {run.preemptions} | {len(run.jobs)} |"
        )
    lines += _render_teams_cost_and_loss(runs)
    for run in runs:
        lines += ["", f"## {run.id}", "", f"Execution: `{run.execution}`"]
        if run.status != "SUCCEEDED":
            lines.append(f"Error: `{run.error}`; cause: {run.cause}")
        if run.service_job_status is not None:
            lines.append(f"Service job: {status_words(run.service_job_status)}")
        for number, job in enumerate(run.jobs, start=1):
            losses = f"steps {min(job.losses)}-{max(job.losses)}" if job.losses else "no steps"
            ended = f"; {job.status_reason}" if job.status_reason else ""
            lines.append(f"- attempt {number}: training job `{job.name}` ({losses}{ended})")
            if (start := started_from(job.log)) is not None:
                lines.append(f"  - resumed from the checkpoint of step {start}")
            lines += [f"  - interrupted after step {i}; resumed from step {r}" for i, r in interruptions(job.log)]
        if run.twin_of is not None:
            verdict = "identical" if run.twin_matches else "NOT identical"
            lines.append(f"Uninterrupted twin of {run.twin_of}: losses after the resume {verdict}: {run.twin_note}")
    lines += ["", "## The queue's scheduler", "", "```", *scheduler_log, "```"]
    lines += ["", f"## Denied by IAM: {len(denials)}", ""]
    lines += [f"- {j.principal}: {j.action} on {j.resource} ({j.reason})" for j in denials]
    return "\n".join(lines)


def team_loss_chart(team: str) -> str:
    """The file name of a team's loss chart, beside the teams report."""
    return f"team-{team}-loss.png"


def _by_team(runs: list[TeamRun]) -> dict[str, list[TeamRun]]:
    teams: dict[str, list[TeamRun]] = {}
    for run in runs:
        teams.setdefault(run.team, []).append(run)
    return teams


def save_teams(runs: list[TeamRun], run_dir: Path) -> None:
    """Each team's loss chart: the train loss of every attempt of each of its runs, by step."""
    for team, members in _by_team(runs).items():
        attempts = [(run, number, job) for run in members for number, job in enumerate(run.jobs, 1) if job.losses]
        if not attempts:
            continue
        title = f"Team {team}: loss of its runs' jobs"
        with _chart(run_dir / team_loss_chart(team), title=title, ylabel="train loss (nats/token)") as axes:
            for run, number, job in attempts:
                steps = sorted(job.losses)
                label = f"{run.id} attempt {number}" + (" (preempted)" if job.preempted else "")
                axes.plot(steps, [job.losses[step] for step in steps], linewidth=1.2, label=label)


def _render_teams_cost_and_loss(runs: list[TeamRun]) -> list[str]:
    """Each team's actual cost (its runs' ended jobs at list price) and its loss chart."""
    lines = [
        "",
        "## Cost and loss by team",
        "",
        "Actual cost: each ended job's billed seconds at the list price of its cluster, as the progress handler "
        "priced it (the figure the team's cost metrics and its runs' lineage record). A service job is one billed "
        "job, its attempts (a preempted one and its resume) together.",
        "",
        "| Team | Runs | Billed jobs | Actual cost |",
        "| --- | --- | --- | --- |",
    ]
    teams = _by_team(runs)
    for team, members in teams.items():
        billed = sum(charge.jobs for run in members for charge in run.charges)
        cost = round(sum(charge.cost.actual_usd for run in members for charge in run.charges), 4)
        lines.append(f"| {team} | {len(members)} | {billed} | {usd(cost)} |")
    for team, members in teams.items():
        if any(job.losses for run in members for job in run.jobs):
            lines += ["", f"![team {team}: loss]({team_loss_chart(team)})"]
    return lines


def teams_summary(runs: list[TeamRun]) -> list[str]:
    """Each run in one line: outcome against what was expected, queue wait, preemptions, the twin's verdict."""
    lines = []
    for run in runs:
        mark = "ok " if run.as_expected and run.twin_matches is not False else "!! "
        wait = "" if run.queue_wait_seconds is None else f", queued {run.queue_wait_seconds:.1f} s"
        preempted = f", preempted {run.preemptions}x" if run.preemptions else ""
        outcome = run.status if run.status == "SUCCEEDED" else f"{run.status} ({run.error})"
        twin = f"; {run.twin_note}" if run.twin_of else ""
        lines.append(f"{mark}{run.id} [{run.team}]: {outcome}, expected {run.expected}{wait}{preempted}{twin}")
    return lines

"""The run report of `make demo`: collect a finished run's facts, save its files, render them as markdown.

`collect` reads everything from the local platform while it is still open (the execution's
history, the jobs' logs and descriptions, the checkpoints in S3, the registered model and its
lineage, the IAM judgements); `save` writes the job logs, loss curves and lineage.json;
`render` turns the facts into report.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from localrun.cfn import REGION
from localrun.engine import LocalPlatform
from localrun.iam import Judgement
from localrun.jobs import Job, checkpoint_steps, loss_curve
from localrun.sagemaker_local import LocalTraining
from training.layout import split_s3_uri


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


# -- collect -----------------------------------------------------------------------------------------
def collect(
    platform: LocalPlatform,
    training: LocalTraining,
    execution_arn: str,
    described: dict[str, Any],
    decisions: list[dict[str, Any]],
) -> RunFacts:
    """The facts of a finished execution, read while the local platform is open."""
    return RunFacts(
        execution=execution_arn.rsplit(":", 1)[-1],
        status=described["status"],
        error=described.get("error"),
        cause=described.get("cause"),
        states=durations(platform.history(execution_arn)),
        estimate=next((c.result for c in platform.lambda_calls if c.handler.startswith("lambdas.estimate")), None),
        jobs=[_job(platform, training, name) for name in platform.training_requests]
        + [job for player in platform.players.values() for job in player.job_facts()],
        registrations=_registrations(platform),
        decisions=decisions,
        roles=_roles(platform),
        denials=platform.iam.denials(),
    )


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
            _plot(job.train_loss, job.val_loss, run_dir / f"{job.name}-loss.png", job.name)
    for registration in facts.registrations:
        (run_dir / "lineage.json").write_text(json.dumps(registration.lineage, indent=2, sort_keys=True))


def _plot(train: list[tuple[int, float]], val: list[tuple[int, float]], path: Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415 - the backend must be chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        axes.plot(*zip(*train, strict=True), label="train loss")
    if val:
        axes.plot(*zip(*val, strict=True), "o-", label="validation loss")
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


# -- render ------------------------------------------------------------------------------------------
def render(facts: RunFacts, run_dir: Path) -> str:
    """report.md: outcome, states, estimate, jobs, registered model, decisions, IAM."""
    lines = [f"# Training run report: {facts.execution}", "", f"Outcome: **{facts.status}**"]
    if facts.status != "SUCCEEDED":
        lines.append(f"Error: `{facts.error}`; cause: {facts.cause}")
    lines += ["", "## States", "", "| State | Seconds |", "| --- | --- |"]
    lines += [f"| {name} | {seconds:.2f} |" for name, seconds in facts.states]
    if facts.estimate:
        lines += ["", "## Cost estimate", "", "```json", json.dumps(facts.estimate, indent=2), "```"]
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


def _render_job(job: Job, run_dir: Path) -> list[str]:
    lines = ["", f"## Training job {job.name}", "", f"Log: `{run_dir / (job.name + '.log')}`"]
    if job.train_loss:
        lines += [
            f"Loss curve: ![loss]({job.name}-loss.png)",
            f"First/last train loss: {job.train_loss[0][1]:.4f} -> {job.train_loss[-1][1]:.4f}",
        ]
    lines.append(f"Status: {job.status} ({job.secondary_status})")
    if job.failure:
        lines.append(f"Failure: {job.failure}")
    lines += [f"Note: {note}" for note in job.notes]
    lines.append(f"Secondary statuses: {' -> '.join(job.transitions)}")
    if job.metrics:
        lines += ["Final metrics (MetricDefinitions on the log):", ""]
        lines += [f"- `{k}` = {v}" for k, v in sorted(job.metrics.items())]
    lines.append(f"Checkpoints in {job.checkpoints_uri}: steps {job.checkpoint_steps}")
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

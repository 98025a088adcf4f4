"""`make demo INPUT=examples/teams.json`: a teams scenario (localrun/scenario.py) on one local platform.

The platform is synthesized with the scenario's settings (its teams' queue and quota shares), the teams'
members are made local IAM roles, and each step is carried out when its condition holds: a run is started by
its member (its start proof signed by a session of that role) and followed to its end through the team queue,
whose scheduler (localrun/service_jobs.py) the terminal shows line by line; a budget stop attaches the team's
deny policy as AWS Budgets would. The report says, per run, its team, queue wait and preemptions, and compares
a preempted run's losses after its resume with those of its uninterrupted twin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from lambdas.backends import BACKENDS
from localrun import report
from localrun.clock import Clock
from localrun.demo import (
    DEMO_APPROVER,
    DEMO_RECIPIENT,
    LOOP_STATES,
    _answer_gates,
    _engine_quiet,
    _local_hyperparameters,
    _Printer,
    _quiet,
    _say,
    _seed_datasets,
    synthesize,
)
from localrun.engine import LocalPlatform
from localrun.jobs import loss_curve
from localrun.sagemaker_local import LocalTraining
from localrun.scenario import After, Run, Scenario, ScenarioError
from localrun.service_jobs import ServiceJob
from training.metrics import parse_line

EXECUTION_TAG = "execution"
"""The service job's tag naming its execution (lambdas/validate/api_requests.py EXECUTION_TAG)."""


@dataclass
class ScenarioOutcome:
    runs: list[report.TeamRun]
    report: Path

    @property
    def as_expected(self) -> bool:
        """Every run ended as its step expects, and every twin's losses matched."""
        return all(r.as_expected and r.twin_matches is not False for r in self.runs)


class _Driver:
    """The scenario's runs on one platform: starts them, follows them, answers their gates."""

    def __init__(self, platform: LocalPlatform, training: LocalTraining, *, approver: str, verbose: bool) -> None:
        self.platform, self.training, self.approver, self.verbose = platform, training, approver, verbose
        self.arns: dict[str, str] = {}
        self.runs: dict[str, Run] = {}
        self.decisions: dict[str, list[dict[str, Any]]] = {}
        self.seen: dict[str, int] = {}
        self.recent: dict[str, list[str]] = {}
        self.queue_states: dict[str, tuple[str, str] | None] = {}
        """Run -> its service job's status and reason as last shown (a waiting job's reason is shown as it changes)."""
        self.steps: dict[str, int] = {}
        """Training job name -> the last step its log reported."""
        self.started = time.monotonic()
        self.printer = _Printer(verbose=verbose)

    # -- what the terminal shows ------------------------------------------------------------------
    def training_line(self, job: str, line: str) -> None:
        step, values = parse_line(line) or (0, {})
        if values:
            self.steps[job] = max(self.steps.get(job, 0), step)
        self.printer.training_line(self.label(job), line)

    def label(self, training_job: str) -> str:
        """A training job as the terminal names it: its run and attempt."""
        jobs = self.platform.service_jobs.jobs.values() if self.platform.service_jobs else []
        for job in list(jobs):
            for number, attempt in enumerate(job.attempts, start=1):
                if attempt.training_job == training_job:
                    return f"{self.run_of(job) or job.name} attempt {number}"
        return training_job

    def queue_line(self, line: str) -> None:
        _say(f"[{time.monotonic() - self.started:6.1f}s] queue: {line}")

    def follow(self) -> None:
        """Bring the queue up to date (Batch schedules on its own, not when asked), print new states, answer gates."""
        assert self.platform.service_jobs is not None
        self.platform.service_jobs.advance()
        for run_id, arn in self.arns.items():
            entered = self.platform.states_entered(arn)
            for name in entered[self.seen.get(run_id, 0) :]:
                recent = self.recent.setdefault(run_id, [])
                if self.verbose or name not in recent:
                    _say(f"[{time.monotonic() - self.started:6.1f}s] {run_id} > {name}")
                self.recent[run_id] = [*recent, name][-LOOP_STATES:]
            self.seen[run_id] = len(entered)
            job = self.service_job(run_id)
            said = (job.status, job.status_reason) if job is not None else None
            if job is not None and said != self.queue_states.get(run_id) and job.status == "RUNNABLE":
                _say(f"[{time.monotonic() - self.started:6.1f}s] {run_id} queued: {job.status_reason}")
            self.queue_states[run_id] = said
            self.decisions.setdefault(run_id, []).extend(
                _answer_gates(
                    self.platform,
                    arn,
                    approver=self.approver,
                    auto_approve=True,
                    reject=None,
                    verbose=self.verbose,
                    before=lambda: None,
                )
            )

    # -- the steps ----------------------------------------------------------------------------------
    def service_job(self, run_id: str) -> ServiceJob | None:
        """The run's service job (the latest it submitted), by its execution tag."""
        assert self.platform.service_jobs is not None
        arn = self.arns[run_id]
        mine = [
            j for j in self.platform.service_jobs.jobs.values() if j.request.get("tags", {}).get(EXECUTION_TAG) == arn
        ]
        return mine[-1] if mine else None

    def run_of(self, job: ServiceJob) -> str | None:
        arn = job.request.get("tags", {}).get(EXECUTION_TAG)
        return next((run_id for run_id, a in self.arns.items() if a == arn), None)

    def ended(self, run_id: str) -> bool:
        return str(self.platform.sfn.describe_execution(executionArn=self.arns[run_id])["status"]) != "RUNNING"

    def holds(self, after: After, since: float) -> bool:
        if after.condition is None:
            return time.monotonic() - since >= after.seconds
        assert after.run is not None
        if after.condition == "ended":
            return self.ended(after.run)
        job = self.service_job(after.run)
        if job is None:
            return False
        if after.condition == "started":
            return job.status == "RUNNING"
        if after.condition == "queued":
            return job.status == "RUNNABLE"
        return bool(job.attempts) and self.steps.get(job.attempts[-1].training_job, 0) >= after.step

    def wait_for(self, after: After, deadline: float) -> None:
        since = time.monotonic()
        while not self.holds(after, since):
            self.follow()
            if after.run is not None and after.condition != "ended" and self.ended(after.run):
                ended = self.platform.sfn.describe_execution(executionArn=self.arns[after.run])
                raise ScenarioError(
                    f"{after.run} ended {ended['status']} before the next step's condition held ({after.describe()}): "
                    f"{ended.get('error')}: {ended.get('cause')}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scenario's time limit passed waiting {after.describe()}")
            time.sleep(0.3)

    def start(self, run: Run) -> None:
        name = f"{run.id}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        execution_input = {"notify": [DEMO_RECIPIENT], **run.input}
        self.arns[run.id] = self.platform.start(execution_input, name=name, requester=run.principal)
        self.runs[run.id] = run
        who = run.principal.rsplit("/", 1)[-1]
        _say(f"[{time.monotonic() - self.started:6.1f}s] {run.id}: started by {who} as team {run.input.get('team')}")

    def budget_stop(self, team: str) -> None:
        """What AWS Budgets does at 100% of the team's actual spend: attach its deny policy to the action's roles."""
        definition = team_budget_action(self.platform, team)
        iam = boto3.client("iam", region_name="us-east-1")
        for role in definition["Roles"]:
            iam.attach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])
        roles = ", ".join(definition["Roles"])
        _say(f"[{time.monotonic() - self.started:6.1f}s] budget stop: team {team}'s budget is spent; deny on {roles}")


def team_budget_action(platform: LocalPlatform, team: str) -> dict[str, Any]:
    """The team's budget action's IAM action definition (stacks/constructs/cost_controls.py TeamBudget), resolved."""
    for stack, logical, action in platform.assembly.resources("AWS::Budgets::BudgetsAction"):
        if f"/TeamBudget-{team}/" in platform.assembly.construct_paths[stack].get(logical, ""):
            props = platform.resolver.resolve(stack, action["Properties"])
            definition: dict[str, Any] = props["Definition"]["IamActionDefinition"]
            return definition
    raise ScenarioError(f"the synthesized platform has no budget action for team {team}")


def run_scenario(
    scenario: Scenario,
    *,
    out: Path,
    assembly: Path | None = None,
    approver: str = DEMO_APPROVER,
    wait_seconds: float = 2.0,
    timeout_seconds: float = 900.0,
    verbose: bool = False,
) -> ScenarioOutcome:
    """Synthesize with the scenario's settings (unless given an assembly), carry out its steps, write the report."""
    missing = sorted({str(r.input.get("backend", "sagemaker")) for r in scenario.runs} - set(BACKENDS))
    if missing:
        raise ScenarioError(f"the scenario's runs ask for backends {missing}, which lambdas/backends does not register")
    out.mkdir(parents=True, exist_ok=True)
    detail: Callable[[str], None] = _say if verbose else _quiet
    assembly = assembly or synthesize(out, detail, settings=scenario.settings)
    run_dir = out / f"teams-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    training = LocalTraining(root=run_dir / "jobs", datasets_bucket="", max_hosts=1)
    clock = Clock(wait_scale=wait_seconds / 300, retry_scale=0.01)
    handler_log = (run_dir / "handlers.log").open("w")
    deadline = time.monotonic() + timeout_seconds
    with (
        handler_log,
        _engine_quiet(not verbose),
        LocalPlatform(assembly, training=training, clock=clock, handler_log=handler_log) as platform,
    ):
        if platform.service_jobs is None:
            raise ScenarioError("the synthesized platform has no team queue: the settings need teams and capacity")
        driver = _Driver(platform, training, approver=approver, verbose=verbose)
        training.on_line = driver.training_line
        platform.service_jobs.on_line = driver.queue_line
        training.datasets_bucket = platform.environment("Validate")["DATASETS_BUCKET"]
        for run in scenario.runs:
            _seed_datasets(platform, run.input, out / "corpus", detail)
            platform.person(run.principal)  # the member's role, as the account's SSO would have it
        # Every run is tiny: its hyperparameters run as given unless one asks for more than this machine trains.
        training.local_hyperparameters = _local_hyperparameters(scenario.runs[0].input, None, detail)
        try:
            for step in scenario.steps:
                driver.wait_for(step.after, deadline)
                if step.run is not None:
                    driver.start(step.run)
                elif step.budget_stop is not None:
                    driver.budget_stop(step.budget_stop)
            while not all(driver.ended(run_id) for run_id in driver.arns):
                driver.follow()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"runs still going after {timeout_seconds:.0f} s")
                time.sleep(0.3)
            driver.follow()
        finally:
            training.stop_all()
        runs = [_team_run(driver, run_id) for run_id in driver.arns]
        _compare_twins(runs)
        log = list(platform.service_jobs.log)
        denials = platform.iam.denials()
    text = report.render_teams(runs, log, denials)
    path = run_dir / "report.md"
    path.write_text(text + "\n")
    for team_run in runs:
        for job in team_run.jobs:
            (run_dir / f"{job.name}.log").write_text(job.log)
    _say("")
    for line in report.teams_summary(runs):
        _say(line)
    _say(f"report:        {path}")
    return ScenarioOutcome(runs=runs, report=path)


def _team_run(driver: _Driver, run_id: str) -> report.TeamRun:
    platform, run = driver.platform, driver.runs[run_id]
    described = platform.sfn.describe_execution(executionArn=driver.arns[run_id])
    job = driver.service_job(run_id)
    jobs = []
    for attempt in job.attempts if job is not None else []:
        log = driver.training.logs(attempt.training_job) if attempt.training_job in driver.training.jobs else ""
        train, _ = loss_curve(log)
        jobs.append(
            report.TeamAttempt(attempt.training_job, log, dict(train), attempt.status_reason, attempt.preempted)
        )
    return report.TeamRun(
        id=run_id,
        team=str(run.input.get("team")),
        requester=run.principal,
        execution=driver.arns[run_id],
        status=described["status"],
        expected=run.expect,
        error=described.get("error"),
        cause=described.get("cause"),
        queue_wait_seconds=(
            (job.attempts[0].started_at - job.created_at) / 1000 if job is not None and job.attempts else None
        ),
        service_job_status=job.status if job is not None else None,
        jobs=jobs,
        first_started_ms=job.attempts[0].started_at if job is not None and job.attempts else None,
        ended_ms=job.stopped_at if job is not None else None,
        twin_of=run.uninterrupted_twin_of,
    )


def _compare_twins(runs: list[report.TeamRun]) -> None:
    """A twin's losses at the steps its preempted run trained after resuming: identical, or the difference said."""
    by_id = {r.id: r for r in runs}
    for twin in runs:
        if twin.twin_of is None:
            continue
        resumed = by_id[twin.twin_of]
        after = resumed.jobs[-1].losses if len(resumed.jobs) > 1 else {}
        reference = {s: v for j in twin.jobs for s, v in j.losses.items()}
        twin.twin_matches = bool(after) and after == {s: reference.get(s) for s in after}
        differing = sorted(s for s in after if reference.get(s) != after[s])
        twin.twin_note = (
            f"{len(after)} steps after the resume (from step {min(after)}) equal to the uninterrupted run's"
            if twin.twin_matches
            else f"{twin.twin_of} has no resumed attempt"
            if not after
            else f"steps {differing[:5]} differ from the uninterrupted run's"
        )

"""The platform's own CloudWatch metrics: embedded metric format (EMF) lines in each handler's log.

Powertools `Metrics` writes them; CloudWatch Logs turns them into metrics in NAMESPACE, with the
dimensions `service` and `stage` (the pipeline stage that measured it) and never a run's name, so
the number of metrics stays fixed however many runs there are. The few metrics in `BY_TEAM` also carry
`team`: teams are a fixed set from the settings, so that number stays fixed too. The dashboard
(stacks/constructs/dashboard.py) reads the names below, so a metric and its graph cannot drift apart.

Each handler holds its own `EphemeralMetrics`: the plain `Metrics` shares its dimensions across
every instance in a process, which is one handler per process in Lambda but all of them locally.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

Handler = Callable[[Any, Any], Any]

NAMESPACE = "TrainingPlatform"
SERVICE = "training-platform"


class Stage(StrEnum):
    INTAKE = "intake"
    APPROVAL = "approval"
    TRAINING = "training"
    REGISTRATION = "registration"


class Metric(StrEnum):
    """Every metric a handler emits, with the stage that emits it in `STAGE_OF`."""

    RUNS_ACCEPTED = "RunsAccepted"
    RUNS_REJECTED = "RunsRejected"
    RUNS_REFUSED_OVER_BUDGET = "RunsRefusedOverBudget"
    ESTIMATED_MAX_COST = "EstimatedMaxCostUSD"
    APPROVALS_REQUESTED = "ApprovalsRequested"
    APPROVALS_DECIDED = "ApprovalsDecided"
    APPROVAL_WAIT = "ApprovalWaitSeconds"
    APPROVALS_PENDING = "ApprovalsPending"
    OLDEST_PENDING_APPROVAL = "OldestPendingApprovalSeconds"
    UNRECORDED_DECISIONS = "UnrecordedDecisions"
    CHECKPOINT_AGE = "CheckpointAgeSeconds"
    JOBS_COMPLETED = "TrainingJobsCompleted"
    JOBS_FAILED = "TrainingJobsFailed"
    JOB_DURATION = "TrainingJobSeconds"
    SPOT_INTERRUPTIONS = "SpotInterruptions"
    TRAINING_COST = "TrainingCostUSD"
    TEAM_TRAINING_COST = "TeamTrainingCostUSD"
    SPOT_SAVINGS = "SpotSavingsUSD"
    CHECKPOINTS_NOT_AS_RECORDED = "CheckpointsNotAsRecorded"
    BILLED_INSTANCE_SECONDS = "BilledInstanceSeconds"
    PRODUCTIVE_INSTANCE_SECONDS = "ProductiveInstanceSeconds"
    GOODPUT = "GoodputPercent"
    MODELS_REGISTERED = "ModelsRegistered"


TEAM_DIMENSION = "team"
BY_TEAM = frozenset({Metric.TEAM_TRAINING_COST})
"""The metrics recorded per team (`StageMetrics.record_for_team`), with the dimension TEAM_DIMENSION too."""

GOODPUT_LOG_MESSAGE = "goodput"
"""The message of the log line a progress handler writes with a finished job's ledger (run, job, parts): per run,
which no metric dimension holds (the dashboard queries it)."""

STAGE_OF: dict[Metric, Stage] = {
    **dict.fromkeys(
        (Metric.RUNS_ACCEPTED, Metric.RUNS_REJECTED, Metric.RUNS_REFUSED_OVER_BUDGET, Metric.ESTIMATED_MAX_COST),
        Stage.INTAKE,
    ),
    **dict.fromkeys(
        (
            Metric.APPROVALS_REQUESTED,
            Metric.APPROVALS_DECIDED,
            Metric.APPROVAL_WAIT,
            Metric.APPROVALS_PENDING,
            Metric.OLDEST_PENDING_APPROVAL,
            Metric.UNRECORDED_DECISIONS,
        ),
        Stage.APPROVAL,
    ),
    **dict.fromkeys(
        (
            Metric.CHECKPOINT_AGE,
            Metric.JOBS_COMPLETED,
            Metric.JOBS_FAILED,
            Metric.JOB_DURATION,
            Metric.SPOT_INTERRUPTIONS,
            Metric.TRAINING_COST,
            Metric.TEAM_TRAINING_COST,
            Metric.SPOT_SAVINGS,
            Metric.CHECKPOINTS_NOT_AS_RECORDED,
            Metric.BILLED_INSTANCE_SECONDS,
            Metric.PRODUCTIVE_INSTANCE_SECONDS,
            Metric.GOODPUT,
        ),
        Stage.TRAINING,
    ),
    Metric.MODELS_REGISTERED: Stage.REGISTRATION,
}

MEANING: dict[Metric, str] = {
    Metric.RUNS_ACCEPTED: "A run's input passed Validate.",
    Metric.RUNS_REJECTED: "A run's input failed Validate (every problem in one answer).",
    Metric.RUNS_REFUSED_OVER_BUDGET: "A run refused because the budget stop is in force.",
    Metric.ESTIMATED_MAX_COST: "A run's worst-case cost estimate (USD, list price).",
    Metric.APPROVALS_REQUESTED: "An approval gate asked its approvers for a decision.",
    Metric.APPROVALS_DECIDED: "An approver approved or rejected a request.",
    Metric.APPROVAL_WAIT: "How long a decided request waited for its decision.",
    Metric.APPROVALS_PENDING: "Requests waiting for a decision (counted every five minutes).",
    Metric.OLDEST_PENDING_APPROVAL: "The age of the oldest request waiting (counted every five minutes).",
    Metric.UNRECORDED_DECISIONS: "A gate answered with a decision the decision function did not record (alarmed).",
    Metric.CHECKPOINT_AGE: "The age of a training job's newest complete checkpoint, at each poll.",
    Metric.JOBS_COMPLETED: "A training job completed.",
    Metric.JOBS_FAILED: "A training job ended other than completed (failed or stopped).",
    Metric.JOB_DURATION: "A finished job's training seconds.",
    Metric.SPOT_INTERRUPTIONS: "A finished job's spot interruptions (or Batch's lost nodes).",
    Metric.TRAINING_COST: "A finished job's cost at list price (USD).",
    Metric.TEAM_TRAINING_COST: "A finished job's cost at list price (USD), for its run's team.",
    Metric.SPOT_SAVINGS: "What spot saved on a finished job, against on demand (USD).",
    Metric.CHECKPOINTS_NOT_AS_RECORDED: "A checkpoint changed after the platform recorded it (it is never loaded).",
    Metric.BILLED_INSTANCE_SECONDS: "A finished job's billed time times its instances (its goodput ledger).",
    Metric.PRODUCTIVE_INSTANCE_SECONDS: "A finished job's productive training time times its instances.",
    Metric.GOODPUT: "A finished job's goodput: productive of billed time.",
    Metric.MODELS_REGISTERED: "A model package registered, pending approval.",
}
"""One line per metric: the reference page's Meaning column (tools/docs.py)."""

UNIT_OF: dict[Metric, MetricUnit] = {
    **dict.fromkeys(
        (
            Metric.APPROVAL_WAIT,
            Metric.OLDEST_PENDING_APPROVAL,
            Metric.CHECKPOINT_AGE,
            Metric.JOB_DURATION,
            Metric.BILLED_INSTANCE_SECONDS,
            Metric.PRODUCTIVE_INSTANCE_SECONDS,
        ),
        MetricUnit.Seconds,
    ),
    Metric.GOODPUT: MetricUnit.Percent,
    Metric.ESTIMATED_MAX_COST: MetricUnit.NoUnit,
    Metric.TRAINING_COST: MetricUnit.NoUnit,
    Metric.TEAM_TRAINING_COST: MetricUnit.NoUnit,
    Metric.SPOT_SAVINGS: MetricUnit.NoUnit,
}


class StageMetrics:
    """The metrics of one stage's handler; `record` checks that the metric belongs to that stage."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.emf = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
        self.emf.set_default_dimensions(stage=stage.value)
        # One set per team: an EMF line has one set of dimensions for all its metrics.
        self.by_team: dict[str, EphemeralMetrics] = {}

    def _check(self, metric: Metric) -> None:
        if STAGE_OF[metric] is not self.stage:
            raise ValueError(f"{metric} is a {STAGE_OF[metric]} metric, not a {self.stage} one")

    def record(self, metric: Metric, value: float = 1) -> None:
        self._check(metric)
        if metric in BY_TEAM:
            raise ValueError(f"{metric} is recorded per team: use record_for_team")
        self.emf.add_metric(name=metric.value, unit=UNIT_OF.get(metric, MetricUnit.Count), value=value)

    def record_for_team(self, metric: Metric, team: str, value: float) -> None:
        """`metric` (one of BY_TEAM) with the dimension `team` besides `service` and `stage`."""
        self._check(metric)
        if metric not in BY_TEAM:
            raise ValueError(f"{metric} has no team dimension: use record")
        if team not in self.by_team:
            self.by_team[team] = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
            self.by_team[team].set_default_dimensions(stage=self.stage.value, **{TEAM_DIMENSION: team})
        self.by_team[team].add_metric(name=metric.value, unit=UNIT_OF.get(metric, MetricUnit.Count), value=value)

    def flushed(self, handler: Handler) -> Handler:
        """Write the invocation's metrics when the handler returns or raises.

        Powertools' `log_metrics` warns on an invocation that recorded nothing; here that is normal
        (a poll before training starts, a listing of approvals), so an empty set is simply not written.
        """

        @functools.wraps(handler)
        def wrapper(event: Any, context: Any) -> Any:
            try:
                return handler(event, context)
            finally:
                for emf in (self.emf, *self.by_team.values()):
                    if emf.metric_set:
                        emf.flush_metrics()

        return wrapper

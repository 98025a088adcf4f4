"""The pipeline's data contract: the resolved training request and the results later states read.

Validate turns an execution input into a `TrainingRequest`; the handlers parse what they are given
with these models, and the state machine addresses their fields through `Path`s generated from
them (`REQUEST.instance_type` is "$.request.instance_type"), so renaming a field fails where the
state machine is built, in a unit test, not when a run reaches the state.
"""

from __future__ import annotations

import shlex
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from contract.model_args import ModelArgs


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


TRAIN_ROLE = "train"
AUXILIARY_ROLE = "auxiliary"
MAX_FALLBACK = 3
"""The most fallback clusters a run may list (docs/ml-engineer/capacity-fallback.md)."""
MAX_PRIORITY = 9999
"""The highest schedulingPriority AWS Batch takes (SubmitServiceJob)."""


class InstanceGroup(_Model):
    """Instances of one type; a request holds one group, or several for a heterogeneous cluster."""

    name: str = "train"
    instance_type: str
    instance_count: int
    efa: bool
    """Use EFA (the type has it and the run did not turn it off)."""
    local_storage: bool
    """Instance-store NVMe: SageMaker takes no volume KMS key for these types."""
    # Defaults keep a request that Validate resolved before these fields existed readable.
    gpus: int = 0
    """CUDA GPUs each instance has (the catalog's): the launcher's pre-flight check expects every host to see them."""
    allreduce_floor_gbps: float = 0.0
    """The pre-flight's all-reduce bus bandwidth floor across instances (GB/s); 0 when the group does not use EFA."""
    role: str = TRAIN_ROLE
    """`train`: its hosts run the torchrun job; `auxiliary`: its hosts are told their role and do not train."""
    channels: list[str] | None = None
    """The input channels its hosts receive (None: all of them)."""
    training_plan: bool = False
    """Its instances come from the stage's training plan (one group on the plan's type, on demand, one job)."""


class Dataset(_Model):
    uri: str
    s3_uri: str


class BaseModelSource(_Model):
    """The model folder a run fine-tunes (`init_from`), and what Validate read of it."""

    uri: str
    s3_uri: str
    architecture: str | None = None
    """config.json's architecture, when Validate read it."""
    parameters: int | None = None
    """The model's parameters, from config.json's sizes."""
    trained_parameters: int | None = None
    """The parameters the run trains: all of them, or its LoRA adapters'."""
    shape: ModelArgs | None = None
    """The model's sizes, from config.json: what the memory plan (contract/memory.py) is of."""


class Quality(_Model):
    metric: str
    max: float | None
    min: float | None


class Tag(_Model):
    Key: str
    Value: str


class Tuning(_Model):
    """A hyperparameter tuning job's settings, resolved by Validate (docs/ml-engineer/tuning.md)."""

    job_name: str
    """The tuning job's name (SageMaker allows 32 characters); its trials are <job_name>-<NNN>-<8 hex>."""
    max_jobs: int
    max_parallel_jobs: int
    config: dict[str, Any]
    """SageMaker's HyperParameterTuningJobConfig: strategy, objective, resource limits, parameter ranges."""


class ResumeSource(_Model):
    """The ended run a request resumes (`resume_from`), as Validate found it."""

    execution: str
    run: str
    """Its job_name_base: its checkpoints' and its ledger's prefix."""
    earlier: list[str] = Field(default_factory=list)
    """The executions that run resumed in turn, newest first: the rest of the chain."""


class Code(_Model):
    """A run's own training code (contract/user_code.py), as Validate found it: the job's `code` channel."""

    uri: str
    """The packed code in the run's own code prefix (contract/layout.py `code_key`)."""
    sha256: str
    entry_point: str
    args: list[str]
    requirements: str
    """The requirements file installed from the packed wheelhouse ("" for none)."""
    retry_on_exit_codes: list[int]
    size_bytes: int | None
    """The archive's size as Validate found it (None: not inspected, as offline checks of a template are not)."""


class TrainingRequest(_Model):
    """A validated, complete request: the only thing later states read from the execution input."""

    run_name: str
    job_name_base: str
    """<run>-<hash of the execution name>: stable for one execution, unique across them."""
    instance_groups: list[InstanceGroup] = Field(min_length=1, max_length=5)
    """One group, or up to five (SageMaker's limit) for a heterogeneous cluster."""
    volume_size_gb: int
    backend: str
    """Which training step runs the job (stacks/pipeline/training_step.py)."""
    distribution: str
    spot: bool
    stopping_condition: dict[str, int]
    """SageMaker's StoppingCondition: MaxRuntimeInSeconds, and MaxWaitTimeInSeconds for spot."""
    poll_seconds: int
    keep_alive_seconds: int
    hyperparameters: dict[str, str]
    channels: list[dict[str, Any]]
    """SageMaker's InputDataConfig channels."""
    dataset: Dataset
    base_model: BaseModelSource | None = None
    """The model folder the run fine-tunes (`init_from`), as the `base_model` input channel."""
    quality: Quality | None
    notify: list[str]
    recipients: list[str]
    """The SNS String.Array attribute subscriptions filter on (never empty)."""
    requested_by: str | None
    tags: list[Tag]
    tuning: Tuning | None = None
    """Run a hyperparameter tuning job of this request's training jobs instead of one job."""
    resume_from: ResumeSource | None = None
    """Start from the newest recorded checkpoint of this ended run (the ledger-opening step copies it in)."""
    fallback: list[InstanceGroup] = Field(default_factory=list, max_length=MAX_FALLBACK)
    """The input's `fallback`: clusters of one group each, tried in order after insufficient capacity."""
    team: str | None = None
    """The team the run belongs to (settings `teams`; Validate proved the requester a member)."""
    priority: int = Field(default=0, ge=0, le=MAX_PRIORITY)
    """Its service job's schedulingPriority in the team's quota share (backend "queue")."""
    max_queue_wait_seconds: int | None = None
    """Backend "queue": the longest its service job may wait for capacity at a time (lambdas/queue/waits.py)."""
    alternative: int = Field(default=0, ge=0, le=MAX_FALLBACK)
    """The cluster `instance_groups` holds: 0 the input's own, i its fallback[i - 1] (lambdas/sagemaker/capacity.py)."""
    code: Code | None = None
    """The run's own code, which the launcher runs instead of the built-in trainer (None: the trainer)."""

    def on_fallback(self, index: int) -> TrainingRequest:
        """This request moved onto its `fallback[index]` cluster, as an attempt after insufficient capacity runs it."""
        return self.model_copy(update={"instance_groups": [self.fallback[index]], "alternative": index + 1})

    @classmethod
    def parse(cls, data: dict[str, Any]) -> TrainingRequest:
        """A request as a state hands it on: its computed fields are dropped, then it is validated again."""
        return cls.model_validate({k: v for k, v in data.items() if k not in cls.model_computed_fields})

    @property
    def _training(self) -> InstanceGroup:
        return next(group for group in self.instance_groups if group.role == TRAIN_ROLE)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def heterogeneous(self) -> bool:
        """More than one instance group: CreateTrainingJob takes `InstanceGroups` instead of a type and count."""
        return len(self.instance_groups) > 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sagemaker_instance_groups(self) -> list[dict[str, Any]]:
        """ResourceConfig.InstanceGroups, as CreateTrainingJob takes them."""
        return [
            {"InstanceGroupName": g.name, "InstanceType": g.instance_type, "InstanceCount": g.instance_count}
            for g in self.instance_groups
        ]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def training_groups(self) -> str:
        """The groups whose hosts train, comma-separated: the launcher's TRAINING_GROUPS (training/roles.py)."""
        return ",".join(g.name for g in self.instance_groups if g.role == TRAIN_ROLE)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cluster(self) -> str:
        """The cluster in a few words, for people: `2 x ml.p4d.24xlarge` or `2 x ml.p4d.24xlarge (gpu) + ...`."""
        if not self.heterogeneous:
            return f"{self.instance_count} x {self.instance_type}"
        return " + ".join(f"{g.instance_count} x {g.instance_type} ({g.name})" for g in self.instance_groups)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def instance_type(self) -> str:
        """The (first) training group's type."""
        return self._training.instance_type

    @computed_field  # type: ignore[prop-decorator]
    @property
    def instance_count(self) -> int:
        """Instances in every group together."""
        return sum(group.instance_count for group in self.instance_groups)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def local_storage(self) -> bool:
        """Any group on an instance-store type: SageMaker then takes no volume KMS key for the job."""
        return any(group.local_storage for group in self.instance_groups)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def efa(self) -> bool:
        """The training groups use EFA (the other groups' hosts never join NCCL)."""
        return all(group.efa for group in self.instance_groups if group.role == TRAIN_ROLE)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def max_runtime_seconds(self) -> int:
        """The training time limit (AWS Batch's attempt timeout)."""
        return self.stopping_condition["MaxRuntimeInSeconds"]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def training_plan(self) -> bool:
        """The job runs in the stage's training plan (ResourceConfig.TrainingPlanArn)."""
        return not self.heterogeneous and self._training.training_plan

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fallback_left(self) -> bool:
        """A fallback cluster not yet tried: insufficient capacity moves the next attempt onto it."""
        return self.alternative < len(self.fallback)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def code_summary(self) -> str:
        """What the job runs, for people (the approver's request, the notifications)."""
        if self.code is None:
            return "the platform's trainer"
        command = shlex.join([*shlex.split(self.code.entry_point), *self.code.args])
        return f"{command} from {self.code.uri} (sha256 {self.code.sha256})"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tag_map(self) -> dict[str, str]:
        """`tags` as a map, as AWS Batch takes them: the execution's, the run's and the team's cost tag among them."""
        return {tag.Key: tag.Value for tag in self.tags}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpus(self) -> int:
        return self._training.gpus

    @computed_field  # type: ignore[prop-decorator]
    @property
    def allreduce_floor_gbps(self) -> float:
        return self._training.allreduce_floor_gbps


def _handed_on(data: Any) -> Any:
    return TrainingRequest.parse(data) if isinstance(data, dict) else data


HandedOnRequest = Annotated[TrainingRequest, BeforeValidator(_handed_on)]
"""A request in a handler's event: as a state hands it on, with its computed fields (`TrainingRequest.parse`)."""


class Validation(_Model):
    valid: bool
    message: str
    request: TrainingRequest | None


class CostEstimate(_Model):
    hourly_usd: float
    on_demand_usd: float
    spot_usd: list[float] | None
    max_cost_usd: float
    threshold_usd: float
    approval_required: bool
    price_source: str
    training_jobs: int = 1
    """Jobs the estimate covers: a tuning job's max_jobs, each at the single job's worst case."""
    parallel_jobs: int = 1
    worst_case: str = ""
    """The cluster the costs are of: the dearest of the run's own and its fallback clusters, e.g.
    `fallback[0]: 4 x ml.p4d.24xlarge`."""
    fallback_hourly_usd: list[float] = Field(default_factory=list)
    """Each fallback cluster's list price per hour, in the request's order (`hourly_usd` is the run's own)."""
    gpu_memory: str | None = None
    """The memory plan of the run's process that holds the most against its GPU's memory (contract/memory.py), when
    its training hosts are one type of known GPU memory (and a fine-tuning run's model folder was read)."""
    budget_warning: str = ""
    """Which monthly budgets (the platform's, the run's team's) the worst case exceeds, in words; "" for none. A
    warning, not a refusal: the budget stop acts on spend, not on estimates."""


class JobCost(_Model):
    """A finished job's cost at list price: billed, the same training time on demand, and the difference."""

    actual_usd: float
    on_demand_usd: float
    spot_savings_usd: float

    @staticmethod
    def total(*costs: JobCost | None) -> JobCost | None:
        """The costs that are known, summed (None if none is): what a run's billed jobs cost together."""
        known = [cost for cost in costs if cost is not None]
        if not known:
            return None
        return JobCost(
            actual_usd=round(sum(cost.actual_usd for cost in known), 4),
            on_demand_usd=round(sum(cost.on_demand_usd for cost in known), 4),
            spot_savings_usd=round(sum(cost.spot_savings_usd for cost in known), 4),
        )


class TunedTrial(_Model):
    """The best training job of a tuning job, and how it was found (what the lineage records)."""

    tuning_job: str
    best_training_job: str
    hyperparameters: dict[str, str]
    """The tuned values the best trial ran with."""
    objective_metric: str
    objective_type: str
    objective_value: float | None
    trials_completed: int
    trials_launched: int
    trials_billed: int
    """Trials with billed time: the progress's seconds and cost are theirs, summed."""
    best_trial_cost: JobCost | None


class JobProgress(_Model):
    """One poll of the training job, as the training step's Choice states branch on it."""

    job_name: str
    status: str
    secondary_status: str
    finished: bool
    error: str | None
    failure_reason: str
    retry_on_new_nodes: bool
    """It failed in a way a new job on fresh instances may not (`error` says which): insufficient capacity,
    or the launcher's pre-flight check (a host short of GPUs, NCCL off EFA, a slow all-reduce)."""
    interruptions: int
    checkpoint: dict[str, Any] | None
    checkpoint_age_minutes: float | None
    stale: bool
    warn_stale: bool
    stale_warned: bool
    final_metrics: dict[str, float]
    billable_seconds: int | None
    training_seconds: int | None
    cost: JobCost | None
    """Set once the job has finished."""
    model_artifacts: str | None
    tuning: TunedTrial | None = None
    """Set when the job is the best trial of a tuning job."""
    goodput: dict[str, Any] | None = None
    """A finished job's goodput ledger (contract/goodput.py's JobLedger as JSON), also in the run's lineage."""
    queued: str | None = None
    """A team's service job waiting in its queue: "queued for capacity: <the scheduler's reason>"."""
    queued_seconds: float | None = None
    """How long that service job has waited this time (since its submission, or its last preemption)."""
    poll_seconds: int | None = None
    """How long the state machine waits before the next poll: the request's interval, longer the longer a queued job
    has waited (lambdas/jobs/pacing.py)."""
    preemptions: int = 0
    """How often the scheduler preempted the team's service job (each time it resumed from the checkpoints)."""
    polls: int = 0
    """The polls this execution has made of the run's jobs, this one included (lambdas/jobs/pacing.py)."""
    hand_over: bool = False
    """The execution has made its budget of polls (`Poll.polls_per_execution`): the run goes on in a new execution
    (stacks/pipeline/polled_job.py), which follows the same job."""
    run_cost: JobCost | None = None
    """What the run's jobs cost so far: this job's `cost` and every earlier attempt's (`Poll.billed`), summed. Set
    once the job has finished; what the run's lineage records as its cost, and what the next attempt carries on."""

    @classmethod
    def untrained(
        cls,
        job_name: str,
        status: str,
        secondary_status: str,
        *,
        finished: bool = False,
        error: str | None = None,
        failure_reason: str = "",
        **fields: Any,
    ) -> JobProgress:
        """A poll of a job with no training to report (yet): no checkpoint age, metrics, billing or cost."""
        defaults: dict[str, Any] = {
            "retry_on_new_nodes": False,
            "interruptions": 0,
            "checkpoint": None,
            "checkpoint_age_minutes": None,
            "stale": False,
            "warn_stale": False,
            "stale_warned": False,
            "final_metrics": {},
            "billable_seconds": None,
            "training_seconds": None,
            "cost": None,
            "model_artifacts": None,
        }
        return cls(
            job_name=job_name,
            status=status,
            secondary_status=secondary_status,
            finished=finished,
            error=error,
            failure_reason=failure_reason,
            **(defaults | fields),
        )


class Evaluation(_Model):
    passed: bool
    reason: str
    metrics: dict[str, float]


class Registration(_Model):
    model_package_arn: str
    lineage_uri: str


class Decision(_Model):
    """An approver's decision, as the gate's task token returns it."""

    decision: str
    by: str
    caller: str
    reason: str
    request_id: str
    gate: str
    requested_at: str
    decided_at: str


class Failure(_Model):
    """Why the training step failed."""

    error: str
    cause: str


class CaughtError(_Model):
    """What a Catch puts at its ResultPath."""

    Error: str
    Cause: str


class CreatedJob(_Model):
    job_name: str
    arn: str | None = None
    job_id: str | None = None
    """An AWS Batch service job's ID (what DescribeServiceJob takes)."""


class FoundJobs(_Model):
    """The ARNs, names and IDs of a listing's summaries, as the AWS Batch and queue steps find a job they may have
    submitted (ListJobs, ListServiceJobs)."""

    arns: list[str]
    names: list[str]
    ids: list[str] | None = None


JobKind = Literal["training-job", "tuning-job", "batch-job", "service-job"]
"""The kinds of job a create step may find under its attempt's name (lambdas/jobs/adoption.py)."""


class ExistingJob(_Model):
    """What a create step found under its attempt's name, for the adoption check: the request and the attempt it
    made, and the job (a name, or AWS Batch's ID)."""

    request: HandedOnRequest
    execution: str
    attempt: int = 1
    kind: JobKind
    job: str


class Adoption(_Model):
    """The adoption check's answer: adopt the job found (it is the one the platform asked for), or why not."""

    adopt: bool
    job_name: str
    arn: str
    cause: str = ""
    """The differences from what the platform asked for: the run's failure when it does not adopt."""


class Submission(_Model):
    """A team's service job as the queue step builds it before SubmitServiceJob."""

    payload: dict[str, Any]
    """The CreateTrainingJob request it queues (its serviceRequestPayload), as the SageMaker step sends it."""
    tags: dict[str, str]
    """Its tags: the team, the execution and the run."""


class Attempt(_Model):
    """The training step's own state: which attempt, and the job it created (or adopted)."""

    attempt: int
    job: CreatedJob | None = None
    retried_after: Failure | None = None
    """Why the previous attempt's job was replaced by this one (None on the first attempt)."""
    found: FoundJobs | None = None
    """AWS Batch and the queue: the jobs of this attempt's name that a submit whose answer was lost finds."""
    adoption: Adoption | None = None
    """Whether an existing job of this attempt's name is the one the platform asked for: only then is it adopted."""
    submission: Submission | None = None
    """A team's service job: what the attempt submits."""
    billed: JobCost | None = None
    """What the earlier attempts' jobs cost, summed (their last poll's `run_cost`; None on the first attempt)."""
    polls: int = 0
    """The polls this execution made of the earlier attempts' jobs: the new attempt's count goes on from it."""


class LastPoll(BaseModel):
    """What a poll reads of the previous one: its JobProgress, or a new attempt's {"stale_warned": false}."""

    model_config = ConfigDict(extra="ignore")

    stale_warned: bool = False
    polls: int = 0
    """The polls this execution has made so far (`JobProgress.polls`)."""


class Poll(_Model):
    """A progress handler's event (stacks/pipeline/polled_job.py): the request, the previous poll, the price."""

    request: HandedOnRequest
    execution: str
    """The execution's ARN, which the run's ledger records."""
    previous: LastPoll
    hourly_usd: float
    """The estimate's list price of the whole cluster per hour."""
    billed: JobCost | None = None
    """What the run's earlier attempts' jobs cost, summed (`Attempt.billed`): the poll adds its job's to it."""
    polls_per_execution: int | None = None
    """The polls one execution may make before the run goes on in a new one (settings
    `pipeline.polls_per_execution`); None: no limit."""


class SageMakerPoll(Poll):
    job_name: str


class BatchPoll(Poll):
    job: CreatedJob


class QueuePoll(Poll):
    """A team's service job (lambdas/queue/monitor.py): its name and ID as SubmitServiceJob answered."""

    job: CreatedJob


class EstimateEvent(_Model):
    """Estimate's event (stacks/pipeline/intake.py)."""

    request: HandedOnRequest


class NextClusterEvent(_Model):
    """The capacity fallback handler's event (stacks/pipeline/polled_job.py): the request and its estimate."""

    request: HandedOnRequest
    estimate: CostEstimate


class NextCluster(_Model):
    """The request moved onto its next fallback cluster, and that cluster's list price per hour."""

    request: TrainingRequest
    hourly_usd: float


class EvaluateEvent(_Model):
    """Evaluate's event (stacks/pipeline/outcome.py): the request's gate and the finished job's metrics."""

    quality: Quality | None
    final_metrics: dict[str, float]


class ResumeEvent(_Model):
    """The ledger-opening handler's event (stacks/pipeline/resume.py)."""

    request: HandedOnRequest
    execution: str


class ResumedCheckpoint(_Model):
    """The checkpoint a resuming run started from: what its lineage records of the run it resumed."""

    execution: str
    run: str
    step: int
    manifest_sha256: str


class RegisterEvent(_Model):
    """Register's event (stacks/pipeline/outcome.py)."""

    request: HandedOnRequest
    job: JobProgress
    estimate: CostEstimate
    evaluation: Evaluation
    execution: str
    resumed: ResumedCheckpoint | None = None


class EndedRun(_Model):
    """The state machine's cleanup event, on every way out of a run."""

    execution: str
    job_name_base: str


class RunIdentity(_Model):
    """Which run an execution is part of: the run's first execution, whose ARN its jobs are tagged with, its
    ledger records and its notifications name, however many executions it has been handed over to since."""

    execution: str
    handovers: int = 0
    """The executions the run has been handed over to so far."""
    loop: str | None = None
    """The polling loop a hand-over continues in: the name of its Wait state (stacks/pipeline/polled_job.py)."""


class StartedExecution(_Model):
    """StartExecution's answer, as the states:startExecution task puts it at its ResultPath."""

    model_config = ConfigDict(extra="ignore")

    ExecutionArn: str
    StartDate: Any = None


class HandOver(_Model):
    """A hand-over execution's input: the execution that started it (`from`) and that execution's state."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: str = Field(alias="from")
    state: dict[str, Any]


class TakeOverEvent(_Model):
    """The TakeOver handler's event (stacks/pipeline/handover.py): the claimed hand-over, and who reads it."""

    handover: HandOver
    execution: str


class HandedOver(_Model):
    """What a handed-over execution ends with: where the run goes on, and which run it is."""

    continues_in: str
    run: RunIdentity


class Path:
    """A JSONPath into the execution's state, checked against the model of what is there.

    `Path(TrainingRequest, "$.request").dataset.uri` is "$.request.dataset.uri"; a field the
    model does not have is an AttributeError naming the fields it has.
    """

    def __init__(self, model: type[BaseModel] | None, path: str) -> None:
        self._model = model
        self._path = path

    def __getattr__(self, name: str) -> Path:
        if name.startswith("_") or self._model is None:
            raise AttributeError(name)
        fields: dict[str, Any] = {
            **{k: f.annotation for k, f in self._model.model_fields.items()},
            **{k: f.return_type for k, f in self._model.model_computed_fields.items()},
        }
        if name not in fields:
            raise AttributeError(f"{self._model.__name__} has no field {name!r}; it has {', '.join(fields)}")
        return Path(_model_in(fields[name]), f"{self._path}.{name}")

    def __str__(self) -> str:
        return self._path

    def __repr__(self) -> str:
        return f"Path({self._path!r})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds, through Optional (`Quality | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


INPUT = Path(None, "$.input")
"""The execution input as given, kept beside the request."""
REQUEST = Path(TrainingRequest, "$.request")
VALIDATION = Path(Validation, "$.validation")
ESTIMATE = Path(CostEstimate, "$.estimate")
LAUNCH_APPROVAL = Path(Decision, "$.launch_approval")
PROMOTION_APPROVAL = Path(Decision, "$.promotion_approval")
TRAIN = Path(Attempt, "$.train")
JOB = Path(JobProgress, "$.job")
FAILURE = Path(Failure, "$.failure")
ERROR = Path(CaughtError, "$.error")
CLEANUP = Path(None, "$.cleanup")
"""What the cleanup handler did (jobs stopped, checkpoints pruned), or the error it raised."""
EVALUATION = Path(Evaluation, "$.evaluation")
REGISTRATION = Path(Registration, "$.registration")
NEXT_CLUSTER = Path(NextCluster, "$.next_cluster")
"""The capacity fallback handler's answer until the state machine has put its request and price in place; then {}."""
RUN = Path(RunIdentity, "$.run")
"""The run the execution is part of (its first execution), set once the request is accepted or a hand-over proven."""
HANDOVER = Path(HandOver, "$.handover")
"""A hand-over execution's input (absent from a run's first execution's)."""
HANDED_TO = Path(StartedExecution, "$.handed_to")
"""The execution a run was handed over to."""
RESUMED = Path(ResumedCheckpoint, "$.resumed")
"""The checkpoint copied from the run `resume_from` names (absent for a run started afresh)."""

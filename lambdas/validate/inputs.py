"""What Validate reads: the execution input ML engineers write (the deployed platform's limits are in limits.py)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from contract.distributions import NAMES as DISTRIBUTION_NAMES
from contract.execution_state import MAX_FALLBACK, MAX_PRIORITY, TRAIN_ROLE
from lambdas.validate.tuning import TuningInput

HyperparameterValue = StrictStr | StrictInt | StrictFloat | StrictBool


class QualityGate(BaseModel):
    """The final metric a run must reach to be registered."""

    model_config = ConfigDict(extra="forbid", strict=True)
    metric: str = "validation:loss"
    max: float | None = None
    min: float | None = None


class GroupInput(BaseModel):
    """One instance group of a heterogeneous cluster (docs/ml-engineer/heterogeneous-clusters.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    instance_type: str
    instance_count: int = Field(1, ge=1)
    role: str = TRAIN_ROLE
    channels: list[str] | None = None


class FallbackInput(BaseModel):
    """A cluster to try instead when SageMaker has too little capacity for the one before it
    (docs/ml-engineer/capacity-fallback.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    instance_type: str
    instance_count: int = Field(1, ge=1)


class CodeInput(BaseModel):
    """The run's own training code, run by the image's launcher instead of the built-in trainer
    (docs/ml-engineer/your-own-code.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    source: str = Field(
        description="The packed code: `s3://<artifacts bucket>/code/.../<sha256>.tar.gz` in the run's own code "
        "prefix; `tp` and `make demo` also take a local folder, which they pack and upload there."
    )
    sha256: str | None = Field(None, description="The packed code's SHA-256 (`tp` records it); required with s3://.")
    entry_point: str = Field(description="A script in the packed folder (`train.py`), or `-m package.module`.")
    args: list[StrictStr] = Field(default_factory=list, description="The script's arguments.")
    requirements: str | None = Field(
        None, description="A requirements file in the folder, installed from the packed wheelhouse."
    )
    retry_on_exit_codes: list[StrictInt] = Field(
        default_factory=list,
        description="The script's exit statuses that mean a fault of the instances: retried on fresh ones.",
    )


class ExecutionInput(BaseModel):
    """What an ML engineer passes to StartExecution (docs/ml-engineer/start.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    run_name: str = Field(description="3-40 of a-z, 0-9, '-'; names the jobs, checkpoints and model.")
    model: str | None = Field(None, description="Model preset (hyperparameter `model`): tiny, gpt2, llama-1b, ...")
    dataset: str = Field(
        description="Training shards: `fsx:///datasets/<path>/` or `s3://<datasets bucket>/<prefix>/`."
    )
    validation_dataset: str | None = Field(None, description="Validation shards, same forms (default: in `dataset`).")
    init_from: str | None = Field(
        None,
        description="A model folder to fine-tune (Hugging Face layout: config.json, safetensors, tokenizer), same "
        "forms as `dataset`; its config.json sets the architecture and sizes, so no `model` is given.",
    )
    instance_type: str | None = Field(
        None, description="SageMaker training instance type, e.g. `ml.p5.48xlarge` (or `instance_groups`)."
    )
    instance_count: int | None = Field(
        None, ge=1, description="Instances (default 1); bounded by the training subnet's capacity."
    )
    instance_groups: list[GroupInput] | None = Field(
        None,
        description="A heterogeneous cluster instead of `instance_type`: up to 5 groups of `name`, `instance_type`, "
        "`instance_count`, `role` (train or auxiliary) and `channels` (those its hosts receive; default all).",
    )
    fallback: list[FallbackInput] | None = Field(
        None,
        max_length=MAX_FALLBACK,
        description=f"Up to {MAX_FALLBACK} clusters of `instance_type` and `instance_count`, tried in order when "
        "SageMaker has too little capacity for the one before; the same global batch"
        " (docs/ml-engineer/capacity-fallback.md).",
    )
    backend: str = Field(
        "sagemaker", description="Where the job runs: one of the training backends the platform deploys."
    )
    team: str | None = Field(
        None,
        description="The team the run belongs to (settings `teams`): its members start it, its approvers decide "
        'its gates, its quota share and budget hold it (docs/platform-team/teams.md); required with backend "queue".',
    )
    priority: int = Field(
        0,
        ge=0,
        le=MAX_PRIORITY,
        description=f'0-{MAX_PRIORITY}: within the team\'s quota share, higher runs first (backend "queue").',
    )
    max_queue_wait_minutes: int | None = Field(
        None,
        ge=1,
        description='Backend "queue": the longest the run\'s job may wait for capacity at a time (after submission '
        "and after each preemption) before the run fails with QueueWaitExceeded; at most, and by default, the "
        "platform's service_environment.max_queue_wait_minutes.",
    )
    distribution: str = Field("ddp", description="Data-parallel strategy: " + ", ".join(DISTRIBUTION_NAMES) + ".")
    efa: bool | None = Field(
        None,
        description="EFA for NCCL: true requires it (a host without it fails the job at start), false keeps NCCL "
        "on TCP sockets (default: used whenever the type has it).",
    )
    spot: bool = Field(False, description="Managed spot training (resumes from checkpoints after interruptions).")
    checkpoints: bool = Field(True, description="Write periodic checkpoints (synced to S3); spot runs need them.")
    max_runtime_hours: float = Field(gt=0, description="Training time limit (SageMaker MaxRuntimeInSeconds).")
    max_wait_hours: float | None = Field(
        None, gt=0, description="Spot only: limit on waiting plus training (default: twice the runtime)."
    )
    hyperparameters: dict[str, HyperparameterValue] = Field(
        default_factory=dict,
        description="Trainer hyperparameters (docs/reference/hyperparameters.md), or with `code` your script's; "
        "strings, numbers, booleans.",
    )
    warm_pool_minutes: int = Field(0, ge=0, le=60, description="Keep the instances warm this long for the next run.")
    quality: QualityGate | None = Field(
        None, description='Gate before registration, e.g. `{"metric": "validation:loss", "max": 3.3}`.'
    )
    notify: list[str] = Field(
        default_factory=list, description="Who hears about this run (from notifications.run_emails)."
    )
    requester_proof: str | None = Field(
        None,
        description="Who starts the run, proven by `tp start` (good for 5 minutes, once); required "
        "while pipeline.forbid_self_approval is on (the default).",
    )
    membership_proof: str | None = Field(
        None,
        description="That the starter carries its team's `platform-team` principal tag, signed by `tp start` with "
        "the requester_proof; needed when the team's `members` do not name the starter.",
    )
    resume_from: str | None = Field(
        None,
        description="Resume an ended run of yours from its newest checkpoint the platform recorded: its execution"
        " ARN or run id (docs/ml-engineer/resume.md).",
    )
    tuning: TuningInput | None = Field(
        None,
        description="Hyperparameter tuning instead of one job: ranges, objective, strategy, max_jobs, "
        "max_parallel_jobs (docs/ml-engineer/tuning.md).",
    )
    code: CodeInput | None = Field(
        None,
        description="Your own training code instead of the built-in trainer: `source`, `entry_point`, `args`, "
        "`requirements`, `retry_on_exit_codes`; `hyperparameters` are then your script's "
        "(docs/ml-engineer/your-own-code.md).",
    )


def input_table() -> str:
    """The run input reference page's table (docs/reference/run-input.md), generated from the model."""
    rows = ["| Key | Default | Meaning |", "| --- | --- | --- |"]
    for name, field in ExecutionInput.model_fields.items():
        default = "(required)" if field.is_required() else json.dumps(field.get_default(call_default_factory=True))
        rows.append(f"| `{name}` | `{default}` | {field.description} |")
    return "\n".join(rows)

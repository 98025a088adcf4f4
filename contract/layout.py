"""Where a run's files live, and the names of the training container's environment.

Torch-free and stdlib only: the trainer, the Lambda handlers (their asset holds this module), the
stacks and the local platform all take these names from here, so that none spells a path of its own.

    <checkpoints bucket>/runs/<job_name_base>/checkpoints/step-<N>/   one run's checkpoints, every attempt's
    <artifacts bucket>/runs/<job_name>/output/                        a job's model (SageMaker) or results (Batch)
    <artifacts bucket>/runs/<job_name_base>/tensorboard/              TensorBoard output (SageMaker)
    <artifacts bucket>/runs/<job_name_base>/lineage/                  what Register records of the run
    <artifacts bucket>/runs/<job_name_base>/lineage/checkpoints/      the run's checkpoint ledger (contract/ledger.py)
    <artifacts bucket>/runs/<job_name_base>/lineage/goodput/          each job's goodput ledger (contract/goodput.py)
    <checkpoints bucket>/runs/<job_name_base>/checkpoints/progress/   the trainer's progress records (goodput.py)
    <artifacts bucket>/code/teams/<team>/<run_name>/<sha256>.tar.gz   a team's run's own code (contract/user_code.py)
    <artifacts bucket>/code/runs/<run_name>/<sha256>.tar.gz           the own code of a run of no team

A checkpoint is a directory ``step-<N>/`` whose ``manifest.json`` is written last (training/checkpoint.py);
when it is complete is contract/stored_checkpoints.py's rule.
"""

from __future__ import annotations

import re

from contract.user_code import ARCHIVE_SUFFIX, COMMUNICATION_FAILED, RETRYABLE_EXIT

# -- checkpoints -------------------------------------------------------------------------------------

MANIFEST = "manifest.json"
"""Written last into a checkpoint's directory: the checkpoint is complete once it exists."""
MANIFEST_GLOB = f"step-*/{MANIFEST}"
"""The manifests of the checkpoints in a checkpoint directory, as a `Path.glob` pattern."""
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(step: int) -> str:
    """The name of the checkpoint directory of `step`: ``step-<step>``."""
    return f"step-{step}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory's name (``step-12`` -> 12); None for any other name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


# -- a run's S3 prefixes -----------------------------------------------------------------------------

RUNS = "runs/"
"""Every run's files, in the checkpoints bucket and in the artifacts bucket."""
ANY_RUN = f"{RUNS}*"
"""Every key under `RUNS`, as IAM resources and `s3:prefix` conditions match it."""
PROFILER = f"{RUNS}profiler/"
"""SageMaker's profiler output of every job (it adds the job's name itself)."""


def run_checkpoints(job_name_base: str) -> str:
    """A run's prefix in the checkpoints bucket, which every attempt's job of the run shares."""
    return f"{RUNS}{job_name_base}/checkpoints/"


PROGRESS = "progress"
"""The folder of the trainer's progress records in a run's checkpoints (contract/goodput.py)."""


def run_output(job_name: str) -> str:
    """A job's output prefix in the artifacts bucket (SageMaker's S3OutputPath/<job>/output/, Batch's results)."""
    return f"{RUNS}{job_name}/output/"


def result_key(output: str, attempt: int, node: int) -> str:
    """Where a node writes its result for an attempt (PollBatchJob reads the main node's, and any failure)."""
    return f"{output}attempt-{attempt}/node-{node}.json"


def run_tensorboard(job_name_base: str) -> str:
    """A run's TensorBoard prefix in the artifacts bucket."""
    return f"{RUNS}{job_name_base}/tensorboard/"


LINEAGE = "lineage/"
"""The lineage folder of a run's prefix."""
LINEAGE_RECORD = "lineage.json"
"""A run's lineage record, under its `run_lineage` prefix."""


def run_lineage(job_name_base: str) -> str:
    """A run's lineage prefix in the artifacts bucket (Register writes LINEAGE_RECORD and the rest under it)."""
    return f"{RUNS}{job_name_base}/{LINEAGE}"


def run_progress(job_name_base: str, *, trial: str | None = None) -> str:
    """A run's progress records in the checkpoints bucket (contract/goodput.py); a tuning trial's are in the
    trial's folder of the run's checkpoints."""
    return f"{run_checkpoints(job_name_base)}{f'{trial}/' if trial else ''}{PROGRESS}/"


def run_goodput(job_name_base: str) -> str:
    """A run's goodput ledgers in the artifacts bucket: one per job, written once by its progress handler."""
    return f"{run_lineage(job_name_base)}goodput/"


def run_ledger(job_name_base: str) -> str:
    """A run's checkpoint ledger in the artifacts bucket: what the platform saw the run's jobs commit."""
    return f"{run_lineage(job_name_base)}checkpoints/"


def run_of(job_name: str) -> str:
    """The job_name_base of a job named <job_name_base>-<attempt>."""
    return job_name.rsplit("-", 1)[0]


# States.Format templates, whose `{}` the state machine fills with the run or the job.
CHECKPOINTS_FORMAT = run_checkpoints("{}")
OUTPUT_FORMAT = run_output("{}")
TENSORBOARD_FORMAT = run_tensorboard("{}")
# IAM resource patterns (after "<bucket arn>/") of every run's files of one kind.
ANY_CHECKPOINT = f"{run_checkpoints('*')}*"
ANY_OUTPUT = f"{run_output('*')}*"
ANY_LINEAGE = f"{run_lineage('*')}*"
ANY_LEDGER_RECORD = f"{run_ledger('*')}*"
ANY_PROGRESS_RECORD = f"{run_checkpoints('*')}*{PROGRESS}/*"
"""Every run's progress records, its tuning trials' included (IAM's `*` matches nothing, or spans `/`)."""
ANY_GOODPUT_RECORD = f"{run_lineage('*')}goodput/*"
ANY_MANIFEST = f"{run_checkpoints('*')}*/{MANIFEST}"
"""Every run's checkpoint manifests (IAM's `*` spans `/`: a tuning trial's too)."""


# -- a run's own code ---------------------------------------------------------------------------------
# Packed by `tp` before the run starts, so its prefix is the run's name (its job_name_base is known only once its
# execution starts), under its team's. Written once (S3's If-None-Match), by the team's members for a team's run
# (the artifacts bucket's policy, stacks/data_stack.py); read by Validate and the training roles, written by neither.

CODE = "code/"
"""Every run's packed code, in the artifacts bucket."""
ANY_CODE = f"{CODE}*"
"""Every run's packed code, as IAM resources and `s3:prefix` conditions match it."""


def team_code(team: str) -> str:
    """A team's code prefix, which holds a folder per run name of the team."""
    return f"{CODE}teams/{team}/"


def run_code(run_name: str, team: str | None) -> str:
    """The prefix a run's packed code must be under: its run name's folder in its team's code prefix, or in the
    prefix of the runs of no team."""
    return f"{team_code(team) if team else f'{CODE}runs/'}{run_name}/"


def code_key(run_name: str, team: str | None, sha256: str) -> str:
    """A run's packed code, named by its SHA-256 (contract/user_code.py)."""
    return f"{run_code(run_name, team)}{sha256}{ARCHIVE_SUFFIX}"


def channel_file(prefix: str, key: str) -> str:
    """Where an object of an S3Prefix channel lands in the channel's folder: its key after the prefix, or its file
    name when the prefix is the whole key (a channel of one object, as the code channel is), as SageMaker does."""
    return key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; the key is empty for ``s3://bucket``."""
    match = re.fullmatch(r"s3://([^/]+)(?:/(.*))?", uri)
    if match is None:
        raise ValueError(f"not an S3 URI: {uri!r} (expected s3://<bucket>/<key>)")
    return match.group(1), match.group(2) or ""


# -- the training container's environment -------------------------------------------------------------
# Set by the pipeline on every host (SageMaker's Environment, Batch's container overrides) or by the
# local platform; read by the launcher, the pre-flight check and the Batch contract.

EFA_ENV = "TRAINING_EFA"
""""true" or "false" from the request's `efa`; absent: use EFA where the host has it."""
EXPECTED_GPUS_ENV = "TRAINING_EXPECTED_GPUS"
"""The GPUs every host must see (the instance catalog's); absent locally."""
MIN_BUSBW_ENV = "TRAINING_MIN_BUSBW_GBPS"
"""The pre-flight's all-reduce bus bandwidth floor (GB/s); absent or 0: no floor."""
TRAINING_GROUPS_ENV = "TRAINING_GROUPS"
"""Comma-separated names of the instance groups that train (unset: every host trains)."""
AUXILIARY_START_TIMEOUT_ENV = "TRAINING_AUXILIARY_START_TIMEOUT_SECONDS"
MASTER_ADDR_ENV = "TRAINING_MASTER_ADDR"
MASTER_PORT_ENV = "TRAINING_MASTER_PORT"
NPROC_ENV = "TRAINING_NPROC_PER_NODE"
GRACE_ENV = "TRAINING_SIGTERM_GRACE_SECONDS"
OPT_ML_ROOT_ENV = "OPT_ML_ROOT"
"""Where the /opt/ml tree is (local runs relocate it)."""

# AWS Batch's multi-node variables.
NODE_INDEX_ENV = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES_ENV = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_INDEX_ENV = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_NODE_ADDRESS_ENV = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
ATTEMPT_ENV = "AWS_BATCH_JOB_ATTEMPT"
# Set by the pipeline's SubmitJob on every node of a Batch job.
JOB_NAME_ENV = "TRAINING_JOB_NAME"
HYPERPARAMETERS_ENV = "TRAINING_HYPERPARAMETERS"
CHANNELS_ENV = "TRAINING_CHANNELS"
CHECKPOINTS_ENV = "TRAINING_CHECKPOINTS_S3"
OUTPUT_ENV = "TRAINING_OUTPUT_S3"
FSX_ROOT_ENV = "TRAINING_FSX_ROOT"
"""Where the host mounts FSx for Lustre (stacks/constructs/batch_cluster.py); local runs relocate it."""
SYNC_SECONDS_ENV = "TRAINING_CHECKPOINT_SYNC_SECONDS"
PREPARED_ENV = "TRAINING_BATCH_PREPARED"
"""Set on the launcher child the Batch contract starts: it must not start another."""
LAUNCHED_ENV = "TRAINING_LAUNCHED_MONOTONIC"
"""Set by the launcher as it starts (time.monotonic()): the trainer's phases count from it (contract/goodput.py)."""
PREFLIGHT_ENV = "TRAINING_PREFLIGHT"
"""Set by the launcher on the training workers: the pre-flight checks they run before training (JSON)."""
HEARTBEAT_ENV = "TRAINING_HEARTBEAT_DIR"
"""Set by the launcher on the training workers: where each reports its last finished step (contract/hang.py)."""
EXITS_ENV = "TRAINING_EXITS_DIR"
"""Set by the launcher on the workers of a run's own code: where each records how its script ended."""
CHECKPOINT_DIR_ENV = "TRAINING_CHECKPOINT_DIR"
"""Set by the launcher on the workers of a run's own code: the checkpoint folder the platform syncs
(/opt/ml/checkpoints, SageMaker's CheckpointConfig.LocalPath; SageMaker itself names it in no variable)."""

LEDGER_CHANNEL = "ledger"
"""The input channel that brings every job its run's checkpoint ledger (/opt/ml/input/data/ledger)."""

PREFLIGHT_FAILED = "PreflightFailed"
"""The first word of the failure file's first line when the pre-flight check fails; the pipeline then
retries the job on fresh nodes (SageMaker's FailureReason is "AlgorithmError: " and that line)."""
STRAGGLER_DETECTED = "StragglerDetected"
"""The first word of the failure file's first line when `stragglers.action=replace` stopped training
(after a checkpoint) because a host lagged the others; retried on fresh nodes like a failed pre-flight."""
HANG_DETECTED = "HangDetected"
"""The first word of the failure file's first line when the launcher killed workers that finished no training
step for the hang limit (contract/hang.py); retried on fresh nodes like a failed pre-flight."""
RETRIED_ON_FRESH_NODES = (PREFLIGHT_FAILED, STRAGGLER_DETECTED, HANG_DETECTED, RETRYABLE_EXIT, COMMUNICATION_FAILED)
"""The failure words after which the pipeline starts a new job on fresh instances, from the checkpoints."""
PEER_SYMPTOMS = (HANG_DETECTED, COMMUNICATION_FAILED)
"""Failure words a host writes when another host's failure ended its collectives: where a host failed otherwise,
that failure is the job's cause (a script's own error on one host must not be retried as its peers' lost link)."""
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
"""The error of a job that found too few instances (the monitors' `retry_cause`): the pipeline's next attempt
runs on the request's next fallback cluster, if it has one."""

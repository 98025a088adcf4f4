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

A checkpoint is a directory ``step-<N>/`` whose ``manifest.json`` is written last (training/checkpoint/storage.py);
when it is complete is contract/stored_checkpoints.py's rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

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
    """(bucket, key) of ``s3://bucket/key``; the key is empty for ``s3://bucket``. It judges nothing: a location
    a request gives is read with `location`."""
    match = re.fullmatch(r"s3://([^/]+)(?:/(.*))?", uri)
    if match is None:
        raise ValueError(f"not an S3 URI: {uri!r} (expected s3://<bucket>/<key>)")
    return match.group(1), match.group(2) or ""


# -- locations a request names ------------------------------------------------------------------------
# A location is judged by what it names, and every reader (S3, SageMaker's channels, the file system, the
# checks of this platform) must take it for the same thing: so it must be written in its normal form. S3
# keys are byte strings and FSx paths are POSIX paths: `a//b`, `a/./b`, `a/../b` and `a/%2e%2e/b` are other
# keys than `a/b` for S3, the same or a parent folder for a file system, and whatever an intermediate decodes
# them to. None is read at all: every location a request names goes through `location` once, before any
# check reads it, and what the checks and the jobs receive is its normal form.

S3_SCHEME = "s3://"
FSX_SCHEME = "fsx://"
FSX_DATASETS = "/datasets/"
"""The file system's link to the datasets bucket's root (stacks/constructs/lustre.py): fsx:///datasets/<p>/ reads
the bucket's key prefix <p>/."""
_SEGMENT = re.compile(r"[A-Za-z0-9!_.'()=-]+")
"""S3's safe key characters (letters, digits, ! - _ . ' ( ) and the =, of key=value folders), less `*`, which
IAM and shells read as a wildcard: nothing that an S3 client, a URI parser or a shell changes or decodes."""
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class LocationError(ValueError):
    """A location not written in its normal form, or naming a root: the message says what to write."""


@dataclass(frozen=True)
class Location:
    """A location in its normal form: an S3 key (`bucket` set) or an absolute FSx path (`bucket` empty)."""

    bucket: str
    key: str
    """The S3 key, or the FSx path from its root ('/datasets/x/'); a folder's ends with '/'."""

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key}" if self.bucket else f"{FSX_SCHEME}{self.key}"


def normal_key(key: str, *, folder: bool = True) -> str:
    """`key` (an S3 key, or a path below a root) when it is normal: segments of S3's safe characters, none empty,
    `.` or `..`; a folder's ends with '/', which its writer may leave out. LocationError says what is wrong."""
    body = key.removesuffix("/") if folder else key
    if not body:
        raise LocationError("names a root, not a folder under it")
    if key.endswith("/") and not folder:
        raise LocationError("names a folder; give an object's key")
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            shown = {"": "an empty segment ('//' or a leading '/')", ".": "a '.' segment", "..": "a '..' segment"}
            raise LocationError(f"has {shown[segment]}; write the folder as it is, each name once")
        if not _SEGMENT.fullmatch(segment):
            odd = sorted({c for c in segment if not _SEGMENT.fullmatch(c)})
            raise LocationError(
                f"has {''.join(odd)!r} in {segment!r}; use letters, digits and ! - _ . ' ( ) = only (no "
                "percent-encoding, spaces, '*', '?', '#' or '\\')"
            )
    return f"{body}/" if folder else body


def location(uri: str, *, folder: bool = True) -> Location:
    """The normal form of an ``s3://<bucket>/<key>`` or ``fsx:///<path>`` location, which must be how it is
    written (a folder may leave out its last '/'); LocationError for any other, a bucket's or the file system's
    root included. What it may name (which bucket, which root) is the caller's to judge, on what this returns."""
    if uri.startswith(S3_SCHEME):
        bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
        if not _BUCKET.fullmatch(bucket):
            raise LocationError(f"{uri!r}: {bucket!r} is not an S3 bucket name; write s3://<bucket>/<key>")
        try:
            return Location(bucket, normal_key(key, folder=folder))
        except LocationError as exc:
            raise LocationError(f"{uri!r} {exc}") from None
    if uri.startswith(FSX_SCHEME):
        path = uri[len(FSX_SCHEME) :]
        if not path.startswith("/"):
            raise LocationError(f"{uri!r}: an FSx location is a path from the file system's root; write fsx:///<path>")
        try:
            return Location("", "/" + normal_key(path[1:], folder=folder))
        except LocationError as exc:
            raise LocationError(f"{uri!r} {exc}") from None
    raise LocationError(f"{uri!r}: give s3://<bucket>/<key> or fsx:///<path>")


def dataset_prefix(uri: str, *, datasets_bucket: str) -> str:
    """The datasets-bucket key prefix (ending '/') a dataset location reads, in either form: s3://<datasets
    bucket>/<prefix>/ or fsx:///datasets/<prefix>/ (`FSX_DATASETS`); LocationError for any other location, the
    bucket's root (or the file system's /datasets/) included."""
    found = location(uri)
    if found.bucket:
        if found.bucket != datasets_bucket:
            raise LocationError(f"{uri!r} is not in the datasets bucket; give s3://{datasets_bucket}/<prefix>/")
        return found.key
    if not found.key.startswith(FSX_DATASETS) or found.key == FSX_DATASETS:
        raise LocationError(
            f"{uri!r}: FSx datasets are folders under {FSX_SCHEME}{FSX_DATASETS} (the file system's link to the "
            "datasets bucket)"
        )
    return found.key.removeprefix(FSX_DATASETS)


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


def on_batch(env: Mapping[str, str]) -> bool:
    """Whether the entrypoint runs as a Batch node that still has to prepare (not the launcher child)."""
    return NODE_INDEX_ENV in env and PREPARED_ENV not in env


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

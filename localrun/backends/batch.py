"""AWS Batch multi-node parallel jobs, run for real on this machine by the image's own entrypoint.

moto's Batch would start Docker containers; this plays the job API instead (SubmitJob, DescribeJobs,
ListJobs, TerminateJob). A submitted job's nodes are the image's Batch entrypoint
(training/batch_contract.py) on localhost, one per node, with Batch's variables
(AWS_BATCH_JOB_NODE_INDEX, AWS_BATCH_JOB_NUM_NODES, AWS_BATCH_JOB_MAIN_NODE_INDEX, and on the
other nodes AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS) and the submit's environment overrides;
their launchers form one torchrun job over loopback (gloo). Each node's entrypoint runs in a thread
of this process so that its S3 calls (channels, checkpoints, its result) go to moto signed with a
session of the job definition's job role: IAM is enforced as in AWS. FSx is a local directory
holding what the datasets bucket holds, as the file system's lazy load would.

A node lost with its host is played as Batch reports it: every process of the node is killed, the attempt
ends with statusReason "Host EC2 (instance ...) terminated.", and the job definition's retry
strategy starts a new attempt whose nodes restore the run's checkpoints from S3.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from botocore.credentials import Credentials
from moto.batch.responses import BatchResponse
from moto.core.exceptions import JsonRESTError

from contract import layout
from contract.metrics import parse_metrics
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.engine import LocalPlatform
from localrun.aws.service_logs import ServiceLogs
from localrun.backends import processes
from localrun.backends.sagemaker import REPO, _download_prefix, _free_port
from localrun.demo.jobs import Job, checkpoint_steps, loss_curve, recorded_checkpoints
from stacks.outputs import BATCH_JOB_LOG_GROUP
from training import batch_contract

ECS_TASKS = "ecs-tasks.amazonaws.com"
# ECS stops a container SIGTERM first, then SIGKILL after its stop timeout (30 s by default).
STOP_TIMEOUT_SECONDS = 30
HOST_LOST = "Host EC2 (instance {instance}) terminated."
CONTAINER_EXITED = "Essential container in task exited"
ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Node:
    index: int
    root: Path
    """The node's /opt/ml tree (its OPT_ML_ROOT): every process of its container carries it."""
    thread: threading.Thread | None = None
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    exited_at: int | None = None
    """When the node's entrypoint returned (ms): its container's end."""
    lost: bool = False
    pending: int | None = None
    """A signal sent while the node prepared, before its launcher existed: ECS signals the container's main
    process then (the entrypoint, which the signal ends); here the launcher gets it as it starts."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Guards `process` and `pending`: a signal reaches the node once, before or after its launcher starts."""
    lines: list[str] = field(default_factory=list)
    """The node's container's output, which the awslogs driver ships to its stream (localrun/aws/service_logs.py)."""


@dataclass
class Attempt:
    number: int
    nodes: list[Node]
    started_at: int = field(default_factory=_now_ms)
    stopped_at: int | None = None
    status_reason: str = ""


@dataclass
class BatchJob:
    job_id: str
    name: str
    queue: str
    definition: str
    num_nodes: int
    environment: dict[str, str]
    tags: dict[str, str]
    role_arn: str
    workdir: Path
    container: dict[str, Any] = field(default_factory=dict)
    """Its nodes' container as DescribeJobs gives it: the job definition's, with the submit's overrides."""
    timeout: dict[str, Any] = field(default_factory=dict)
    created_at: int = field(default_factory=_now_ms)
    status: str = "RUNNABLE"
    status_reason: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    max_attempts: int = 1
    retry_on_status: list[str] = field(default_factory=list)
    stopped_at: int | None = None
    terminating: str | None = None
    log: list[str] = field(default_factory=list)

    @property
    def arn(self) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:job/{self.job_id}"


@dataclass
class LocalBatch:
    """The Batch job API, played on this machine; `scenario` fields script what the cloud would do."""

    root: Path
    datasets_bucket: str
    max_nodes: int = 2
    local_hyperparameters: dict[str, str] = field(default_factory=dict)
    kill_node_after_checkpoint: int | None = None
    """Lose this node's host once the run's first checkpoint is in S3 (once per runner)."""
    no_capacity_for: int = 0
    """This many jobs wait in RUNNABLE as if no instances came, submitted long enough ago to count as stuck."""
    lose_submit_responses: int = 0
    """This many submits create their job and then fail, as an answer lost on the way back would."""
    on_line: Callable[[str, str], None] | None = None
    jobs: dict[str, BatchJob] = field(default_factory=dict)
    credentials: Callable[[str], Credentials] | None = None
    definitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Job definitions by ARN, as their templates give them (LocalPlatform binds these)."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._client_lock = threading.Lock()
        self._service_logs = ServiceLogs(BATCH_JOB_LOG_GROUP)
        self._killed = False
        self._base_env = {
            k: v
            for k, v in os.environ.copy().items()
            if not k.startswith(("SM_", "TRAINING_", "OPT_ML", "AWS_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))
        }

    def bind(self, platform: LocalPlatform) -> None:
        """Act as the job role (when the platform enforces IAM) and run the assembly's job definitions."""
        if platform.enforce_iam:
            self.credentials = lambda role: platform.iam.credentials(role, ECS_TASKS)
        # By ARN, their properties resolved as CloudFormation would.
        self.definitions = {
            str(platform.resolver.ref(stack, logical)): platform.resolver.resolve(stack, resource["Properties"])
            for stack, logical, resource in platform.assembly.resources("AWS::Batch::JobDefinition")
        }

    def job_facts(self) -> list[Job]:
        """Each job as the local runner played it: its nodes' log, its attempts, its checkpoints in S3."""
        return [_facts(job) for job in self.jobs.values()]

    # -- the API ----------------------------------------------------------------------------------
    def submit(self, params: dict[str, Any]) -> dict[str, str]:
        definition_arn = params["jobDefinition"]
        definition = self.definitions.get(definition_arn)
        if definition is None:
            raise JsonRESTError("ClientException", f"Job definition {definition_arn} does not exist")
        overrides = params.get("nodeOverrides", {})
        num_nodes = int(overrides.get("numNodes", definition["NodeProperties"]["NumNodes"]))
        environment = {
            e["name"]: e["value"]
            for o in overrides.get("nodePropertyOverrides", [])
            for e in o.get("containerOverrides", {}).get("environment", [])
        }
        container = definition["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        retry = definition.get("RetryStrategy", {})
        merged = {**{e["Name"]: e["Value"] for e in container.get("Environment", [])}, **environment}
        overridden = {
            key: value
            for o in overrides.get("nodePropertyOverrides", [])
            for key, value in o.get("containerOverrides", {}).items()
            if key in ("command", "instanceType", "resourceRequirements")
        }
        job = BatchJob(
            job_id=str(uuid.uuid4()),
            name=params["jobName"],
            queue=params["jobQueue"],
            definition=definition_arn,
            num_nodes=num_nodes,
            environment=merged,
            tags=params.get("tags", {}),
            role_arn=container["JobRoleArn"],
            container={
                **_as_api(container),
                "environment": [{"name": k, "value": v} for k, v in merged.items()],
                **overridden,
            },
            timeout=params.get("timeout", {}),
            workdir=self.root / params["jobName"],
            max_attempts=int(retry.get("Attempts", 1)),
            retry_on_status=[
                r["OnStatusReason"]
                for r in retry.get("EvaluateOnExit", [])
                if r.get("Action") == "RETRY" and "OnStatusReason" in r
            ],
        )
        with self._lock:
            self.jobs[job.job_id] = job
            if self.no_capacity_for > 0:
                self.no_capacity_for -= 1
                job.created_at -= 24 * 3600 * 1000  # waited long past any capacity limit
                self._say(job, "-- no capacity: the job waits in RUNNABLE --")
            else:
                self._start_attempt(job)
            if self.lose_submit_responses > 0:
                self.lose_submit_responses -= 1
                raise JsonRESTError("ServerException", "the connection closed before the answer was read")
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job.job_id}

    def describe(self, ids: list[str]) -> list[dict[str, Any]]:
        """The jobs; `<id>#<node>` is a multi-node job's node, a child job of its own (with its log stream)."""
        out = []
        for ident in ids:
            parent, _, node = ident.rsplit("/", 1)[-1].partition("#")
            job = self.jobs.get(parent)
            if job is not None:
                with self._lock:
                    self._advance(job)
                    self._ship_logs(job)
                    out.append(self._describe_node(job, int(node)) if node.isdigit() else self._describe(job))
        return out

    def _ship_logs(self, job: BatchJob) -> None:
        for attempt in job.attempts:
            for node in attempt.nodes:
                self._service_logs.ship_lines(self._stream(job, attempt, node.index), node.lines)

    @staticmethod
    def _stream(job: BatchJob, attempt: Attempt, node: int) -> str:
        """The awslogs driver's stream: <definition name>/default/<task id> (here the job, attempt and node)."""
        definition = job.definition.rsplit("/", 1)[-1].split(":", 1)[0]
        return f"{definition}/default/{job.job_id}-{attempt.number}-{node}"

    def _describe_node(self, job: BatchJob, node: int) -> dict[str, Any]:
        """A node's child job: its status and, per attempt it ran in, its container's log stream."""
        ran = [a for a in job.attempts if node < len(a.nodes)]
        streams = [{"container": {"logStreamName": self._stream(job, a, node)}} for a in ran]
        described: dict[str, Any] = {
            "jobId": f"{job.job_id}#{node}",
            "jobName": job.name,
            "status": job.status,
            "nodeDetails": {"nodeIndex": node, "isMainNode": node == 0},
            "attempts": streams[:-1],
        }
        if streams:
            described["container"] = streams[-1]["container"]
        return described

    def list_jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        queue, filters = params.get("jobQueue"), params.get("filters") or []
        names = [v for f in filters if f["name"] == "JOB_NAME" for v in f["values"]]
        status = params.get("jobStatus") or "RUNNING"
        out = []
        with self._lock:
            for job in self.jobs.values():
                self._advance(job)
                if queue and job.queue != queue:
                    continue
                if names and not any(job.name.startswith(n[:-1]) if n.endswith("*") else job.name == n for n in names):
                    continue
                if not names and job.status != status:  # Batch ignores jobStatus when a filter is given
                    continue
                out.append(
                    {
                        "jobArn": job.arn,
                        "jobId": job.job_id,
                        "jobName": job.name,
                        "status": job.status,
                        "createdAt": job.created_at,
                    }
                )
        return out

    def terminate(self, ident: str, reason: str) -> None:
        with self._lock:
            job = self.jobs.get(ident)
            if job is None:
                raise JsonRESTError("ClientException", f"Job {ident} does not exist")
            if job.status not in ACTIVE:
                return
            job.terminating = reason
            if not job.attempts or job.status == "RUNNABLE":
                self._end(job, "FAILED", reason)
                return
            self._say(job, f"-- TerminateJob: {reason}; SIGTERM to every node --")
            for node in job.attempts[-1].nodes:
                self._signal(node, signal.SIGTERM)

    # -- nodes --------------------------------------------------------------------------------------
    def _start_attempt(self, job: BatchJob) -> None:
        number = len(job.attempts) + 1
        attempt = Attempt(
            number=number,
            nodes=[
                Node(i, job.workdir / f"attempt-{number}" / f"node-{i}")
                for i in range(min(job.num_nodes, self.max_nodes))
            ],
        )
        job.attempts.append(attempt)
        job.status = "RUNNING"
        fsx = job.workdir / "fsx"
        self._load_fsx(job, fsx)
        port = _free_port()
        hyperparameters = {
            **json.loads(job.environment.get(layout.HYPERPARAMETERS_ENV, "{}")),
            **self.local_hyperparameters,
        }
        for node in attempt.nodes:
            env = dict(self._base_env)
            env.update(job.environment)
            env.update(
                {
                    layout.NODE_INDEX_ENV: str(node.index),
                    layout.NUM_NODES_ENV: str(len(attempt.nodes)),
                    layout.MAIN_NODE_INDEX_ENV: "0",
                    layout.ATTEMPT_ENV: str(attempt.number),
                    layout.HYPERPARAMETERS_ENV: json.dumps(hyperparameters),
                    layout.FSX_ROOT_ENV: str(fsx),
                    layout.SYNC_SECONDS_ENV: "0.5",
                    "AWS_BATCH_JOB_ID": job.job_id,
                    layout.OPT_ML_ROOT_ENV: str(node.root),
                    # Loopback CPU processes: no EFA device, no GPU, no bandwidth floor (as sagemaker_local.py).
                    layout.EFA_ENV: "false",
                    layout.EXPECTED_GPUS_ENV: "0",
                    layout.MIN_BUSBW_ENV: "0",
                    layout.MASTER_PORT_ENV: str(port),
                    layout.NPROC_ENV: "1",
                    "PYTHONPATH": str(REPO),
                    "OMP_NUM_THREADS": "1",
                }
            )
            if node.index != 0:
                env[layout.MAIN_NODE_ADDRESS_ENV] = "127.0.0.1"
            node.thread = threading.Thread(target=self._run_node, args=(job, attempt, node, env), daemon=True)
        for node in attempt.nodes:
            assert node.thread is not None
            node.thread.start()
        if self.kill_node_after_checkpoint is not None and not self._killed:
            threading.Thread(target=self._lose_host_after_checkpoint, args=(job, attempt), daemon=True).start()
        self._say(job, f"-- attempt {attempt.number}: {len(attempt.nodes)} nodes started --")

    def _run_node(self, job: BatchJob, attempt: Attempt, node: Node, env: dict[str, str]) -> None:
        batch_node = batch_contract.batch_node(env)
        assert batch_node is not None

        def started(process: subprocess.Popen[bytes]) -> None:
            with node.lock:
                node.process, pending = process, node.pending
            if pending is not None:
                self._signal(node, pending)

        def echo(line: str) -> None:
            job.log.append(line)
            node.lines.append(line)
            if node.index == 0:
                self._say(job, line.rstrip("\n"))

        # The container starts here: the launcher's clock (contract/goodput.py) counts from it, as in the image.
        env = {**env, layout.LAUNCHED_ENV: repr(time.monotonic())}
        try:
            exit_code = batch_contract.run(batch_node, env, self._s3(job), echo=echo, started=started)
        except Exception as exc:  # the entrypoint itself failed (an S3 call IAM refused, say)
            job.log.append(f"node {node.index}: {type(exc).__name__}: {exc}\n")
            self._say(job, f"-- node {node.index} entrypoint failed: {type(exc).__name__}: {exc} --")
            exit_code = 1
        node.exited_at = _now_ms()
        # The container ends with its main process, and every process still in it with the container.
        processes.end([], node.root)
        node.exit_code = exit_code

    def _s3(self, job: BatchJob) -> Any:
        """An S3 client acting as the job role, as the container's credentials would."""
        with self._client_lock:
            if self.credentials is None:
                return boto3.client("s3", region_name=REGION)
            session = self.credentials(job.role_arn)
            return boto3.client(
                "s3",
                region_name=REGION,
                aws_access_key_id=session.access_key,
                aws_secret_access_key=session.secret_key,
                aws_session_token=session.token,
            )

    def _load_fsx(self, job: BatchJob, fsx: Path) -> None:
        """What the FSx channels name, from the datasets bucket (the file system's lazy load, with FSx's own role)."""
        channels = json.loads(job.environment.get(layout.CHANNELS_ENV, "[]"))
        for channel in channels:
            source = channel["DataSource"].get("FileSystemDataSource")
            if source is None:
                continue
            relative = source["DirectoryPath"].split("/datasets/", 1)[1].strip("/")
            target = fsx / "datasets" / relative
            if not target.exists():
                with self._client_lock:
                    s3 = boto3.client("s3", region_name=REGION)
                _download_prefix(s3, self.datasets_bucket, relative + "/", target)

    def _lose_host_after_checkpoint(self, job: BatchJob, attempt: Attempt) -> None:
        """Lose a node's host once the platform has recorded a checkpoint of the run, while it still has steps to go.

        The node is frozen as soon as a checkpoint is committed on the hosts, before that checkpoint
        reaches S3: its peers then wait in their next collective, so the run cannot finish while the
        checkpoint uploads and PollBatchJob records it in the run's ledger, however fast its steps are.
        Then the host is lost with every process on it.
        """
        node = attempt.nodes[min(self.kill_node_after_checkpoint or 0, len(attempt.nodes) - 1)]
        hosts = job.workdir / f"attempt-{attempt.number}"

        def running() -> bool:
            return all(n.exit_code is None for n in attempt.nodes) and job.terminating is None

        while running() and not any(hosts.glob(f"node-*/checkpoints/{layout.MANIFEST_GLOB}")):
            time.sleep(0.02)
        if not running() or node.process is None:
            return
        processes.freeze(node.process.pid)
        with self._client_lock:
            s3 = boto3.client("s3", region_name=REGION)
        channels = json.loads(job.environment[layout.CHANNELS_ENV])
        while running():
            # The retried attempt resumes only from what the run's ledger records (contract/ledger.py).
            if recorded_checkpoints(s3, channels):
                break
            time.sleep(0.1)
        self._killed = True
        node.lost = True
        self._say(job, f"-- node {node.index}'s host is lost (EC2 terminated it) --")
        self._signal(node, signal.SIGKILL)

    @staticmethod
    def _signal(node: Node, signum: int) -> None:
        """SIGTERM to the container's main process (ECS's stop); SIGKILL to every process of the container. A
        node still preparing gets it as its launcher starts (`Node.pending`)."""
        with node.lock:
            if node.process is None:
                node.pending = signal.SIGKILL if signal.SIGKILL in (signum, node.pending) else signum
            if signum == signal.SIGKILL:
                processes.end([node.process] if node.process is not None else [], node.root)
            elif node.process is not None and node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signum)

    # -- state --------------------------------------------------------------------------------------
    def _advance(self, job: BatchJob) -> None:
        """Bring the job up to date: an attempt ends when a node fails or every node is done."""
        if job.status not in ("RUNNING", "STARTING") or not job.attempts:
            return
        attempt = job.attempts[-1]
        codes = [n.exit_code for n in attempt.nodes]
        failed = any(c not in (None, 0) for c in codes) or any(n.lost for n in attempt.nodes)
        if job.terminating is not None and None in codes:
            if _now_ms() - (attempt.stopped_at or _now_ms()) > STOP_TIMEOUT_SECONDS * 1000:
                for node in attempt.nodes:
                    self._signal(node, signal.SIGKILL)
            attempt.stopped_at = attempt.stopped_at or _now_ms()
            return
        if None in codes and not failed:
            return
        # One node failed: Batch stops the attempt's other nodes.
        for node in attempt.nodes:
            self._signal(node, signal.SIGKILL)
        for node in attempt.nodes:
            if node.thread is not None:
                node.thread.join(timeout=60)
        # The attempt stopped when its last container ended, not when this poll noticed.
        attempt.stopped_at = max((n.exited_at for n in attempt.nodes if n.exited_at is not None), default=_now_ms())
        if job.terminating is not None:
            attempt.status_reason = CONTAINER_EXITED
            self._end(job, "FAILED", job.terminating)
            return
        if not failed:
            attempt.status_reason = CONTAINER_EXITED
            self._end(job, "SUCCEEDED", CONTAINER_EXITED)
            return
        lost = any(n.lost for n in attempt.nodes)
        attempt.status_reason = (
            HOST_LOST.format(instance=f"i-{job.job_id[:17].replace('-', '')}") if lost else CONTAINER_EXITED
        )
        retry = lost and any(attempt.status_reason.startswith(p.rstrip("*")) for p in job.retry_on_status)
        if retry and len(job.attempts) < job.max_attempts:
            self._say(job, f"-- attempt {attempt.number} failed: {attempt.status_reason} Batch retries the job --")
            self._start_attempt(job)
            return
        self._end(job, "FAILED", attempt.status_reason)

    def _end(self, job: BatchJob, status: str, reason: str) -> None:
        job.status, job.status_reason, job.stopped_at = status, reason, _now_ms()
        self._say(job, f"-- job {status}: {reason} --")

    def _describe(self, job: BatchJob) -> dict[str, Any]:
        described: dict[str, Any] = {
            "jobArn": job.arn,
            "jobName": job.name,
            "jobId": job.job_id,
            "jobQueue": job.queue,
            "jobDefinition": job.definition,
            "status": job.status,
            "statusReason": job.status_reason,
            "createdAt": job.created_at,
            "tags": job.tags,
            "timeout": job.timeout,
            "nodeProperties": {
                "numNodes": job.num_nodes,
                "mainNode": 0,
                "nodeRangeProperties": [{"targetNodes": "0:", "container": job.container}],
            },
            "attempts": [
                {
                    "startedAt": a.started_at,
                    "stoppedAt": a.stopped_at,
                    "statusReason": a.status_reason,
                    "container": {"exitCode": a.nodes[0].exit_code},
                }
                for a in job.attempts
                if a.stopped_at is not None and (a is not job.attempts[-1] or job.status not in ACTIVE)
            ],
        }
        if job.attempts:
            described["startedAt"] = job.attempts[0].started_at
        if job.stopped_at is not None:
            described["stoppedAt"] = job.stopped_at
        return described

    def _say(self, job: BatchJob, line: str) -> None:
        if self.on_line is not None:
            self.on_line(job.name, line)

    def close(self) -> None:
        """Kill every node still running (the platform is closing)."""
        with self._lock:
            for job in self.jobs.values():
                for attempt in job.attempts:
                    for node in attempt.nodes:
                        self._signal(node, signal.SIGKILL)

    # -- moto ----------------------------------------------------------------------------------------
    def patches(self) -> list[Any]:
        """moto's Batch responses answered by this runner (moto's own would start Docker containers)."""

        def params(response: Any) -> dict[str, Any]:
            return json.loads(response.body) if response.body else {}

        def submit(response: Any) -> str:
            return json.dumps(self.submit(params(response)))

        def describe(response: Any) -> str:
            return json.dumps({"jobs": self.describe(params(response)["jobs"])})

        def list_jobs(response: Any) -> str:
            return json.dumps({"jobSummaryList": self.list_jobs(params(response))})

        def terminate(response: Any) -> str:
            body = params(response)
            self.terminate(body["jobId"], body.get("reason", ""))
            return "{}"

        def describe_definitions(response: Any) -> str:
            named = params(response).get("jobDefinitions") or []
            return json.dumps({"jobDefinitions": [self.described_definition(arn) for arn in named]})

        return [
            mock.patch.object(BatchResponse, name, method)
            for name, method in (
                ("submitjob", submit),
                ("describejobs", describe),
                ("listjobs", list_jobs),
                ("terminatejob", terminate),
                ("describejobdefinitions", describe_definitions),
            )
        ]

    def described_definition(self, arn: str) -> dict[str, Any]:
        """A job definition as DescribeJobDefinitions gives it (the API's names for the template's properties)."""
        definition = self.definitions.get(arn)
        if definition is None:
            raise JsonRESTError("ClientException", f"Job definition {arn} does not exist")
        return {"jobDefinitionArn": arn, "status": "ACTIVE", **_as_api(definition)}


def _as_api(value: Any) -> Any:
    """CloudFormation's property names as the Batch API's (`JobRoleArn` -> `jobRoleArn`), at every level."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _as_api(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_api(item) for item in value]
    return value


def local_player(
    root: Path, *, max_hosts: int, spot_interrupt: bool, on_line: Callable[[str, str], None]
) -> LocalBatch:
    """The demo's AWS Batch: a job's nodes on this machine; `spot_interrupt` loses a node's host once."""
    return LocalBatch(
        root=root,
        datasets_bucket="",
        max_nodes=max_hosts,
        kill_node_after_checkpoint=1 if spot_interrupt else None,
        on_line=on_line,
    )


def _facts(job: BatchJob) -> Job:
    log = "".join(job.log)
    train, val = loss_curve(log)
    checkpoints_uri = job.environment[layout.CHECKPOINTS_ENV]
    return Job(
        name=job.name,
        log=log,
        train_loss=train,
        val_loss=val,
        status=job.status,
        secondary_status=None,
        failure=job.status_reason if job.status == "FAILED" else None,
        notes=[f"AWS Batch attempt {a.number}: {a.status_reason or 'running'}" for a in job.attempts],
        transitions=[f"attempt {a.number}" for a in job.attempts],
        metrics={name: values[-1] for name, values in sorted(parse_metrics(log).items())},
        checkpoints_uri=checkpoints_uri,
        checkpoint_steps=checkpoint_steps(checkpoints_uri),
    )

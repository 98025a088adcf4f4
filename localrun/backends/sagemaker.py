"""SageMaker training jobs, run for real on this machine by the project's own launcher.

When the state machine creates a training job, this lays out one `/opt/ml` tree per "host"
from the CreateTrainingJob request (hyperparameters, resourceconfig.json, data channels
copied from the datasets bucket as FSx would lazy-load them, the run's checkpoints restored
from S3) and starts `python -m training.launcher train` for each host, which form one
torchrun job over localhost. DescribeTrainingJob then reports what really happens: InProgress
while the launchers run, Completed with the final metrics SageMaker's MetricDefinitions would
parse from the log, or Failed with the first line of /opt/ml/output/failure. Checkpoints are
synced to the request's S3 URI as SageMaker does, and the model is uploaded as model.tar.gz.

Every S3 call the runner makes on the job's behalf (S3 channels, checkpoints, the model upload)
is signed with a session of the job's execution role, so the role's policies are enforced as
they would be in AWS. FSx channels are read as the file system reads its linked bucket (FSx's
own service role, outside the platform's templates), with the harness's credentials.

A spot interruption is played as SageMaker plays it: SIGTERM to every host (the trainer
checkpoints and exits), secondary status Interrupted, then fresh hosts whose checkpoints are
restored from S3, which resume the run. A hang, when asked for, is a training worker of the run's
first job stopped (SIGSTOP) mid-run, which the launcher's hang check must find (training/hang.py). A cluster
without capacity, when asked for, fails each job on it before any host starts, as SageMaker fails a job it cannot
provision (NO_CAPACITY).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.credentials import Credentials

from contract.layout import (
    EFA_ENV,
    EXPECTED_GPUS_ENV,
    JOB_NAME_ENV,
    MANIFEST,
    MANIFEST_GLOB,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    MIN_BUSBW_ENV,
    NPROC_ENV,
    OPT_ML_ROOT_ENV,
    TRAINING_GROUPS_ENV,
    channel_file,
    split_s3_uri,
)
from contract.metrics import parse_metrics
from localrun.aws.cfn import REGION
from localrun.aws.service_logs import ServiceLogs
from localrun.backends import netns, processes
from localrun.backends.netns import LoopbackNamespace
from localrun.demo.jobs import recorded_checkpoints
from stacks.outputs import SAGEMAKER_TRAINING_LOG_GROUP

REPO = Path(__file__).resolve().parents[2]
# SageMaker's StopTrainingJob: SIGTERM, then SIGKILL after 120 seconds.
STOP_GRACE_SECONDS = 120


def _download_prefix(s3: Any, bucket: str, prefix: str, target: Path) -> None:
    """Every object under an S3 prefix into `target`, keeping the relative paths (a prefix that is a whole key:
    the object by its name, as the code channel's archive)."""
    target.mkdir(parents=True, exist_ok=True)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            destination = target / channel_file(prefix, obj["Key"])
            destination.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(destination))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# SageMaker's FailureReason for a job it could not find the instances of (AWS Batch reads the same prefix as
# CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY); the platform's monitor classifies it as insufficient capacity.
NO_CAPACITY = (
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type."
)
_NO_FAULT = "training ended before a checkpoint was recorded: no fault played"


# What the launcher's workers run: the built-in trainer, or a run's own code under training/user_worker.py.
_WORKERS = (b"training.train", b"training.user_worker")


def _training_worker(launcher: int) -> int | None:
    """A training worker under a host's launcher: a process that runs the trainer or a run's own code itself, not
    torchrun."""
    for pid in reversed(processes.tree(launcher)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(worker in argv for worker in _WORKERS) and b"torch.distributed.run" not in argv:
            return pid
    return None


@dataclass
class LocalJob:
    name: str
    request: dict[str, Any]
    workdir: Path
    hosts: list[str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log: Path | None = None
    generation: int = 0
    restarting: bool = False
    stopping: bool = False
    stop_requested_at: float = 0.0
    finished: bool = False
    synced: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    exited_at: datetime | None = None
    """When the current generation's processes had all exited (the container's end)."""
    without_capacity: bool = False
    """Its cluster has no capacity: it fails without starting a host (LocalTraining.short_clusters)."""
    namespace: LoopbackNamespace | None = None
    """The hosts' loopback-only network, when the request asks for network isolation."""
    notes: list[str] = field(default_factory=list)
    groups: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """A heterogeneous cluster's instance groups: name -> (instance type, hosts); empty for one group."""
    primary: str = "algo-1"
    """The first host that trains: its log is followed, its model uploaded."""

    def group_of(self, host: str) -> str | None:
        return next((name for name, (_, hosts) in self.groups.items() if host in hosts), None)

    def tree(self, host: str) -> Path:
        return self.workdir / f"gen-{self.generation}" / host


@dataclass
class LocalTraining:
    """Runs each created job with real processes; `scale` maps the request onto this machine."""

    root: Path
    datasets_bucket: str
    max_hosts: int = 2
    procs_per_host: int = 1
    local_hyperparameters: dict[str, str] = field(default_factory=dict)
    scale: Callable[[dict[str, str]], dict[str, str]] | None = None
    """What this machine runs instead of a job's own hyperparameters, decided job by job (over
    `local_hyperparameters`): the served platform's runs are whatever `tp start` sends."""
    spot_interrupt_after_checkpoint: bool = False
    hang_after_checkpoint: bool = False
    """Stop a training worker of the first job once the platform recorded a checkpoint: it makes no progress."""
    short_clusters: int = 0
    """The first this many clusters the jobs ask for (cluster_of) have no capacity: every job on one fails as
    SageMaker fails a job it cannot provision (NO_CAPACITY), and a job on a later cluster runs."""
    on_line: Callable[[str, str], None] | None = None
    jobs: dict[str, LocalJob] = field(default_factory=dict)
    credentials: Callable[[str], Credentials] | None = None
    """A session of an execution role (LocalPlatform binds this); None signs as the harness."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        # `paused`: whether hosts are held, and the pids it stopped (hosts started meanwhile included).
        self._spawn_lock = threading.Lock()
        self._service_logs = ServiceLogs(SAGEMAKER_TRAINING_LOG_GROUP)
        self._streams: dict[Path, str] = {}
        self._paused = False
        self._frozen: dict[int, str | None] = {}
        self._clusters: list[str] = []
        """The clusters the jobs asked for, in the order first asked."""
        # The process environment as the job starts (handler variables are not in it: localrun/aws/environ.py).
        self._base_env = {
            k: v
            for k, v in os.environ.copy().items()
            if not k.startswith(("SM_", "TRAINING_", "OPT_ML", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))
        }

    # -- TrainingBackend ------------------------------------------------------------------------
    def bind(self, credentials: Callable[[str], Credentials]) -> None:
        self.credentials = credentials

    def _s3(self, local: LocalJob) -> Any:
        """An S3 client acting as the job's execution role, as SageMaker does."""
        if self.credentials is None:
            return boto3.client("s3", region_name=REGION)
        session = self.credentials(local.request["RoleArn"])
        return boto3.client(
            "s3",
            region_name=REGION,
            aws_access_key_id=session.access_key,
            aws_secret_access_key=session.secret_key,
            aws_session_token=session.token,
        )

    def created(self, name: str, request: dict[str, Any], job: Any) -> None:
        local = self._cluster(name, request)
        self.jobs[name] = local
        cluster = cluster_of(request)
        if cluster not in self._clusters:
            self._clusters.append(cluster)
        if self._clusters.index(cluster) < self.short_clusters:
            local.without_capacity = True
            self._note(local, f"no capacity for {cluster}: the job fails before any instance starts")
            return
        # Billed from here, as SageMaker bills from TrainingStartTime: the download is billed, the launch not.
        job.training_start_time = datetime.now(UTC)
        self._start(local, job)
        if self.spot_interrupt_after_checkpoint:
            threading.Thread(target=self._reclaim_after_first_checkpoint, args=(local, job), daemon=True).start()
        if self.hang_after_checkpoint and len(self.jobs) == 1:
            threading.Thread(target=self._hang_after_first_checkpoint, args=(local,), daemon=True).start()

    def _cluster(self, name: str, request: dict[str, Any]) -> LocalJob:
        """The job's hosts, at most `max_hosts` per group; a heterogeneous cluster's hosts in group order."""
        resource = request["ResourceConfig"]
        if "InstanceGroups" not in resource:
            count = min(int(resource["InstanceCount"]), self.max_hosts)
            return LocalJob(name, request, self.root / name, [f"algo-{i + 1}" for i in range(count)])
        groups: dict[str, tuple[str, list[str]]] = {}
        hosts: list[str] = []
        for group in resource["InstanceGroups"]:
            members = [f"algo-{len(hosts) + i + 1}" for i in range(min(int(group["InstanceCount"]), self.max_hosts))]
            groups[group["InstanceGroupName"]] = (group["InstanceType"], members)
            hosts += members
        training = request.get("Environment", {}).get(TRAINING_GROUPS_ENV, "").split(",")
        primary = next(h for h in hosts if any(h in groups[g][1] for g in training if g in groups))
        return LocalJob(name, request, self.root / name, hosts, groups=groups, primary=primary)

    def stopped(self, name: str, job: Any) -> None:
        """StopTrainingJob: SIGTERM to every host (the trainer checkpoints and exits), as SageMaker does."""
        local = self.jobs[name]
        with self._spawn_lock:  # as `_spawn` starts a host: one or the other sends it the SIGTERM, once
            local.stopping, local.stop_requested_at = True, time.monotonic()
            for process in local.processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)

    def described(self, name: str, job: Any) -> None:
        with self._lock:
            local = self.jobs[name]
            self._ship_logs(local)
            if local.finished or local.restarting:
                return
            if local.without_capacity:
                self._fail_unprovisioned(local, job)
                return
            if local.stopping:
                self._finish_stopping(local, job)
                return
            self._sync_checkpoints(local)
            codes = [p.poll() for p in local.processes]
            failed = any(code not in (None, 0) for code in codes)
            if None in codes and not failed:
                return
            # SageMaker fails the job as soon as one host's container exits with an error, and stops the rest.
            self._end_hosts(local)
            local.finished = True
            if local.namespace is not None:
                local.namespace.close()
            # SageMaker uploads the model as the containers exit: the time until this poll noticed is not billed.
            exited = local.exited_at or datetime.now(UTC)
            end = exited
            job.final_metric_data_list = self._final_metrics(local)
            if not failed:
                job.secondary_status_transitions.append({"Status": "Uploading", "StartTime": exited})
                uploading = time.monotonic()
                self._upload_model(local, job)
                end = exited + timedelta(seconds=time.monotonic() - uploading)
                job.training_job_status = "Completed"
                job.secondary_status = "Completed"
            else:
                job.training_job_status = "Failed"
                job.secondary_status = "Failed"
                job.failure_reason = f"AlgorithmError: {self._failure(local)}"
            job.secondary_status_transitions.append({"Status": job.secondary_status, "StartTime": end})
            job.training_end_time = end
            # On demand here: every second trained is billed, so spot saves nothing locally.
            job.training_time_in_seconds = job.billable_time_in_seconds = max(
                1, round((end - job.training_start_time).total_seconds())
            )

    @staticmethod
    def _fail_unprovisioned(local: LocalJob, job: Any) -> None:
        """A job SageMaker could not find the instances of: Failed, never started (no TrainingStartTime), so
        nothing is billed."""
        local.finished = True
        job.training_job_status = job.secondary_status = "Failed"
        job.failure_reason = NO_CAPACITY
        job.secondary_status_transitions.append({"Status": "Failed", "StartTime": datetime.now(UTC)})
        job.training_end_time = datetime.now(UTC)

    def _ship_logs(self, local: LocalJob) -> None:
        """Every host's new log lines into CloudWatch, a stream per host and start, as SageMaker writes them."""
        for log in sorted((local.workdir / "logs").glob("*-gen*.log")):
            if log not in self._streams:  # <job>/<host>-<epoch seconds of the host's start>
                host = log.stem.rsplit("-gen", 1)[0]
                self._streams[log] = f"{local.name}/{host}-{int(log.stat().st_ctime)}"
            self._service_logs.ship_file(self._streams[log], log)

    @staticmethod
    def _end_hosts(local: LocalJob) -> None:
        """Kill every process of the job's hosts (their containers end), and reap the launchers."""
        processes.end(local.processes, local.workdir)
        for process in local.processes:
            process.wait()

    def _finish_stopping(self, local: LocalJob, job: Any) -> None:
        """A stopped job is Stopped once its hosts have exited (after SageMaker's grace, killed)."""
        if any(p.poll() is None for p in local.processes):
            if time.monotonic() - local.stop_requested_at < STOP_GRACE_SECONDS:
                return
            self._end_hosts(local)
        self._sync_checkpoints(local)
        if local.namespace is not None:
            local.namespace.close()
        local.finished = True
        job.training_job_status = job.secondary_status = "Stopped"
        job.secondary_status_transitions.append({"Status": "Stopped", "StartTime": datetime.now(UTC)})
        job.training_end_time = datetime.now(UTC)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Every job's hosts frozen (SIGSTOP) for the block, hosts started in it too; SIGCONT after.

        No training step runs meanwhile. A job's clocks still see the pause, as one slow step: a pause longer
        than its hang limit (training/hang.py; hang.floor_minutes, 10 by default) would be judged a hang. A stop
        (SIGTERM) sent meanwhile is delivered on the release, and SageMaker's grace before SIGKILL starts then.
        """
        if self.hang_after_checkpoint:
            raise ValueError(
                "a paused job's SIGCONT would also resume the worker the hang stopped: use one or the other"
            )
        try:
            with self._spawn_lock:
                self._paused = True
                for local in list(self.jobs.values()):
                    self._frozen.update(processes.pause(local.processes, local.workdir))
            yield
        finally:
            with self._spawn_lock:
                self._paused = False
                processes.resume(self._frozen)
                self._frozen = {}
            released = time.monotonic()
            for local in list(self.jobs.values()):
                if local.stopping:
                    local.stop_requested_at = released

    # -- hosts ------------------------------------------------------------------------------------
    def _start(self, local: LocalJob, job: Any) -> None:
        """Download the channels and checkpoints onto each host, then start every host's launcher."""
        job.secondary_status = "Downloading"
        job.secondary_status_transitions.append({"Status": "Downloading", "StartTime": datetime.now(UTC)})
        local.exited_at = None
        request = local.request
        requested = dict(request.get("HyperParameters", {}))
        hyperparameters = {**requested, **self.local_hyperparameters, **(self.scale(requested) if self.scale else {})}
        port = _free_port()
        for host in local.hosts:
            tree = local.tree(host)
            config = tree / "input" / "config"
            config.mkdir(parents=True, exist_ok=True)
            (config / "hyperparameters.json").write_text(json.dumps(hyperparameters, indent=2))
            (config / "resourceconfig.json").write_text(json.dumps(self._resource_config(local, host)))
            (config / "inputdataconfig.json").write_text(
                json.dumps(
                    {
                        c["ChannelName"]: {"TrainingInputMode": c.get("InputMode", "File")}
                        for c in request["InputDataConfig"]
                    }
                )
            )
            for channel in request["InputDataConfig"]:
                receivers = channel["DataSource"].get("S3DataSource", {}).get("InstanceGroupNames")
                if receivers is None or local.group_of(host) in receivers:
                    self._download_channel(local, channel, tree / "input" / "data" / channel["ChannelName"])
            self._restore_checkpoints(local, tree / "checkpoints")
        logs = local.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        local.processes = []
        isolate = self._isolation(local)
        for host in local.hosts:
            env = dict(self._base_env)
            env.update(request.get("Environment", {}))  # the job's Environment, as SageMaker sets it
            env.update(
                # Local hosts are CPU processes on loopback: no EFA device and no GPU of the instance
                # type, and no bandwidth floor to hold loopback to; the pre-flight still checks that
                # the hosts agree on their GPUs.
                {
                    EFA_ENV: "false",
                    EXPECTED_GPUS_ENV: "0",
                    MIN_BUSBW_ENV: "0",
                    OPT_ML_ROOT_ENV: str(local.tree(host)),
                    MASTER_ADDR_ENV: "127.0.0.1",
                    MASTER_PORT_ENV: str(port),
                    NPROC_ENV: str(self.procs_per_host),
                    JOB_NAME_ENV: local.name,  # SageMaker sets TRAINING_JOB_NAME in every container
                    "PYTHONPATH": str(REPO),
                    "OMP_NUM_THREADS": "1",
                }
            )
            log = logs / f"{host}-gen{local.generation}.log"
            handle = log.open("wb")
            process = self._spawn(local, isolate([sys.executable, "-m", "training.launcher", "train"]), env, handle)
            if host == local.primary:
                local.log = log
                threading.Thread(target=self._follow, args=(local, log, process), daemon=True).start()
        job.secondary_status = "Training"
        job.secondary_status_transitions.append({"Status": "Training", "StartTime": datetime.now(UTC)})
        threading.Thread(target=self._await_exit, args=(local, list(local.processes)), daemon=True).start()

    def _spawn(
        self, local: LocalJob, command: list[str], env: dict[str, str], log: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        """Start a host's launcher in a session of its own (frozen at once while `paused`)."""
        with self._spawn_lock:
            process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            local.processes.append(process)
            if local.stopping:  # StopTrainingJob came while the hosts prepared: the launcher gets it as it starts
                os.killpg(process.pid, signal.SIGTERM)
            if self._paused:
                self._frozen.update(processes.identify(processes.freeze(process.pid)))
        return process

    def _await_exit(self, local: LocalJob, started: list[subprocess.Popen[bytes]]) -> None:
        """Note when the hosts' launchers have all exited (unless a restart has replaced them)."""
        for process in started:
            process.wait()
        exited = datetime.now(UTC)
        with self._lock:
            if local.processes == started:
                local.exited_at = exited

    @staticmethod
    def _resource_config(local: LocalJob, host: str) -> dict[str, Any]:
        """resourceconfig.json as SageMaker writes it; a heterogeneous cluster's lists its instance groups."""
        config: dict[str, Any] = {"current_host": host, "hosts": local.hosts, "network_interface_name": "lo"}
        if local.groups:
            group = local.group_of(host)
            config |= {
                "current_group_name": group,
                "current_instance_type": local.groups[str(group)][0],
                "instance_groups": [
                    {"instance_group_name": name, "instance_type": instance_type, "hosts": hosts}
                    for name, (instance_type, hosts) in local.groups.items()
                ],
            }
        return config

    def _isolation(self, local: LocalJob) -> Callable[[list[str]], list[str]]:
        """How to start the job's hosts: in one loopback-only network when the request isolates them."""
        if local.namespace is not None:
            local.namespace.close()
            local.namespace = None
        if not local.request.get("EnableNetworkIsolation"):
            return lambda argv: argv
        if not netns.available():
            self._note(local, "network isolation requested; this machine cannot create network namespaces")
            return lambda argv: argv
        local.namespace = LoopbackNamespace()
        self._note(local, "network isolation: the hosts share a network namespace with loopback only")
        return local.namespace.command

    def _note(self, local: LocalJob, message: str) -> None:
        local.notes.append(message)
        if self.on_line is not None:
            self.on_line(local.name, f"-- {message} --")

    def _follow(self, local: LocalJob, log: Path, process: subprocess.Popen[bytes]) -> None:
        """Stream host 1's log lines to `on_line` while its launcher runs."""
        if self.on_line is None:
            return
        position = 0
        while True:
            done = process.poll() is not None
            text = log.read_text(errors="replace")
            for line in text[position:].splitlines():
                self.on_line(local.name, line)
            position = len(text)
            if done:
                return
            time.sleep(0.2)

    def _after_recorded_checkpoint(self, local: LocalJob, act: Callable[[dict[int, str | None]], bool]) -> None:
        """Call `act(held)` under the lock, until it returns True, once the platform has recorded a checkpoint of
        the job's run; nothing if the job ends or is stopped first.

        A restarted job resumes only from a checkpoint its run's ledger records (contract/ledger.py), so a fault
        played from then on is one a real fault after a poll would meet. The hosts are held (SIGSTOP; `held`,
        for `act` to release) from the moment one of them has committed a checkpoint until it is recorded, so
        that the run cannot finish while the checkpoint uploads and the Monitor records it, however fast its
        steps are. A hold that comes after every training worker has exited (the run's last checkpoint was its
        first one seen) releases the hosts and plays no fault: it would freeze launchers with no training left,
        and the job would wait for its deadline. (Hosts of a group that does not train never have one.)
        """
        held: dict[int, str | None] = {}
        # One client, and the ledger read only once the hosts are held: a client made and a listing read on every
        # round, under the lock, made the rounds slower than a tiny run's last steps, which could end first.
        s3 = self._s3(local)
        while True:
            with self._lock:
                if local.finished or local.stopping or any(p.poll() is not None for p in local.processes):
                    processes.resume(held)
                    return
                if not held and any(
                    any((local.tree(host) / "checkpoints").glob(MANIFEST_GLOB)) for host in local.hosts
                ):
                    held = processes.pause(local.processes, local.workdir)
                    if all(_training_worker(p.pid) is None for p in local.processes):
                        processes.resume(held)
                        self._note(local, _NO_FAULT)
                        return
                if held and recorded_checkpoints(s3, local.request["InputDataConfig"]) and act(held):
                    return
            time.sleep(0.05)

    def _reclaim_after_first_checkpoint(self, local: LocalJob, job: Any) -> None:
        """Reclaim the hosts (a spot interruption) once the platform has recorded a checkpoint of the run, with
        training still under way."""
        reclaimed: list[dict[int, str | None]] = []

        def reclaim(held: dict[int, str | None]) -> bool:
            local.restarting = True
            job.secondary_status = "Interrupted"
            job.secondary_status_transitions.append({"Status": "Interrupted", "StartTime": datetime.now(UTC)})
            reclaimed.append(held)
            return True

        self._after_recorded_checkpoint(local, reclaim)
        if reclaimed:
            self._interrupt(local, job, reclaimed[0])

    def _hang_after_first_checkpoint(self, local: LocalJob) -> None:
        """Once the platform recorded a checkpoint of the run (the retry resumes from it), SIGSTOP a training
        worker of the last host and release the rest: it makes no progress, and its peers wait for it in their
        collectives."""

        def hang(held: dict[int, str | None]) -> bool:
            worker = _training_worker(local.processes[-1].pid)
            if worker is None:  # the last host's training has ended: nothing to stop
                processes.resume(held)
                self._note(local, _NO_FAULT)
                return True
            os.kill(worker, signal.SIGSTOP)
            processes.resume({pid: started for pid, started in held.items() if pid != worker})
            self._note(local, f"hang: training worker {worker} of {local.hosts[-1]} stopped (SIGSTOP)")
            return True

        self._after_recorded_checkpoint(local, hang)

    def _interrupt(self, local: LocalJob, job: Any, held: dict[int, str | None]) -> None:
        """A spot reclaim, in the background: SIGTERM every host (releasing those `held`), let them checkpoint,
        start fresh hosts."""
        if self.on_line is not None:
            self.on_line(local.name, "-- spot interruption: SIGTERM to every host; they checkpoint and exit --")
        for process in local.processes:
            os.killpg(process.pid, signal.SIGTERM)
        processes.resume(held)
        for process in local.processes:
            process.wait(timeout=180)
        with self._lock:
            self._sync_checkpoints(local)
            local.generation += 1
            if self.on_line is not None:
                self.on_line(local.name, "-- new spot capacity: fresh hosts, checkpoints restored from S3 --")
            self._start(local, job)
            local.restarting = False

    # -- S3, as SageMaker uses it -------------------------------------------------------------------
    def _download_channel(self, local: LocalJob, channel: dict[str, Any], target: Path) -> None:
        source = channel["DataSource"]
        if "S3DataSource" in source:
            _download_prefix(self._s3(local), *split_s3_uri(source["S3DataSource"]["S3Uri"]), target)
            return
        # FSx for Lustre: /<mount>/datasets/<path> is the datasets bucket's <path>, lazily loaded by FSx.
        relative = source["FileSystemDataSource"]["DirectoryPath"].split("/datasets/", 1)[1]
        fsx = boto3.client("s3", region_name=REGION)
        _download_prefix(fsx, self.datasets_bucket, relative.strip("/") + "/", target)

    def _checkpoint_location(self, local: LocalJob) -> tuple[str, str] | None:
        config = local.request.get("CheckpointConfig")
        return split_s3_uri(config["S3Uri"]) if config else None

    def _restore_checkpoints(self, local: LocalJob, target: Path) -> None:
        location = self._checkpoint_location(local)
        if location is None:
            return
        _download_prefix(self._s3(local), *location, target)

    def _sync_checkpoints(self, local: LocalJob) -> None:
        """Upload every host's new or changed checkpoint files to the one S3 prefix, as SageMaker does."""
        location = self._checkpoint_location(local)
        if location is None:
            return
        bucket, prefix = location
        s3 = self._s3(local)
        files: list[tuple[Path, Path]] = []
        for host in local.hosts:
            folder = local.tree(host) / "checkpoints"
            files.extend((folder, p) for p in _files_under(folder))
        # Manifests last: a checkpoint is complete in S3 only once all of its files are there.
        for folder, path in sorted(files, key=lambda f: (f[1].name == MANIFEST, str(f[1]))):
            key = f"{prefix}{path.relative_to(folder).as_posix()}"
            try:
                stamp = path.stat().st_mtime
                if local.synced.get(f"{folder}:{key}") != stamp:
                    s3.upload_file(str(path), bucket, key)
                    local.synced[f"{folder}:{key}"] = stamp
            except FileNotFoundError:
                continue  # pruned by the trainer since the listing; a newer checkpoint is committed

    def _upload_model(self, local: LocalJob, job: Any) -> None:
        model = local.tree(local.primary) / "model"
        archive = local.workdir / "model.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(model.rglob("*")):
                tar.add(path, arcname=path.relative_to(model).as_posix())
        output = local.request["OutputDataConfig"]
        bucket, prefix = split_s3_uri(output["S3OutputPath"])
        key = f"{prefix}{local.name}/output/model.tar.gz"
        # SageMaker encrypts the model with the request's output key.
        extra = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": output["KmsKeyId"]} if "KmsKeyId" in output else {}
        self._s3(local).upload_file(str(archive), bucket, key, ExtraArgs=extra)
        job.model_artifacts = {"S3ModelArtifacts": f"s3://{bucket}/{key}"}

    # -- what SageMaker reports ------------------------------------------------------------------------
    def logs(self, name: str) -> str:
        local = self.jobs[name]
        return "".join(
            p.read_text(errors="replace") for p in sorted((local.workdir / "logs").glob(f"{local.primary}-gen*.log"))
        )

    def _final_metrics(self, local: LocalJob) -> list[dict[str, Any]]:
        parsed = parse_metrics(self.logs(local.name))
        now = datetime.now(UTC)
        return [{"MetricName": k, "Value": values[-1], "Timestamp": now} for k, values in sorted(parsed.items())]

    def _failure(self, local: LocalJob) -> str:
        for host in local.hosts:
            failure = local.tree(host) / "output" / "failure"
            if failure.exists():
                return failure.read_text(errors="replace").splitlines()[0]
        return "the training processes exited with an error and wrote no failure file"

    def stop_all(self) -> None:
        for local in self.jobs.values():
            self._end_hosts(local)
            if local.namespace is not None:
                local.namespace.close()
            local.finished = True

    def copy_outputs(self, name: str, destination: Path) -> None:
        local = self.jobs[name]
        shutil.copytree(local.tree(local.primary) / "model", destination / "model", dirs_exist_ok=True)


def cluster_of(request: dict[str, Any]) -> str:
    """A CreateTrainingJob request's cluster in words: `2 x ml.p5.48xlarge`, a heterogeneous one's groups joined."""
    resource = request["ResourceConfig"]
    groups = resource.get("InstanceGroups") or [resource]
    return " + ".join(f"{group['InstanceCount']} x {group['InstanceType']}" for group in groups)


def _files_under(folder: Path) -> list[Path]:
    """The files under `folder` as listed now; a folder the trainer removes meanwhile (a pruned checkpoint) is
    skipped, where Path.rglob would raise."""
    return [Path(root) / name for root, _dirs, names in os.walk(folder) for name in names]

"""The image's entrypoint: SageMaker's container contract in, one torchrun (or mpirun) per host out.

SageMaker runs ``<entrypoint> train`` on every host. On a heterogeneous cluster only the hosts of the
groups that train (training/roles.py) start workers; the others follow the training until it ends.
The launcher validates hyperparameters and data channels before anything starts (failing fast with
the reason in /opt/ml/output/failure), starts torchrun with this host's node rank, its workers running
the pre-flight check (training/preflight.py) before training unless the `preflight` hyperparameter
turns it off, forwards SIGTERM to the workers so they can checkpoint, kills them when they finish no
training step for the hang limit (training/hang.py), and exits 0 (done, or stopped after a checkpoint),
1 (training failed), 2 (invalid input), 3 (workers did not stop within the grace period), 4 (the
pre-flight check failed) or 5 (the workers hung). Torch-free, so that invalid input fails in
milliseconds.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO

from contract.code_archive import CodeArchiveError
from contract.config import ConfigError, HangConfig, JobConfig, from_hyperparameters
from contract.distributions import distribution, module_available
from contract.hang import Hang
from contract.layout import (
    AUXILIARY_START_TIMEOUT_ENV,
    EFA_ENV,
    EXITS_ENV,
    GRACE_ENV,
    HEARTBEAT_ENV,
    LAUNCHED_ENV,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    NPROC_ENV,
    PREFLIGHT_ENV,
    PREFLIGHT_FAILED,
    on_batch,
)
from contract.mesh import layout_problems
from contract.user_code import CODE_PREFIX, USER_CODE_FAILED, UserCode, UserCodeError, is_launcher_key
from training import user_code
from training.hang import HangWatch, ScriptWatch
from training.preflight import Checks, NcclLog, checks_from_env, failure_line
from training.roles import (
    DEFAULT_START_TIMEOUT_SECONDS,
    Auxiliary,
    follow_training,
    training_cluster,
)
from training.sagemaker_contract import (
    ContractError,
    Paths,
    ResourceConfig,
    describe,
    find_data_files,
    read_hyperparameters,
    read_resource_config,
    write_failure,
)

log = logging.getLogger("training.launcher")

DEFAULT_MASTER_PORT = 29500
# SageMaker kills the container 120 s after SIGTERM; keep a margin to write the failure file.
DEFAULT_GRACE_SECONDS = 110.0

EXIT_OK, EXIT_FAILED, EXIT_INVALID_INPUT, EXIT_GRACE_EXPIRED, EXIT_PREFLIGHT_FAILED = 0, 1, 2, 3, 4
EXIT_HANG_DETECTED = 5
_OUTPUT_TAIL_LINES = 40


@dataclass(frozen=True)
class LaunchPlan:
    """Where this host sits in the job and how many workers it starts."""

    hosts: tuple[str, ...]
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    distribution: str

    @property
    def nnodes(self) -> int:
        return len(self.hosts)


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ContractError(f"environment variable {name}={value!r} must be an integer") from None
    if number < 1:
        raise ContractError(f"environment variable {name}={value!r} must be at least 1")
    return number


def gpu_count(env: Mapping[str, str]) -> int:
    """GPUs on this host: SageMaker's SM_NUM_GPUS, else ``nvidia-smi -L``, else 0."""
    if env.get("SM_NUM_GPUS", "").strip().isdigit():
        return int(env["SM_NUM_GPUS"])
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
        except (subprocess.SubprocessError, OSError):
            return 0
        return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    return 0


def plan_launch(cfg: JobConfig, resources: ResourceConfig, env: Mapping[str, str]) -> LaunchPlan:
    """The launch plan from the resource config and the TRAINING_* overrides."""
    nproc = _int_env(env, NPROC_ENV) or gpu_count(env) or 1
    port = _int_env(env, MASTER_PORT_ENV) or DEFAULT_MASTER_PORT
    return LaunchPlan(
        hosts=resources.hosts,
        node_rank=resources.node_rank,
        nproc_per_node=nproc,
        master_addr=env.get(MASTER_ADDR_ENV) or resources.hosts[0],
        master_port=port,
        distribution=cfg.distribution,
    )


def efa_devices(sysfs: Path = Path("/sys/class/infiniband")) -> list[str]:
    """RDMA devices bound to the EFA driver (``rdmap*`` on p4d/p5), found at run time."""
    if not sysfs.is_dir():
        return []
    found = []
    for device in sorted(sysfs.iterdir()):
        driver = device / "device" / "driver"
        if device.name.startswith("efa") or (driver.exists() and Path(os.path.realpath(driver)).name == "efa"):
            found.append(device.name)
    return found


def efa_supports_rdma() -> bool:
    """Whether libfabric's EFA provider offers RMA here (GPUDirect RDMA on p4d/p5): ``fi_info -p efa``."""
    fi_info = shutil.which("fi_info")
    if fi_info is None:
        return False
    try:
        out = subprocess.run([fi_info, "-p", "efa"], capture_output=True, text=True, timeout=30, check=False)
    except (subprocess.SubprocessError, OSError):
        return False
    return "FI_RMA" in out.stdout


def efa_for_host(env: Mapping[str, str], devices: Sequence[str]) -> list[str] | None:
    """The EFA devices to use; None when the request turned EFA off (NCCL then uses TCP sockets).

    A request that wants EFA on a host without an EFA device is an error: the job would otherwise
    train over TCP at a fraction of the bandwidth, found hours in.
    """
    raw = env.get(EFA_ENV, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ContractError(f"environment variable {EFA_ENV}={raw!r} must be true or false")
    if raw == "false":
        return None
    if raw == "true" and not devices:
        raise ContractError(
            f"the run asks for EFA ({EFA_ENV}=true) but this host has no EFA device under /sys/class/infiniband; "
            "use an instance type with EFA, or set efa to false in the execution input to train over TCP"
        )
    return list(devices)


def network_env(
    resources: ResourceConfig, env: Mapping[str, str], *, efa: Sequence[str] | None, efa_rdma: bool
) -> dict[str, str]:
    """NCCL/libfabric variables for this host; values already in the environment are left alone.

    `efa`: the devices to use ([] when there are none), or None when the run turned EFA off.
    """
    wanted: dict[str, str] = {}
    if resources.network_interface_name:
        # Bootstrap and gloo traffic on SageMaker's interface, not on a secondary ENI or docker0.
        wanted["NCCL_SOCKET_IFNAME"] = resources.network_interface_name
        wanted["GLOO_SOCKET_IFNAME"] = resources.network_interface_name
    if efa is None:
        # NCCL's own TCP transport, not the aws-ofi-nccl plugin the image loads by default.
        wanted["NCCL_NET"] = "Socket"
    elif efa:
        wanted["FI_PROVIDER"] = "efa"
        wanted["FI_EFA_FORK_SAFE"] = "1"  # workers fork (data loading, compile) after libfabric init
        if efa_rdma:
            wanted["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return {key: value for key, value in wanted.items() if key not in env}


TRAINER = ("-m", "training.train")
"""What each worker runs: the built-in trainer, or training/user_worker.py and a run's own entry point."""


def torchrun_command(plan: LaunchPlan, worker: Sequence[str] = TRAINER, logs: Path | None = None) -> list[str]:
    """`logs`: where torchrun keeps a file of each worker's stderr besides printing it (a run's own code)."""
    keep = [f"--log-dir={logs}", "--tee=2"] if logs is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nnodes}",
        f"--node_rank={plan.node_rank}",
        f"--nproc_per_node={plan.nproc_per_node}",
        f"--master_addr={plan.master_addr}",
        f"--master_port={plan.master_port}",
        "--max_restarts=0",
        *keep,
        *worker,
    ]


def mpirun_command(
    plan: LaunchPlan, forward: Sequence[str], ifname: str | None, worker: Sequence[str] = TRAINER
) -> list[str]:
    """mpirun from the first host over every host's GPUs; workers map OMPI_* ranks to torch's."""
    hosts = ",".join(f"{host}:{plan.nproc_per_node}" for host in plan.hosts)
    command = [
        "mpirun",
        "--allow-run-as-root",
        "--host",
        hosts,
        "-np",
        str(plan.nnodes * plan.nproc_per_node),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "-mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-mca",
        "pml",
        "ob1",
        "-mca",
        "btl",
        "^openib",
    ]
    if ifname:
        command += ["-mca", "btl_tcp_if_include", ifname, "-mca", "oob_tcp_if_include", ifname]
    command += ["-x", f"MASTER_ADDR={plan.master_addr}", "-x", f"MASTER_PORT={plan.master_port}"]
    for name in forward:
        command += ["-x", name]
    return [*command, sys.executable, *worker]


def proc_stat(pid: int | str) -> list[str]:
    """/proc/<pid>/stat's fields from the state on (field 3: state, 4: parent pid, 22: start time); [] once the
    process is gone. The command's name (field 2) may hold spaces and parentheses: the fields follow its last ")"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def command_name(pid: int | str) -> str:
    """/proc/<pid>/comm: the process's command name ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(entry.name)):
            parents[int(entry.name)] = int(fields[1])
    return parents


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (torchrun's workers), from /proc."""
    return [child for child, parent in parent_pids().items() if parent == pid]


def _signal_group(pid: int, signum: int) -> None:
    """Signal ``pid`` and, when it leads a process group (torchrun's workers do), the whole group."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    """SIGKILL the worker launcher `pid` and its workers' process groups."""
    for target in [*child_pids(pid), pid]:
        _signal_group(target, signal.SIGKILL)


class Supervisor:
    """Runs the worker launcher, mirrors its output, forwards SIGTERM, enforces the grace period and, with a
    `watch`, kills workers that hang. With `separate_stderr` (a run's own script) the workers' stderr is mirrored
    to the launcher's and its last lines kept apart (`stderr_tail`), for the failure file."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        grace_seconds: float,
        mpi: bool,
        watch: HangWatch | ScriptWatch | None = None,
        cwd: Path | None = None,
        separate_stderr: bool = False,
    ) -> None:
        self.command, self.env, self.grace, self.mpi = list(command), dict(env), grace_seconds, mpi
        self.watch, self.cwd, self.separate_stderr = watch, cwd, separate_stderr
        self.tail: collections.deque[str] = collections.deque(maxlen=_OUTPUT_TAIL_LINES)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=4 * _OUTPUT_TAIL_LINES)
        self.output_lines = 0
        """Lines the workers printed so far: the progress of a script that reports no steps."""
        self.signal_name: str | None = None
        self.hang: Hang | None = None
        self.hang_ended_by_peer = False
        """The workers failed on their own in a hang: a peer host's launcher found it first."""
        self._deadline: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _pump(self, stream: IO[bytes], out: IO[bytes], tails: Sequence[collections.deque[str]]) -> None:
        for raw in iter(stream.readline, b""):
            out.write(raw)
            out.flush()
            self.output_lines += 1
            line = raw.decode("utf-8", errors="replace").rstrip()
            for tail in tails:
                tail.append(line)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is not None or self._proc is None:
            return
        self.signal_name = signal.Signals(signum).name
        self._deadline = time.monotonic() + self.grace
        # torchrun would kill the workers 30 s after its own SIGTERM, mpirun at once; the workers get the signal
        # directly instead and either simply sees them exit. mpirun's ssh clients start the other hosts' daemons.
        workers = [pid for pid in child_pids(self._proc.pid) if not (self.mpi and command_name(pid) == "ssh")]
        targets = workers or [self._proc.pid]
        for pid in targets:
            _signal_group(pid, signal.SIGTERM)
        os.write(2, f"launcher: {self.signal_name} forwarded to {targets}; grace {self.grace:.0f}s\n".encode())

    def run(self) -> tuple[int, bool]:
        """(exit status of the worker launcher, whether the grace period expired)."""
        self._proc = proc = subprocess.Popen(
            self.command,
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if self.separate_stderr else subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        pumps = [threading.Thread(target=self._pump, args=(proc.stdout, sys.stdout.buffer, [self.tail]), daemon=True)]
        if proc.stderr is not None:
            tails = [self.tail, self.stderr_tail]
            pumps.append(threading.Thread(target=self._pump, args=(proc.stderr, sys.stderr.buffer, tails), daemon=True))
        for pump in pumps:
            pump.start()
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        expired = False
        try:
            while proc.poll() is None:
                if self._deadline is not None and time.monotonic() > self._deadline and not expired:
                    expired = True
                    _kill(proc.pid)
                # A stop that was asked for is the grace period's to bound, not the hang check's.
                if self.watch is not None and self.signal_name is None and self.hang is None:
                    self.hang = self.watch.check(time.monotonic(), self.output_lines)
                    if self.hang is not None:
                        log.error("%s: killing the workers", self.hang.describe())
                        _kill(proc.pid)
                time.sleep(0.1)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.watch is not None and self.hang is None and self.signal_name is None and proc.returncode != 0:
            self.hang = self.watch.stalled(time.monotonic(), self.output_lines)
            self.hang_ended_by_peer = self.hang is not None
        for pump in pumps:
            pump.join(timeout=10)
        return proc.returncode, expired


def _wait_for_ssh(hosts: Sequence[str], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    for host in hosts:
        while True:
            try:
                with socket.create_connection((host, 22), timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise ContractError(f"host {host} did not open its SSH port within {timeout:.0f}s") from None
                time.sleep(1)


MPI_DAEMONS = ("orted", "prted")
"""The daemons through which mpirun on the first host starts each other host's ranks (Open MPI 4, 5)."""


def _mpi_daemons(names: Sequence[str]) -> list[int]:
    """The live MPI daemons on this host (a zombie has ended: its parent has only not yet reaped it)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        if command_name(entry.name) in names and proc_stat(entry.name)[:1] not in ([], ["Z"]):
            found.append(int(entry.name))
    return found


def _follow_mpi_master(start_timeout: float = 600.0, daemons: Sequence[str] = MPI_DAEMONS) -> int:
    """On the other hosts: wait for the master's MPI daemon to arrive over SSH, then for it to leave. A SIGTERM
    (a spot interruption reaches every host) goes to this host's ranks, as the first host's launcher sends it to
    its own: mpirun would end them at once, without their checkpoint."""

    def stop_ranks(signum: int, _frame: FrameType | None) -> None:
        ranks = [rank for daemon in _mpi_daemons(daemons) for rank in child_pids(daemon)]
        for pid in ranks:
            _signal_group(pid, signum)
        os.write(2, f"launcher: {signal.Signals(signum).name} forwarded to the MPI ranks {ranks}\n".encode())

    signal.signal(signal.SIGTERM, stop_ranks)
    deadline = time.monotonic() + start_timeout
    while not _mpi_daemons(daemons):
        if time.monotonic() > deadline:
            raise ContractError(f"no MPI job reached this host within {start_timeout:.0f}s")
        time.sleep(1)
    while _mpi_daemons(daemons):
        time.sleep(2)
    return EXIT_OK


def _start_sshd() -> None:
    if Path("/usr/sbin/sshd").exists():
        subprocess.Popen(["/usr/sbin/sshd", "-D"], start_new_session=True)


def _validate(
    paths: Paths, env: Mapping[str, str], hyperparameters: Mapping[str, object], code: UserCode | None
) -> tuple[JobConfig, ResourceConfig, LaunchPlan]:
    """The launcher's settings (of a run's own code: the launcher's keys alone, the rest are the script's)."""
    own = {k: v for k, v in hyperparameters.items() if is_launcher_key(k) and not k.startswith(CODE_PREFIX)}
    cfg = from_hyperparameters(hyperparameters if code is None else own)
    resources = training_cluster(read_resource_config(paths, env), env)
    if resources is None:
        raise ContractError("this host does not train (see _auxiliary)")
    if code is None:  # a run's own code reads its channels itself: any files
        find_data_files(paths)
    strategy = distribution(cfg.distribution)
    if strategy.required_module and not module_available(strategy.required_module):
        raise ConfigError(
            f"hyperparameter distribution={strategy.name!r} is invalid: {strategy.required_module} is not in this "
            "image; use distribution=ddp (NCCL over EFA)"
        )
    if strategy.launcher == "mpirun" and shutil.which("mpirun") is None:
        raise ConfigError(
            f"hyperparameter distribution={strategy.name!r} is invalid: mpirun is not in this image; use ddp"
        )
    plan = plan_launch(cfg, resources, env)
    # Every host of one group starts as many workers as this one; hosts of several training groups may not (the
    # trainer checks the layout on the processes that did start).
    if len(resources.groups) <= 1:
        problems = layout_problems(cfg, plan.nnodes * plan.nproc_per_node, plan.nproc_per_node)
        if problems:
            raise ConfigError(problems)
    return cfg, resources, plan


def _grace_seconds(env: Mapping[str, str]) -> float:
    raw = env.get(GRACE_ENV, "").strip()
    try:
        grace = float(raw) if raw else DEFAULT_GRACE_SECONDS
    except ValueError:
        raise ContractError(f"environment variable {GRACE_ENV}={raw!r} must be a number of seconds") from None
    if grace <= 0:
        raise ContractError(f"environment variable {GRACE_ENV}={raw!r} must be positive")
    return grace


def _worker_env(paths: Paths, resources: ResourceConfig, efa: list[str] | None, grace: float) -> dict[str, str]:
    """What every worker (pre-flight and training) gets beyond the launcher's own environment; logged."""
    extra = network_env(resources, os.environ, efa=efa, efa_rdma=bool(efa) and efa_supports_rdma())
    log.info("EFA devices: %s", "off (the run turned EFA off)" if efa is None else ", ".join(efa) or "none")
    for key, value in sorted(extra.items()):
        log.info("set %s=%s", key, value)
    extra.update(
        PYTHONUNBUFFERED="1",
        OPT_ML_ROOT=str(paths.root),
        # Only used if torchrun itself is signalled (SIGTERM before its workers started).
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT=str(int(grace)),
    )
    return extra


def _preflight_outcome(paths: Paths, supervisor: Supervisor, returncode: int) -> int | None:
    """The exit status of workers that did not pass the pre-flight check; None when the check was not
    what ended them (then the training's outcome applies)."""
    if supervisor.signal_name:
        # Stopped before training started: nothing to checkpoint, nothing lost.
        log.info("stopped by %s during the pre-flight check; training did not start", supervisor.signal_name)
        return EXIT_OK
    first = paths.failure.read_text().split("\n", 1)[0] if paths.failure.exists() else ""
    if first.startswith(f"{PREFLIGHT_FAILED}: "):
        return EXIT_PREFLIGHT_FAILED
    if returncode == 0 or first:
        return None
    # No verdict: the check could not run across the cluster (a host or its network, torchrun's
    # rendezvous), which fresh nodes are as likely to cure.
    reason = f"the pre-flight check did not finish: its workers on this host exited with status {returncode}"
    write_failure(paths, failure_line(reason), details="\n".join(supervisor.tail))
    return EXIT_PREFLIGHT_FAILED


@dataclass(frozen=True)
class Launch:
    """Everything the launcher validated before starting anything."""

    resources: ResourceConfig
    plan: LaunchPlan
    grace: float
    efa: list[str] | None
    preflight: Checks | None
    """None: the `preflight` hyperparameter turned the check off."""
    hang: HangConfig
    max_steps: int
    hyperparameters: Mapping[str, object] = field(default_factory=dict)
    code: UserCode | None = None
    """A run's own code (None: the built-in trainer)."""
    code_dir: Path | None = None
    """Where `code` was unpacked (`user_code.prepare`)."""


def _validate_launch(paths: Paths, env: Mapping[str, str]) -> Launch:
    hyperparameters = read_hyperparameters(paths)
    code = UserCode.from_hyperparameters(hyperparameters)
    cfg, resources, plan = _validate(paths, env, hyperparameters, code)
    efa = efa_for_host(env, efa_devices())
    checks = checks_from_env(env, efa=bool(efa), timeout_minutes=cfg.parallel.timeout_minutes)
    max_steps = sys.maxsize if code is not None else cfg.train.max_steps  # a script's own last step is its own
    preflight = checks if cfg.preflight else None
    return Launch(resources, plan, _grace_seconds(env), efa, preflight, cfg.hang, max_steps, hyperparameters, code)


def _hang_watch(launch: Launch, env: dict[str, str]) -> HangWatch | ScriptWatch | None:
    """The hang check of this host's workers, whose reports' directory it adds to `env`; None when off."""
    if launch.hang.action == "off":
        log.info("hang check off (hyperparameter hang.action=off)")
        return None
    directory = Path(tempfile.mkdtemp(prefix="heartbeat-"))
    env[HEARTBEAT_ENV] = str(directory)
    watches = [
        HangWatch(
            folder,
            host=launch.resources.current_host,
            last_step=launch.max_steps,
            fixed_seconds=launch.hang.minutes * 60,
            floor_seconds=launch.hang.floor_minutes * 60,
            factor=launch.hang.factor,
        )
        for folder in (directory, None)
    ]
    limit = f"{launch.hang.factor:g} x the longest step interval, at least {launch.hang.floor_minutes:g} min"
    if launch.hang.minutes:
        limit = f"{launch.hang.minutes:g} min"
    what = "no training step" if launch.code is None else "no training step (nor output, before the first step)"
    log.info("hang check: a host with %s for %s fails with HangDetected", what, limit)
    return watches[0] if launch.code is None else ScriptWatch(*watches)


def _worker(paths: Paths, launch: Launch, env: dict[str, str]) -> tuple[Sequence[str], Path | None]:
    """What each worker runs (`TRAINER`, or a run's own code with SageMaker's environment added to `env`), and the
    folder where a run's own code's workers record how they ended."""
    code, code_dir = launch.code, launch.code_dir
    if code is None or code_dir is None:
        return TRAINER, None
    gpus = gpu_count(env)
    env.update(user_code.script_env(paths, code, code_dir, launch.resources, launch.hyperparameters, gpus=gpus))
    exits = Path(tempfile.mkdtemp(prefix="exits-"))
    env[EXITS_ENV] = str(exits)
    args = user_code.script_arguments(code, launch.hyperparameters)
    log.info("running %s %s in %s", code.entry_point, " ".join(args), code_dir)
    return ("-m", "training.user_worker", *code.entry_point.argv(), *args), exits


def _launch(paths: Paths, launch: Launch) -> int:
    """Pre-flight, then training (torchrun, or mpirun from the first host); the launcher's exit status."""
    resources, plan, grace = launch.resources, launch.plan, launch.grace
    extra = _worker_env(paths, resources, launch.efa, grace)
    env = {**os.environ, **extra}
    log.info(
        "host %s is node %d of %d; %d processes per node; rendezvous %s:%d; distribution %s",
        resources.current_host,
        plan.node_rank,
        plan.nnodes,
        plan.nproc_per_node,
        plan.master_addr,
        plan.master_port,
        plan.distribution,
    )
    passed: Path | None = None
    if launch.preflight is None:
        log.info("pre-flight check off (hyperparameter preflight=false)")
    else:
        passed = Path(tempfile.mkdtemp(prefix="preflight-")) / "passed"
        checks = replace(launch.preflight, passed_file=str(passed))
        env[PREFLIGHT_ENV] = checks.to_env()
        log.info("pre-flight check in the training workers: %s", checks.to_env())
    watch = _hang_watch(launch, env)
    before = set(env)
    worker, exits = _worker(paths, launch, env)
    mpi = distribution(plan.distribution).launcher == "mpirun"
    if mpi:
        _start_sshd()
        if plan.node_rank != 0:
            return _follow_mpi_master()
        _wait_for_ssh(plan.hosts[1:])
        # Ranks on other hosts start over SSH, which does not carry the image's ENV lines.
        own = {*extra, *(set(env) - before), PREFLIGHT_ENV, HEARTBEAT_ENV, "PATH", "LD_LIBRARY_PATH", "PYTHONPATH"}
        command = mpirun_command(plan, sorted(own & set(env)), resources.network_interface_name, worker)
    else:
        command = torchrun_command(plan, worker, exits / "logs" if exits is not None else None)
    supervisor = Supervisor(
        command, env, grace_seconds=grace, mpi=mpi, watch=watch, cwd=launch.code_dir, separate_stderr=bool(exits)
    )
    try:
        returncode, expired = supervisor.run()
        verdict = _script_verdict(
            paths,
            launch,
            supervisor,
            exits,
            returncode=returncode,
            expired=expired,
            passed_check=passed is None or passed.exists(),
        )
    finally:
        for folder in (watch.directory if watch is not None else None, exits):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    if passed is not None:
        passed_check = passed.exists()
        # What NCCL logged that a worker it aborted (or that was killed) had not yet copied to the log.
        try:
            NcclLog.forward_leftovers(passed.parent, env)
        except OSError as exc:
            log.warning("NCCL's last log lines could not be copied: %s", describe(exc))
        shutil.rmtree(passed.parent, ignore_errors=True)
        status = (
            None if expired or passed_check or supervisor.hang else _preflight_outcome(paths, supervisor, returncode)
        )
        if status is not None:
            return status
    if verdict:
        return EXIT_FAILED
    return _outcome(paths, supervisor, returncode, expired, grace)


def _script_verdict(
    paths: Paths,
    launch: Launch,
    supervisor: Supervisor,
    exits: Path | None,
    *,
    returncode: int,
    expired: bool,
    passed_check: bool,
) -> str | None:
    """The failure of a run's own script that ended on its own once it started (workers that never passed the
    pre-flight check are the check's to judge), written to the failure file; None for any other end."""
    if launch.code is None or exits is None or not passed_check or returncode == 0:
        return None
    if expired or supervisor.hang or supervisor.signal_name:
        return None
    records = user_code.exit_records(exits)
    return user_code.verdict(paths, launch.code, records, supervisor.stderr_tail, returncode, logs=exits / "logs")


def _outcome(paths: Paths, supervisor: Supervisor, returncode: int, expired: bool, grace: float) -> int:
    """The exit status of a training run that ended, and its failure file."""
    if expired:
        reason = (
            f"workers did not stop within the {grace:.0f}s grace period after {supervisor.signal_name}; "
            f"the newest committed checkpoint in {paths.checkpoints} is kept (raise {GRACE_ENV}?)"
        )
        write_failure(paths, reason)
        return EXIT_GRACE_EXPIRED
    if supervisor.hang is not None:
        _write_hang(paths, supervisor, supervisor.hang, returncode)
        return EXIT_HANG_DETECTED
    if returncode == 0:
        if supervisor.signal_name:
            log.info("workers checkpointed and exited after %s", supervisor.signal_name)
        return EXIT_OK
    if supervisor.signal_name:
        reason = f"stopped by {supervisor.signal_name}: workers exited with status {returncode}"
    else:
        reason = f"training failed: workers exited with status {returncode} (see the log for the first error)"
    write_failure(paths, reason, details="\n".join(supervisor.tail))
    return EXIT_FAILED


def _write_hang(paths: Paths, supervisor: Supervisor, hang: Hang, returncode: int) -> None:
    """The failure file of a hang. A failure the workers wrote is its symptom (the connection to a peer host
    whose launcher killed its hung workers, lost): the hang goes first, the workers' line after it."""
    details = [*supervisor.tail, hang.describe()]
    if supervisor.hang_ended_by_peer:
        log.error("%s: the workers then failed on their own (a peer host's hang check ended them)", hang.describe())
    if paths.failure.exists():
        symptom = paths.failure.read_text(errors="replace").split("\n", 1)[0]
        paths.failure.unlink()
        details.append(f"the workers' failure (exit status {returncode}): {symptom}")
    write_failure(paths, hang.line(), details="\n".join(details))


def _auxiliary(paths: Paths, env: Mapping[str, str]) -> Auxiliary | None:
    """This host's place when its instance group does not train (a heterogeneous cluster); None when it trains."""
    resources = read_resource_config(paths, env)
    if training_cluster(resources, env) is not None:
        return None
    return Auxiliary.of(
        resources, env, _int_env(env, MASTER_PORT_ENV) or DEFAULT_MASTER_PORT, env.get(MASTER_ADDR_ENV) or None
    )


def _follow(paths: Paths, aux: Auxiliary, env: Mapping[str, str]) -> int:
    raw = env.get(AUXILIARY_START_TIMEOUT_ENV, "").strip()
    try:
        timeout = float(raw) if raw else DEFAULT_START_TIMEOUT_SECONDS
    except ValueError:
        raise ContractError(f"environment variable {AUXILIARY_START_TIMEOUT_ENV}={raw!r} must be seconds") from None
    if follow_training(aux, start_timeout=timeout) == 0:
        return EXIT_OK
    write_failure(
        paths,
        f"auxiliary host (group {aux.group}): the training did not start at {aux.master_addr} within {timeout:.0f}s",
    )
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    # The trainer's phases count from here (the Batch contract's launcher child keeps the contract's start).
    os.environ.setdefault(LAUNCHED_ENV, repr(time.monotonic()))
    argv = list(sys.argv[1:] if argv is None else argv)
    if on_batch(os.environ):  # AWS Batch: lay out /opt/ml and sync S3, then run this as a child
        from training import batch_contract  # noqa: PLC0415 - its S3, ledger and goodput code is for Batch alone

        return batch_contract.main(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s launcher: %(message)s", stream=sys.stdout)
    # SageMaker passes "train"; nothing else is expected (configuration comes from /opt/ml).
    if argv not in ([], ["train"]):
        log.warning("ignoring unexpected arguments %s", argv)
    paths = Paths.from_env()
    try:
        if (aux := _auxiliary(paths, os.environ)) is not None:
            return _follow(paths, aux, os.environ)
        launch = _validate_launch(paths, os.environ)
        if launch.code is not None:
            launch = replace(launch, code_dir=user_code.prepare(paths, launch.code))
    except (ConfigError, ContractError, UserCodeError, CodeArchiveError) as exc:
        log.error("invalid input: %s", exc)
        write_failure(paths, str(exc))
        return EXIT_INVALID_INPUT
    except user_code.InstallError as exc:
        log.error("%s", exc)
        write_failure(paths, f"{USER_CODE_FAILED}: {exc}")
        return EXIT_INVALID_INPUT
    try:
        return _launch(paths, launch)
    except Exception as exc:
        log.exception("launcher failed")
        write_failure(paths, f"launcher failed: {describe(exc)}", exc=exc)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

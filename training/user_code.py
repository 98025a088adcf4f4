"""A run's own code in the container (contract/user_code.py): checked, unpacked, its wheels installed, SageMaker's
environment for the script, and the script's end told apart from the platform's.

The launcher calls `prepare` before any worker starts: the archive in the `code` channel must have the digest the
run names (else nothing of it runs), it is unpacked into /opt/ml/code, and the wheels of its requirements are
installed from its wheelhouse into /opt/ml/code/.tp/site-packages with no index and every wheel's hash checked.
Each worker (training/user_worker.py) records how its script ended under the directory in EXITS_ENV; `verdict`
reads those records after the workers ended and writes the failure file: the script's own non-zero exit is
`UserCodeFailed` (never retried), one of `code.retry_on_exit_codes` is `RetryableExit`, and torch.distributed's own
error (a lost peer, NCCL, the store) is `CommunicationFailed`, both retried on fresh instances.

Torch-free: the launcher imports it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from contract.code_archive import CodeArchiveError, unpack
from contract.layout import CHECKPOINT_DIR_ENV, LEDGER_CHANNEL
from contract.user_code import (
    CODE_CHANNEL,
    COMMUNICATION_FAILED,
    PACKED,
    RETRYABLE_EXIT,
    USER_CODE_FAILED,
    WHEELHOUSE,
    UserCode,
    script_hyperparameters,
)
from training.sagemaker_contract import ContractError, Paths, ResourceConfig, write_failure

log = logging.getLogger("training.launcher")

CODE_DIR = "code"
"""Where the code is unpacked, under /opt/ml (the script's working directory, SageMaker's SM_MODULE_DIR)."""
SITE_PACKAGES = f"{PACKED}site-packages"
"""Where its requirements are installed, under the code's directory (first on the workers' PYTHONPATH)."""
PLATFORM_CHANNELS = (CODE_CHANNEL, LEDGER_CHANNEL)
"""Channels that are the platform's, not the script's data: not in SM_CHANNELS."""
INSTALL_TIMEOUT_SECONDS = 1800
STDERR_TAIL_LINES = 15
# torchrun's own lines (its agent's log, glog-style, and the report it raises as the workers end), which follow
# the script's last words on the same stream.
_AGENT_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S*torch/distributed/")
_AGENT_BANNER = re.compile(r"^\*{20,}$|^Setting OMP_NUM_THREADS|^\s*$")
# mpirun's own report of the ranks' end (Open MPI 4's mpirun, 5's prterun): a rule, then a line that names it.
_MPI_RULE = re.compile(r"^-{20,}$")
_MPI_REPORT = re.compile(r"^(?:prterun|mpirun|Primary job)\b")
# What NCCL, aws-ofi-nccl and torch's watchdog print when the collective layer fails under the script: a process
# that died without a record (a signal: NCCL's watchdog aborts it) is a platform fault when its last words say so.
_COMMUNICATION = re.compile(r"NCCL (?:WARN|error)|ncclSystemError|ncclRemoteError|NET/OFI|Watchdog caught collective")


@dataclass(frozen=True)
class ExitRecord:
    """How one worker's script ended, as the worker saw it."""

    rank: int
    host: str
    status: int
    error: str = ""
    """`Type: message` of the exception that ended it ("" for an exit)."""
    communication: bool = False
    """The exception was torch.distributed's own (DistError): the platform's fault, not the script's."""
    at: float = 0.0
    """time.time() when it ended: the first to fail is the root cause, the others' failures its symptoms."""
    local_rank: int = 0
    """Its rank on its host: torchrun's file of its stderr is named by it."""

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f"rank-{self.rank}.partial"
        partial.write_text(json.dumps(asdict(self)))
        os.replace(partial, directory / f"rank-{self.rank}.json")


def exit_records(directory: Path) -> list[ExitRecord]:
    """The workers' records, the first to end first."""
    records = []
    for path in directory.glob("rank-*.json"):
        try:
            records.append(ExitRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(records, key=lambda r: (r.at, r.rank))


def prepare(paths: Paths, code: UserCode) -> Path:
    """Check and unpack the archive into /opt/ml/code and install its requirements; the code's directory.
    CodeArchiveError (the input's fault) or InstallError."""
    archive = paths.channel(CODE_CHANNEL) / code.archive_name
    if not archive.is_file():
        found = (
            sorted(p.name for p in paths.channel(CODE_CHANNEL).glob("*"))
            if paths.channel(CODE_CHANNEL).is_dir()
            else []
        )
        raise ContractError(
            f"the code channel holds no {code.archive_name} (it holds {', '.join(found) or 'nothing'}): the job's "
            f"'{CODE_CHANNEL}' channel must be the packed code whose SHA-256 the run names"
        )
    target = paths.root / CODE_DIR
    shutil.rmtree(target, ignore_errors=True)  # an earlier start's (a managed spot restart)
    started = time.monotonic()
    record = unpack(archive, target, sha256=code.sha256)
    log.info(
        "code %s: %d files unpacked into %s in %.2f s",
        code.sha256[:12],
        len(record.files),
        target,
        time.monotonic() - started,
    )
    if code.requirements:
        if code.requirements not in record.files:
            raise CodeArchiveError(f"the requirements file {code.requirements} is not in the packed code")
        install(target, record.lock())
    return target


class InstallError(RuntimeError):
    """The wheelhouse does not install: the packed code's fault, said with pip's last words."""


def install(code_dir: Path, lock: str) -> None:
    """pip install every wheel of the wheelhouse, pinned and hash-checked, with no index, into SITE_PACKAGES.

    The wheelhouse is the requirements' resolved set, less what the image has (torch): its wheels are installed as
    they are (`--no-deps`), since `--target` would otherwise resolve every dependency again from the wheelhouse
    alone, the image's own packages unseen."""
    lock_file = code_dir / PACKED / "requirements.lock"
    lock_file.write_text(lock)
    command = [
        sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(code_dir / WHEELHOUSE),
        "--require-hashes", "--no-deps", "--target", str(code_dir / SITE_PACKAGES), "--disable-pip-version-check",
        "--no-cache-dir", "--quiet", "-r", str(lock_file),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-STDERR_TAIL_LINES:])
        raise InstallError(f"the requirements did not install from the packed wheelhouse (pip: {tail})")
    log.info("requirements installed from the wheelhouse in %.1f s", time.monotonic() - started)


def _json_value(raw: str) -> object:
    """A hyperparameter as SageMaker's toolkit gives it in SM_HPS: JSON where it parses, else the string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def script_arguments(code: UserCode, hyperparameters: Mapping[str, object]) -> list[str]:
    """`code.args`, then the script's own hyperparameters as `--key value`, as SageMaker's estimators pass them."""
    args = list(code.args)
    for key, value in sorted(script_hyperparameters(hyperparameters).items()):
        args += [f"--{key}", value]
    return args


def script_env(
    paths: Paths,
    code: UserCode,
    code_dir: Path,
    resources: ResourceConfig,
    hyperparameters: Mapping[str, object],
    *,
    gpus: int,
) -> dict[str, str]:
    """SageMaker's training toolkit's variables (SM_*) for the script, the platform's checkpoint folder, and the
    PYTHONPATH that finds the code, its requirements, then what the image already had."""
    own = script_hyperparameters(hyperparameters)
    data = paths.root / "input" / "data"
    channels = sorted(p.name for p in data.glob("*") if p.is_dir() and p.name not in PLATFORM_CHANNELS)
    args = script_arguments(code, hyperparameters)
    env = {
        "SM_MODEL_DIR": str(paths.model),
        "SM_OUTPUT_DIR": str(paths.output),
        "SM_OUTPUT_DATA_DIR": str(paths.output / "data"),
        "SM_OUTPUT_INTERMEDIATE_DIR": str(paths.output / "intermediate"),
        "SM_INPUT_DIR": str(paths.root / "input"),
        "SM_INPUT_CONFIG_DIR": str(paths.hyperparameters.parent),
        "SM_CHANNELS": json.dumps(channels),
        **{f"SM_CHANNEL_{name.upper()}": str(paths.channel(name)) for name in channels},
        "SM_HPS": json.dumps({key: _json_value(value) for key, value in own.items()}),
        **{f"SM_HP_{key.upper()}": value for key, value in own.items()},
        "SM_USER_ARGS": json.dumps(args),
        "SM_USER_ENTRY_POINT": str(code.entry_point),
        "SM_MODULE_DIR": str(code_dir),
        "SM_MODULE_NAME": code.entry_point.module or Path(str(code.entry_point.script)).stem,
        "SM_CURRENT_HOST": resources.current_host,
        "SM_HOSTS": json.dumps(list(resources.hosts)),
        "SM_NUM_GPUS": str(gpus),
        "SM_NUM_CPUS": str(os.cpu_count() or 1),
        "SM_LOG_LEVEL": "20",
        CHECKPOINT_DIR_ENV: str(paths.checkpoints),
    }
    if resources.network_interface_name:
        env["SM_NETWORK_INTERFACE_NAME"] = resources.network_interface_name
    if paths.resource_config.is_file():
        env["SM_RESOURCE_CONFIG"] = paths.resource_config.read_text()
    data_config = paths.hyperparameters.parent / "inputdataconfig.json"
    if data_config.is_file():
        env["SM_INPUT_DATA_CONFIG"] = data_config.read_text()
    platform_root = str(Path(__file__).resolve().parents[1])  # training/ and contract/, wherever the image put them
    python_path = [str(code_dir), str(code_dir / SITE_PACKAGES), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in [*python_path, platform_root] if p))
    return env


def script_tail(lines: Sequence[str]) -> list[str]:
    """The script's last words on stderr: the lines before torchrun's (or mpirun's) own report of the workers' end."""
    kept: list[str] = []
    lines = list(lines)  # the launcher's deque
    for line, following in zip(lines, [*lines[1:], ""], strict=True):
        if _AGENT_LINE.search(line) or (_MPI_RULE.match(line) and _MPI_REPORT.match(following)):
            if kept:  # the launcher's report: what follows is torchrun's traceback or mpirun's notice, not the script's
                break
            continue
        if not _AGENT_BANNER.search(line):
            kept.append(line)
    return kept[-STDERR_TAIL_LINES:]


def mpi_stderr_file(logs: Path, rank: int) -> Path:
    """Where a worker that mpirun started keeps a copy of its stderr (training/user_worker.py): mpirun keeps none."""
    return logs / f"rank-{rank}.stderr.log"


def worker_stderr(logs: Path | None, record: ExitRecord) -> list[str] | None:
    """The last lines a worker wrote to its stderr, from the file torchrun keeps of it (`--log-dir`, `--tee`) or the
    worker's own copy under mpirun; None when there is none."""
    found: list[Path] = []
    if logs is not None:
        found = sorted(logs.glob(f"*/attempt_*/{record.local_rank}/stderr.log"))
        found += [path for path in [mpi_stderr_file(logs, record.rank)] if path.is_file()]
    if not found:
        return None
    lines = found[-1].read_text(errors="replace").splitlines()
    return [line for line in lines if line.strip()][-STDERR_TAIL_LINES:]


def verdict(
    paths: Paths,
    code: UserCode,
    records: Sequence[ExitRecord],
    stderr: Sequence[str],
    status: int,
    *,
    logs: Path | None = None,
) -> str:
    """Write the failure file of workers that exited `status` (not 0) on their own; its first line. `stderr`: the
    workers' stderr as the launcher read it, all ranks together; `logs`: torchrun's file of each worker's, where a
    peer's symptom (its lost connection) cannot follow the failing worker's own last words."""
    failed = [r for r in records if r.status != 0]
    tail = script_tail(stderr)
    if failed and (own := worker_stderr(logs, failed[0])) is not None:
        tail = own
    last = tail[-1].strip() if tail else ""
    if failed:
        first = failed[0]
        where = f"on {first.host} (rank {first.rank})"
        said = first.error or last
        if first.communication:
            line = f"{COMMUNICATION_FAILED}: the script's collective communication failed {where}: {first.error}"
        elif first.status in code.retry_on_exit_codes:
            listed = "which code.retry_on_exit_codes lists"
            line = f"{RETRYABLE_EXIT}: the script exited with status {first.status} {where}, {listed}"
        else:
            line = f"{USER_CODE_FAILED}: the script exited with status {first.status} {where}" + (
                f": {said}" if said else ""
            )
    elif any(_COMMUNICATION.search(text) for text in tail):
        line = f"{COMMUNICATION_FAILED}: a worker died in the collective layer (its last words name NCCL): {last}"
    else:
        line = (
            f"{USER_CODE_FAILED}: the script's workers exited with status {status} without ending normally "
            f"(a signal, such as the kernel's out-of-memory kill, or os._exit)" + (f": {last}" if last else "")
        )
    write_failure(paths, line, details="\n".join(tail))
    return line

"""One worker of a run's own code: the pre-flight check, then the script itself in this process, as
``python <script> <args>`` (or ``python -m <module> <args>``) would run it, and a record of how it ended.

    torchrun ... -m training.user_worker train.py --epochs 3
    torchrun ... -m training.user_worker -m package.train --epochs 3

The pre-flight check (training/preflight.py) runs in a process group of its own, on keys of the rendezvous store
that no other group uses, which it destroys before the script starts: the script then sets up its own
(`init_process_group()`) as under plain torchrun. The script runs in this interpreter (no second start of Python
and torch), with `sys.argv`, `__main__` and `sys.path[0]` as Python would set them. Its end is recorded for the
launcher (training/user_code.py): the exit status, and the exception that ended it, whose class tells
torch.distributed's own failure (a lost peer, NCCL, the store) from the script's.
"""

from __future__ import annotations

import io
import os
import runpy
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TextIO, cast

from contract import distributions
from contract.layout import EXITS_ENV
from training.preflight import Preflight, PreflightError, failure_line
from training.sagemaker_contract import Paths, read_resource_config, write_failure
from training.user_code import ExitRecord, mpi_stderr_file

PREFLIGHT_PREFIX = "platform-preflight/"
"""The rendezvous store's keys of the pre-flight's process group (the script's own group uses none of them)."""


class _Tee(io.TextIOBase):
    """The worker's stderr, copied line by line to a file of its own."""

    def __init__(self, stream: TextIO, copy: TextIO) -> None:
        super().__init__()
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.copy.flush()
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


def _keep_stderr(exits: str) -> None:
    """Under mpirun, whose output carries every rank's lines together, a copy of this worker's stderr for the launcher
    (torchrun keeps one itself): the failing rank's own last words, not a peer's lost connection that followed."""
    if not exits or "OMPI_COMM_WORLD_RANK" not in os.environ:
        return
    path = mpi_stderr_file(Path(exits) / "logs", int(os.environ["OMPI_COMM_WORLD_RANK"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr = cast(TextIO, _Tee(sys.stderr, path.open("a", buffering=1, errors="replace")))


def run_preflight(preflight: Preflight, host: str) -> None:
    """The checks in a gloo group of every worker, on the torchrun agent's store (mpirun: one global rank 0 hosts
    on the port after MASTER_PORT); destroyed afterwards."""
    import torch.distributed as dist  # noqa: PLC0415 - the script imports torch anyway; the launcher never does
    from torch._C._distributed_c10d import PrefixStore, TCPStore  # noqa: PLC0415

    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    preflight.check_devices(host, local_rank)
    timeout = timedelta(minutes=preflight.checks.timeout_minutes)
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = TCPStore(address, port if agent else port + 1, ranks, is_master=not agent and rank == 0, timeout=timeout)
    dist.init_process_group(
        "gloo", store=PrefixStore(PREFLIGHT_PREFIX, store), rank=rank, world_size=ranks, timeout=timeout
    )
    try:
        preflight.run(host, rank=rank, ranks=ranks, local_rank=local_rank, group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def _status(exc: SystemExit) -> int:
    """The exit status `sys.exit(code)` gives, printing a message code as Python does."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _communication(exc: BaseException) -> bool:
    distributed = sys.modules.get("torch.distributed")
    error = getattr(distributed, "DistError", None)
    return error is not None and isinstance(exc, error)


def run_script(argv: Sequence[str]) -> tuple[int, BaseException | None]:
    """Run the entry point (`argv`: the script or `-m module`, then its arguments) as __main__; its exit status and
    the exception that ended it."""
    module = argv[1] if argv[0] == "-m" else None
    args = list(argv[2:] if module else argv[1:])
    if module is None:
        script = os.path.abspath(argv[0])
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(script)  # as `python script.py` sets it
    else:
        sys.argv = [module, *args]  # runpy sets argv[0] to the module's file
        sys.path[0] = os.getcwd()  # as `python -m module` sets it
    try:
        if module is None:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        status = _status(exc)
    except BaseException as exc:
        traceback.print_exc()
        return 1, exc
    else:
        status = 0
    if status == 0:
        _end_process_group()
    return status, None


def _end_process_group() -> None:
    """Destroy the process group a script that succeeded left up (HF's Trainer does): torch's threads are then joined
    here, not torn down in the interpreter's exit, where a gloo group's can abort the process (SIGABRT) after a good
    run. A failed script's group is left as it is: after a lost peer, ending an NCCL communicator can block."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    distributions.torchrun_variables(os.environ)
    exits = os.environ.get(EXITS_ENV, "")
    _keep_stderr(exits)
    paths = Paths.from_env()
    host = read_resource_config(paths).current_host
    preflight = Preflight.from_env(os.environ)
    if preflight is not None:
        try:
            run_preflight(preflight, host)
        except PreflightError as exc:
            write_failure(paths, failure_line(str(exc)), exc=exc.__cause__)
            return 1
        # The check's own NCCL log settings stay: NCCL read them once; the script's communicators log as the check's.
    status, error = run_script(argv)
    if exits:
        described = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        record = ExitRecord(
            rank=int(os.environ.get("RANK", "0")),
            host=host,
            status=status,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            error=described.rstrip(": ") if error is not None else "",
            communication=error is not None and _communication(error),
            at=time.time(),
        )
        record.write(Path(exits))
    sys.stdout.flush()
    sys.stderr.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks of a run's own code: the launcher's start-up against plain torchrun of the same script, and the SDK's
cost per step:

    python -m training.bench_own_code startup --nproc 2 --repeats 5
    python -m training.bench_own_code sdk-step
    python -m training.bench_own_code lightning-step


The start-up script imports torch, joins a gloo process group, takes one step of a small model and prints its loss:
the time from starting the command to that line is what a user waits for, whatever their model. The launcher's run
adds what it does for the script: the archive checked and unpacked, the worker's pre-flight check (with it and
without it), the SDK-free worker module around the script. The package's bytecode is compiled first, as the image
build does (training/Dockerfile).
"""

from __future__ import annotations

import argparse
import compileall
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contract.code_archive import pack
from contract.layout import HEARTBEAT_ENV, MASTER_ADDR_ENV, MASTER_PORT_ENV, NPROC_ENV, OPT_ML_ROOT_ENV
from contract.user_code import CODE_CHANNEL
from training.sagemaker_contract import Paths

FIRST_STEP_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(256, 256)
loss = model(torch.randn(32, 256)).square().mean()
loss.backward()
if dist.get_rank() == 0:
    print(f"step=1 loss={loss.item()!r}", flush=True)
dist.destroy_process_group()
"""
_FIRST_STEP = re.compile(r"^step=1 loss=")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _first_step(command: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `command` to its first step's line."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and _FIRST_STEP.search(line):
            first = time.perf_counter() - started
    if proc.wait() != 0 or first is None:
        raise RuntimeError("the run failed:\n" + "".join(lines[-30:]))
    return first


def _tree(root: Path, script: Path, *, preflight: bool) -> Paths:
    paths = Paths(root)
    packed = pack(script.parent, paths.channel(CODE_CHANNEL))
    paths.hyperparameters.parent.mkdir(parents=True, exist_ok=True)
    hps = {"code.entry_point": script.name, "code.sha256": packed.sha256, "preflight": str(preflight).lower()}
    paths.hyperparameters.write_text(json.dumps(hps))
    paths.resource_config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    return paths


def bench_own_code_startup(*, nproc: int, repeats: int) -> dict[str, Any]:
    """Median seconds to the first step: plain torchrun, the launcher without and with the pre-flight check,
    run in turn `repeats` times."""
    seconds: dict[str, list[float]] = {"torchrun": [], "launcher": [], "launcher_preflight": []}
    for package in ("contract", "training"):  # the image ships their bytecode (training/Dockerfile)
        compileall.compile_dir(Path(__file__).resolve().parents[1] / package, quiet=1)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "TRAINING_", "RANK", "WORLD_SIZE"))}
    with tempfile.TemporaryDirectory(prefix="bench-own-code-") as tmp:
        script = Path(tmp) / "src" / "train.py"
        script.parent.mkdir()
        script.write_text(FIRST_STEP_SCRIPT)
        for repeat in range(repeats):
            for kind in list(seconds) if repeat % 2 == 0 else list(reversed(seconds)):
                port = str(_free_port())
                env = {**base, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
                if kind == "torchrun":
                    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                               "--master_addr=127.0.0.1", f"--master_port={port}", str(script)]  # fmt: skip
                else:
                    paths = _tree(Path(tmp) / f"ml-{repeat}-{kind}", script, preflight=kind == "launcher_preflight")
                    env |= {OPT_ML_ROOT_ENV: str(paths.root), MASTER_ADDR_ENV: "127.0.0.1", MASTER_PORT_ENV: port}
                    env[NPROC_ENV] = str(nproc)
                    command = [sys.executable, "-m", "training.launcher", "train"]
                seconds[kind].append(_first_step(command, env))
    median = {kind: statistics.median(values) for kind, values in seconds.items()}
    return {
        "check": "own-code-startup",
        "procs": nproc,
        "repeats": repeats,
        **{f"first_step_s_{kind}": round(value, 2) for kind, value in median.items()},
        "ratio_launcher": round(median["launcher"] / median["torchrun"], 3),
        "ratio_launcher_preflight": round(median["launcher_preflight"] / median["torchrun"], 3),
    }


def bench_sdk_step(*, calls: int) -> dict[str, Any]:
    """Microseconds of `sdk.report_step` on rank 0 with the launcher's step reports on: alone (the hang check's
    report) and with a loss and a learning rate (the metrics line, written to a pipe's worth of buffer)."""
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        os.environ.update({HEARTBEAT_ENV: tmp, "RANK": "0", "TRAINING_CHECKPOINT_DIR": tmp})
        from training import sdk  # noqa: PLC0415

        sdk.report_step(0)
        cost = {}
        for kind, values in (("report", {}), ("report_metrics", {"loss": 2.3456789, "lr": 3e-4})):
            sink = io.StringIO()
            with redirect_stdout(sink):
                started = time.perf_counter()
                for step in range(1, calls + 1):
                    sdk.report_step(step, **values)
                cost[kind] = (time.perf_counter() - started) / calls * 1e6
    return {
        "check": "sdk-step",
        "calls": calls,
        **{f"{kind}_us": round(us, 2) for kind, us in cost.items()},
        "pct_of_10ms_step": round(max(cost.values()) / 10_000 * 100, 3),
    }


def bench_lightning_step(*, calls: int) -> dict[str, Any]:
    """Microseconds of the Lightning callback's work per optimizer step on rank 0 of one process (its stop check has
    no peer to agree with): the step report and the stop check, with the metrics line every 50th step and every step.
    The Trainer is a stand-in holding what the callback reads, so that only the callback is timed."""
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        os.environ.update({HEARTBEAT_ENV: tmp, "RANK": "0", "TRAINING_CHECKPOINT_DIR": tmp})
        import torch  # noqa: PLC0415

        from training.sdk.lightning import PlatformCallback  # noqa: PLC0415

        callback = PlatformCallback()
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
        trainer = SimpleNamespace(global_step=0, optimizers=[optimizer], max_steps=-1)
        outputs = {"loss": torch.tensor(2.3456789)}
        cost, step = {}, 0
        for every in (50, 1):
            callback.log_every = every
            sink = io.StringIO()
            with redirect_stdout(sink):
                started = time.perf_counter()
                for _ in range(calls):
                    step += 1
                    trainer.global_step = step
                    callback.on_train_batch_start(trainer, None, None, step)  # type: ignore[arg-type]
                    callback.on_train_batch_end(trainer, None, outputs, None, step)  # type: ignore[arg-type]
                cost[f"log_every_{every}"] = (time.perf_counter() - started) / calls * 1e6
    return {
        "check": "lightning-step",
        "calls": calls,
        **{f"{kind}_us": round(us, 2) for kind, us in cost.items()},
        "pct_of_10ms_step": round(max(cost.values()) / 10_000 * 100, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench_own_code", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    startup = commands.add_parser("startup", help="the launcher against plain torchrun, to the first step")
    startup.add_argument("--nproc", type=int, default=2)
    startup.add_argument("--repeats", type=int, default=5, help="runs of each, in turn")
    step = commands.add_parser("sdk-step", help="the cost of sdk.report_step")
    step.add_argument("--calls", type=int, default=20000)
    lightning = commands.add_parser("lightning-step", help="the cost of the Lightning callback per step")
    lightning.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    if args.command == "startup":
        row = bench_own_code_startup(nproc=args.nproc, repeats=args.repeats)
    elif args.command == "sdk-step":
        row = bench_sdk_step(calls=args.calls)
    else:
        row = bench_lightning_step(calls=args.calls)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

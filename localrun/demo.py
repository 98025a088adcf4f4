"""`make demo`: the whole training pipeline, run locally, through the synthesized state machine.

1. Synthesize the platform (cdk-nag and all) into <out>/cdk.out.
2. Deploy its pipeline into moto and seed the datasets bucket with a generated corpus.
3. Start an execution with the input (default examples/demo.json): the real handlers answer
   every Lambda task, and the training job really trains: one launcher per local "host",
   one torchrun job over localhost (gloo).
4. Answer approval gates (prompt, --auto-approve, or --reject), follow progress, and write a
   run report with the loss curve and the registered model's lineage.

`--fault monitor-throttle` injects a burst of transient errors (throttling, 5xx) into the AWS calls of
the backend's progress handler, longer than any other handler's retry budget; `--fault monitor-timeout`
makes it time out three times. The run rides through either and completes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from localrun import report
from localrun.cfn import ACCOUNT, REGION
from localrun.clock import Clock
from localrun.corpus import build_shards
from localrun.engine import LocalPlatform, player_factories
from localrun.sagemaker_local import LocalTraining
from stacks.pipeline.polled_job import CHECK_PROGRESS
from training.distributions import distribution
from training.layout import split_s3_uri
from training.metrics import TOKENS_PER_SEC, TRAIN_LOSS, VALIDATION_LOSS, parse_line

REPO = Path(__file__).resolve().parents[1]
DEMO_APPROVER = f"arn:aws:iam::{ACCOUNT}:role/DemoApprover"
DEMO_RECIPIENT = "ml-engineer@example.org"
# How the local runner scales a request whose model cannot train on this machine in minutes.
LOCAL_MODEL = {
    "seq_len": "128",
    "batch_size": "8",
    "train.global_batch_size": "0",
    "optim.warmup_steps": "20",
    "checkpoint.interval_steps": "40",
    "checkpoint.interval_minutes": "0",
    "eval.interval_steps": "100",
    "eval.max_sequences": "64",
    "metrics.log_interval": "5",
    "parallel.compile": "false",
    "parallel.activation_checkpointing": "false",
}
TINY = {"tiny", "llama-tiny"}
# Longer requests are cut to this many steps locally (a few tens of seconds on 2 cores).
LOCAL_MAX_STEPS = 300


# A burst longer than the short retry budget (stacks/constructs/tasks.py), well within the polling one.
BURST = ["ThrottlingException", "InternalFailure", "ServiceUnavailable"] * 3 + ["ThrottlingException"]
FAULTS = ("monitor-throttle", "monitor-timeout")


@dataclass
class Outcome:
    execution_arn: str
    described: dict[str, Any]
    states: list[tuple[str, float]]
    job_names: list[str]
    report: Path
    decisions: list[dict[str, Any]] = field(default_factory=list)


def _say(message: str) -> None:
    print(message, flush=True)


def _context(out: Path) -> dict[str, Any]:
    context: dict[str, Any] = json.loads((REPO / "cdk.json").read_text())["context"]
    platform = context["platform"]
    platform["approvers"] = [DEMO_APPROVER]
    platform["notifications"] = {**platform.get("notifications", {}), "run_emails": [DEMO_RECIPIENT]}
    return context


def synthesize(out: Path) -> Path:
    # Imported here: aws_cdk starts jsii's Node.js runtime on import, after main() set its environment.
    from stacks.app_builder import build_platform  # noqa: PLC0415

    assembly = out / "cdk.out"
    started = time.monotonic()
    build_platform(_context(out), outdir=str(assembly)).synth()
    _say(f"synthesized 4 stacks with cdk-nag into {assembly} ({time.monotonic() - started:.1f} s)")
    return assembly


def local_scale(hyperparameters: dict[str, str], steps: int | None) -> dict[str, str]:
    """Overrides for what this machine runs; the request, the job and the lineage keep the originals."""
    scaled: dict[str, str] = {}
    model = hyperparameters.get("model", hyperparameters.get("model.name", "tiny"))
    if model not in TINY:
        scaled = {**LOCAL_MODEL, "model": "llama-tiny" if model.startswith("llama") else "tiny"}
    requested = int(hyperparameters.get("max_steps", hyperparameters.get("train.max_steps", "1000")))
    if steps is not None:
        scaled["max_steps"] = str(steps)
    elif requested > LOCAL_MAX_STEPS:
        scaled["max_steps"] = str(LOCAL_MAX_STEPS)
    if "max_steps" in scaled:  # warmup must fit in the shorter run
        warmup = int(scaled.get("optim.warmup_steps", hyperparameters.get("optim.warmup_steps", "100")))
        scaled["optim.warmup_steps"] = str(min(warmup, max(1, int(scaled["max_steps"]) // 10)))
    strategy = distribution(hyperparameters.get("distribution", "ddp"))
    if strategy.local_stand_in != strategy.name:  # SageMaker's library and mpirun are not on this machine
        scaled["distribution"] = strategy.local_stand_in
    return scaled


def run_demo(
    *,
    execution_input: dict[str, Any],
    out: Path,
    auto_approve: bool,
    reject: bool,
    spot_interrupt: bool,
    max_hosts: int = 2,
    procs_per_host: int = 1,
    steps: int | None = None,
    assembly: Path | None = None,
    approver: str = DEMO_APPROVER,
    wait_seconds: float = 2.0,
    timeout_seconds: float = 900.0,
    fault: str | None = None,
) -> Outcome:
    """Synthesize (unless given an assembly), run the input to its end locally, and write the run report."""
    out.mkdir(parents=True, exist_ok=True)
    assembly = assembly or synthesize(out)
    run_dir = out / execution_input.get("run_name", "run")
    run_dir.mkdir(parents=True, exist_ok=True)
    printer = _Printer()
    training = LocalTraining(
        root=run_dir / "jobs",
        datasets_bucket="",
        max_hosts=max_hosts,
        procs_per_host=procs_per_host,
        spot_interrupt_after_checkpoint=spot_interrupt,
        on_line=printer.training_line,
    )
    # The other backends' jobs, e.g. `"backend": "batch"`: AWS Batch multi-node jobs, their nodes on this machine.
    players = {
        name: make(run_dir / name, max_hosts=max_hosts, spot_interrupt=spot_interrupt, on_line=printer.training_line)
        for name, make in player_factories().items()
    }
    # Polls every `pipeline.poll_interval_seconds` in the definition; here they last `wait_seconds`.
    clock = Clock(wait_scale=wait_seconds / 300, retry_scale=0.01)
    handler_log = (run_dir / "handlers.log").open("w")
    with (
        handler_log,
        LocalPlatform(assembly, training=training, clock=clock, handler_log=handler_log, players=players) as platform,
    ):
        training.datasets_bucket = platform.environment("Validate")["DATASETS_BUCKET"]
        _seed_datasets(platform, execution_input, out / "corpus")
        training.local_hyperparameters = _local_hyperparameters(execution_input, steps)
        for player in players.values():
            player.datasets_bucket = training.datasets_bucket
            player.local_hyperparameters = training.local_hyperparameters
        if fault is not None:
            inject(platform, fault)
        name = f"{execution_input.get('run_name', 'run')}-{datetime.now().strftime('%H%M%S')}"
        arn = platform.start(execution_input, name=name)
        _say(f"started execution {name}\n")
        try:
            described, decisions = _follow(
                platform,
                arn,
                printer,
                approver=approver,
                auto_approve=auto_approve,
                reject=reject,
                timeout_seconds=timeout_seconds,
            )
        finally:
            training.stop_all()
            for player in players.values():
                player.close()
        facts = report.collect(platform, training, arn, described, decisions)
        if fault is not None:
            _say(f"\n{fault}: {_ridden(platform, arn)}")
    return _write_report(facts, arn, described, run_dir)


def progress_handlers(platform: LocalPlatform) -> list[str]:
    """The progress handler of every backend (LocalPlatform's names): what the Check progress states invoke."""
    definition = json.loads(
        platform.sfn.describe_state_machine(stateMachineArn=platform.state_machine_arn)["definition"]
    )
    physical = [
        state["Resource"].rsplit(":function:", 1)[1]
        for name, state in definition["States"].items()
        if name.startswith(CHECK_PROGRESS) and ":function:" in state.get("Resource", "")
    ]
    return [str(platform.functions[name].key) for name in physical]


def inject(platform: LocalPlatform, fault: str) -> None:
    """Queue `fault` (one of FAULTS) at every backend's progress handler: the run's backend meets it."""
    for function in progress_handlers(platform):
        if fault == "monitor-throttle":
            platform.faults.api_errors[function] = list(BURST)
        elif fault == "monitor-timeout":
            platform.faults.timeouts[function] = 3
        else:
            raise ValueError(f"--fault {fault!r}: use one of {', '.join(FAULTS)}")


def _ridden(platform: LocalPlatform, arn: str) -> str:
    """What the injected faults did: the handler failures the execution met, and the retries that followed."""
    failures = [
        details["error"]
        for event in platform.history(arn)
        for key, details in event.items()
        if key == "lambdaFunctionFailedEventDetails"
    ]
    counts = ", ".join(f"{failures.count(error)} {error}" for error in sorted(set(failures)))
    waits = platform.clock.retries
    return f"handler failures: {counts or 'none'}; {len(waits)} retries, {sum(waits) / 60:.1f} min of backoff"


def _local_hyperparameters(execution_input: dict[str, Any], steps: int | None) -> dict[str, str]:
    """What this machine runs instead of the input's hyperparameters (said aloud); {} when it runs them as given."""
    original = {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in execution_input.get("hyperparameters", {}).items()
    }
    requested = {
        **original,
        "model": str(execution_input.get("model") or original.get("model", "tiny")),
        "distribution": str(execution_input.get("distribution", "ddp")),
    }
    scaled = local_scale(requested, steps)
    # A tuning job's trials run the values it samples, never a local override of them.
    tuned = set((execution_input.get("tuning") or {}).get("ranges", {}))
    scaled = {k: v for k, v in scaled.items() if k not in tuned}
    if scaled:
        _say(
            "local scale (the request, the job and the lineage keep the input's values): "
            + ", ".join(f"{k}={v}" for k, v in sorted(scaled.items()))
        )
    else:
        _say("the training job runs the input's hyperparameters as given")
    return scaled


def _follow(
    platform: LocalPlatform,
    arn: str,
    printer: _Printer,
    *,
    approver: str,
    auto_approve: bool,
    reject: bool,
    timeout_seconds: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Print states as they are entered and answer gates until the execution ends: (described, decisions)."""
    decisions: list[dict[str, Any]] = []
    started = time.monotonic()
    while True:
        described: dict[str, Any] = platform.sfn.describe_execution(executionArn=arn)
        printer.states(platform, arn, started)
        decisions.extend(_answer_gates(platform, arn, approver=approver, auto_approve=auto_approve, reject=reject))
        if described["status"] != "RUNNING":
            break
        if time.monotonic() - started > timeout_seconds:
            platform.sfn.stop_execution(executionArn=arn, error="DemoTimeout", cause="local time limit")
            name = arn.rsplit(":", 1)[-1]
            raise TimeoutError(f"execution {name} still running after {timeout_seconds:.0f} s")
        time.sleep(0.3)
    printer.states(platform, arn, started)
    return described, decisions


def _seed_datasets(platform: Any, execution_input: dict[str, Any], workdir: Path) -> None:
    """Put the generated corpus where the input's datasets point (as if engineers had uploaded it)."""
    shards = build_shards(workdir)
    bucket = platform.environment("Validate")["DATASETS_BUCKET"]
    s3 = boto3.client("s3", region_name=REGION)
    for key in ("dataset", "validation_dataset"):
        uri = execution_input.get(key)
        if not isinstance(uri, str):
            continue
        if uri.startswith("fsx:///datasets/"):
            prefix = uri.removeprefix("fsx:///datasets/").strip("/") + "/"
        elif uri.startswith(f"s3://{bucket}/"):
            prefix = split_s3_uri(uri)[1].strip("/") + "/"
        else:
            continue  # Validate will reject it
        for shard in shards:
            s3.upload_file(str(shard), bucket, prefix + shard.name)
        tokens = sum((s.stat().st_size - 1024) // 2 for s in shards)
        _say(f"seeded s3://{bucket}/{prefix} with the demo corpus ({len(shards)} shards, {tokens:,} tokens)")


def _answer_gates(platform: Any, arn: str, *, approver: str, auto_approve: bool, reject: bool) -> list[dict[str, Any]]:
    """Decide open requests of this execution as `approver`, as tools/approve.py does, through the real handler."""
    session = platform.person(approver, "demo")
    pending = json.loads(platform.call_decision_url(session, "GET")["body"])["pending"]
    answered = []
    for request in pending:
        if request["execution"] != arn:
            continue
        summary = json.loads(request["summary"])
        _say(f"\n  approval needed: {request['gate']} of {request['run_name']} (request {request['request_id']})")
        for key, value in sorted(summary.items()):
            _say(f"    {key}: {value}")
        if reject:
            decision, reason = "reject", "rejected in the demo (--reject)"
        elif auto_approve or not sys.stdin.isatty():
            decision, reason = "approve", "approved in the demo (--auto-approve)"
        else:
            answer = input("    approve? [y/N] ").strip().lower()
            decision = "approve" if answer in ("y", "yes") else "reject"
            reason = input("    reason: ").strip() or f"{decision}d at the demo prompt"
        body = {"request_id": request["request_id"], "decision": decision, "reason": reason}
        response = platform.call_decision_url(session, "POST", body)
        result = json.loads(response["body"])
        _say(f"    -> {result.get('decision', result.get('error'))} by {result.get('by', approver)}\n")
        answered.append(result)
    return answered


class _Printer:
    """States as they are entered; training steps with loss and throughput."""

    def __init__(self) -> None:
        self.seen = 0
        self.lock = threading.Lock()

    def states(self, platform: Any, arn: str, started: float) -> None:
        entered = platform.states_entered(arn)
        with self.lock:
            for name in entered[self.seen :]:
                _say(f"[{time.monotonic() - started:6.1f}s] > {name}")
            self.seen = len(entered)

    def training_line(self, job: str, line: str) -> None:
        step, values = parse_line(line) or (0, {})
        with self.lock:
            if TRAIN_LOSS in values:
                rate = f" tokens/s={values[TOKENS_PER_SEC]:,.0f}" if TOKENS_PER_SEC in values else ""
                _say(f"          [{job}] step {step:>4} loss {values[TRAIN_LOSS]:.4f}{rate}")
            elif VALIDATION_LOSS in values:
                _say(f"          [{job}] step {step:>4} validation loss {values[VALIDATION_LOSS]:.4f}")
            elif line.startswith("--") or "resumed from checkpoint" in line or "Error" in line:
                _say(f"          [{job}] {line.strip()}")


def _write_report(facts: report.RunFacts, arn: str, described: dict[str, Any], run_dir: Path) -> Outcome:
    """Save the run's files and report.md, print the report, and return the outcome."""
    report.save(facts, run_dir)
    text = report.render(facts, run_dir)
    path = run_dir / "report.md"
    path.write_text(text + "\n")
    _say("")
    _say(text)
    _say(f"\nreport: {path}")
    return Outcome(
        execution_arn=arn,
        described=described,
        states=facts.states,
        job_names=[job.name for job in facts.jobs],
        report=path,
        decisions=facts.decisions,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=REPO / "examples" / "demo.json", help="execution input JSON")
    parser.add_argument("--out", type=Path, default=REPO / "demo-out", help="where the run's files go")
    parser.add_argument("--auto-approve", action="store_true", help="approve every gate without asking")
    parser.add_argument("--reject", action="store_true", help="reject the first gate (the rejection path)")
    parser.add_argument("--spot-interrupt", action="store_true", help="interrupt the job after its first checkpoint")
    parser.add_argument("--hosts", type=int, default=2, help="local hosts (processes started like instances)")
    parser.add_argument("--procs-per-host", type=int, default=1, help="training processes per host")
    parser.add_argument("--steps", type=int, help="override the local run's max_steps")
    parser.add_argument("--fault", choices=FAULTS, help="inject transient faults at the progress handler")
    args = parser.parse_args(argv)
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    for var, value in {
        "AWS_ACCESS_KEY_ID": "demo",
        "AWS_SECRET_ACCESS_KEY": "demo",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        os.environ[var] = value
    os.environ.pop("AWS_PROFILE", None)
    started = time.monotonic()
    outcome = run_demo(
        execution_input=json.loads(args.input.read_text()),
        out=args.out,
        auto_approve=args.auto_approve,
        reject=args.reject,
        spot_interrupt=args.spot_interrupt,
        max_hosts=args.hosts,
        procs_per_host=args.procs_per_host,
        steps=args.steps,
        fault=args.fault,
    )
    _say(f"demo finished in {time.monotonic() - started:.0f} s")
    expected = "FAILED" if args.reject else "SUCCEEDED"
    return 0 if outcome.described["status"] == expected else 1


if __name__ == "__main__":
    sys.exit(main())

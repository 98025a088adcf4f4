"""`make demo`: the whole training pipeline, run locally, through the synthesized state machine.

1. Synthesize the platform (cdk-nag and all) into <out>/cdk.out.
2. Deploy its pipeline into moto and seed the datasets bucket with a generated corpus.
3. Start an execution with the input (default examples/demo.json): the real handlers answer
   every Lambda task, and the training job really trains: one launcher per local "host",
   one torchrun job over localhost (gloo).
4. Answer approval gates (prompt, --auto-approve, or --reject), follow progress, and write a
   run report with the loss curve and the registered model's lineage.

The terminal shows the states as the execution enters them (a polling loop once), the training
progress and a summary; `--verbose` adds the harness's own lines and the whole report.
`--reject` rejects every gate the run reaches, `--reject launch` or `--reject promotion` only that one.

`--fault monitor-throttle` injects a burst of transient errors (throttling, 5xx) into the AWS calls of
the backend's progress handler, longer than any other handler's retry budget; `--fault monitor-timeout`
makes it time out three times. The run rides through either and completes. `--fault insufficient-capacity`
leaves the run's first cluster without instances: its job fails as SageMaker fails one it cannot provision
(CapacityError), and the pipeline's next attempt runs on the input's next `fallback` cluster; the summary and the
report say which cluster trained (e.g. INPUT=examples/capacity-fallback.json).

`--new-data` (the default for examples/retrain-on-new-data.json) plays a retrain trigger's input as the S3 events
of its new data: the demo writes the data under the trigger's prefix, the deployed rule's RetrainRecord records it,
the quiet period passes on the local clock and RetrainSweep starts the run (localrun/demo/new_data.py);
`--no-new-data` starts it as an ordinary run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

from contract.distributions import distribution
from contract.execution_state import REQUEST, TRAIN, Failure
from contract.layout import split_s3_uri
from contract.metrics import TOKENS_PER_SEC, TRAIN_LOSS, VALIDATION_LOSS, parse_line
from contract.service_requests import EXECUTION_TAG
from lambdas.backends import BACKENDS
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.clock import Clock
from localrun.aws.decision_url import DecisionUrl
from localrun.aws.engine import LocalPlatform, LocalPlayer, player_factories
from localrun.aws.served import ServedPlatform
from localrun.backends.queue import ServiceJob
from localrun.backends.sagemaker import LocalTraining
from localrun.demo import faults, new_data, own_code, report, scenario
from localrun.demo.corpus import build_shards
from localrun.demo.fine_tuning import build_fine_tuning
from localrun.demo.jobs import loss_curve
from localrun.demo.scenario import After, Run, Scenario, ScenarioError
from stacks.outputs import TEAM_BUDGET
from stacks.pipeline.polled_job import RETRY_TOLD
from stacks.settings import OVERRIDES_VARIABLE, settings_from_context
from tools.approval_view import decided
from tools.scenario_files import is_scenario

if TYPE_CHECKING:
    from stacks.app_builder import Platform

REPO = Path(__file__).resolve().parents[2]
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

# The approval gates a run can meet (the `name` each ApprovalGate.gate call gives), in the order it meets them.
GATES = ("launch", "promotion")
# Loggers of the engine under the demo (moto, the AWS SDK, moto's HTTP layer): shown only with --verbose.
# moto's Step Functions logs every failure it handles (a rejection, a retried task) at ERROR, with its state's repr.
ENGINE_LOGGERS = ("moto", "botocore", "boto3", "s3transfer", "urllib3", "werkzeug")
LOOP_STATES = report.LOOP_STATES
# The quiet trace shows a training job's loss at most once per this many steps (and every validation).
PROGRESS_STEPS = 20


@dataclass
class Outcome:
    execution_arn: str
    described: dict[str, Any]
    states: list[tuple[str, float]]
    job_names: list[str]
    report: Path
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        """The execution's own folder: its report, logs, loss curves and lineage."""
        return self.report.parent


def _say(message: str) -> None:
    print(message, flush=True)


def _quiet(_message: str) -> None:
    """Where the harness's own lines (set-up, local scale) go without --verbose."""


def _context(out: Path, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """cdk.json's context with the demo's approver and recipient, and `settings` merged over its platform settings."""
    context: dict[str, Any] = json.loads((REPO / "cdk.json").read_text())["context"]
    platform = context["platform"]
    platform.update(settings or {})
    platform["approvers"] = [DEMO_APPROVER]
    platform["notifications"] = {**platform.get("notifications", {}), "run_emails": [DEMO_RECIPIENT]}
    return context


def synthesize(out: Path, say: Callable[[str], None] = _say, settings: dict[str, Any] | None = None) -> Path:
    # Imported here: aws_cdk starts jsii's Node.js runtime on import, after main() set its environment.
    from stacks.app_builder import build_platform  # noqa: PLC0415

    assembly = out / "cdk.out"
    started = time.monotonic()
    platform = build_platform(_context(out, settings), outdir=str(assembly))
    acknowledge_demo_settings(platform)
    platform.synth()
    say(f"synthesized 4 stacks with cdk-nag into {assembly} ({time.monotonic() - started:.1f} s)")
    return assembly


def acknowledge_demo_settings(platform: Platform) -> None:
    """Acknowledge, by its id, the synth's warning about the demo's own settings (_context): its approver decides
    at the demo's terminal, so no approval e-mail is needed. Any other warning is still shown."""
    from aws_cdk import Annotations  # noqa: PLC0415 - see synthesize

    from stacks.app_builder import NO_APPROVAL_EMAIL  # noqa: PLC0415

    Annotations.of(platform.pipeline).acknowledge_warning(
        NO_APPROVAL_EMAIL, "the demo's approver decides at the demo's terminal, where the demo shows each request"
    )


def local_scale(hyperparameters: dict[str, str], steps: int | None, *, cap_steps: bool = True) -> dict[str, str]:
    """Overrides for what this machine runs; the request, the job and the lineage keep the originals. Without
    `cap_steps` the job's steps are the request's (a scenario's runs, each sized for this machine)."""
    scaled: dict[str, str] = {}
    model = hyperparameters.get("model", hyperparameters.get("model.name", "tiny"))
    if model not in TINY:
        scaled = {**LOCAL_MODEL, "model": "llama-tiny" if model.startswith("llama") else "tiny"}
    requested = int(hyperparameters.get("max_steps", hyperparameters.get("train.max_steps", "1000")))
    if steps is not None:
        scaled["max_steps"] = str(steps)
    elif requested > LOCAL_MAX_STEPS and cap_steps:
        scaled["max_steps"] = str(LOCAL_MAX_STEPS)
    if "max_steps" in scaled:  # warmup must fit in the shorter run
        warmup = int(scaled.get("optim.warmup_steps", hyperparameters.get("optim.warmup_steps", "100")))
        scaled["optim.warmup_steps"] = str(min(warmup, max(1, int(scaled["max_steps"]) // 10)))
    strategy = distribution(hyperparameters.get("distribution", "ddp"))
    if strategy.local_stand_in != strategy.name:  # SageMaker's library and mpirun are not on this machine
        scaled["distribution"] = strategy.local_stand_in
    return scaled


@contextlib.contextmanager
def _engine_quiet(quiet: bool) -> Iterator[None]:
    """Silence the engine's loggers while the quiet demo runs; --verbose leaves them as they are."""
    loggers = [logging.getLogger(name) for name in ENGINE_LOGGERS]
    levels = [logger.level for logger in loggers]
    if quiet:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def run_demo(
    *,
    execution_input: dict[str, Any],
    out: Path,
    auto_approve: bool,
    reject: str | None,
    spot_interrupt: bool,
    hang: bool = False,
    max_hosts: int = 2,
    procs_per_host: int = 1,
    steps: int | None = None,
    assembly: Path | None = None,
    approver: str = DEMO_APPROVER,
    wait_seconds: float = 2.0,
    timeout_seconds: float = 900.0,
    fault: str | None = None,
    verbose: bool = False,
    decide_with_tp: bool = False,
    input_dir: Path = REPO / "examples",
    retrain: dict[str, Any] | None = None,
) -> Outcome:
    """Synthesize (unless given an assembly), run the input to its end locally, and write the run report.

    `input_dir` is the input file's folder, which a local `code.source` folder is relative to. `reject` names the
    gate to reject (one of GATES), or "any" for every gate; None approves them.
    `decide_with_tp`: leave each gate to `tp approve|reject` from another terminal, through the decision
    URL served on loopback (localrun/aws/decision_url.py), and print how. `hang`: stop a training worker of the
    first job after the run's first checkpoint (localrun/backends/sagemaker.py). `retrain`: the retrain trigger
    whose input this is, played as its new data's S3 events (localrun/demo/new_data.py) rather than started.
    """
    if reject not in (None, "any", *GATES):
        raise ValueError(f"reject={reject!r}: use one of any, {', '.join(GATES)}")
    out.mkdir(parents=True, exist_ok=True)
    detail = _say if verbose else _quiet
    assembly = assembly or synthesize(out, detail, settings={"retrain": [retrain]} if retrain else None)
    # Each execution its own folder: runs of one input do not overwrite each other's reports.
    name = f"{execution_input.get('run_name', 'run')}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    (run_dir := out / name).mkdir(parents=True, exist_ok=True)
    printer = _Printer(verbose=verbose)
    training, players = _players(
        run_dir, printer, max_hosts=max_hosts, procs_per_host=procs_per_host, spot_interrupt=spot_interrupt, hang=hang
    )
    clock = Clock(wait_scale=wait_seconds / 300, retry_scale=0.01)  # the definition's polls last `wait_seconds`
    handler_log = (run_dir / "handlers.log").open("w")
    with (
        handler_log,
        _engine_quiet(not verbose),
        LocalPlatform(assembly, training=training, clock=clock, handler_log=handler_log, players=players) as platform,
    ):
        execution_input, corpus, image = _made_ready(
            platform, training, players, execution_input, input_dir, run_dir=run_dir, steps=steps, hang=hang, say=detail
        )
        stand_ins = local_stand_ins(execution_input, training.local_hyperparameters, max_hosts=max_hosts, corpus=corpus)
        stand_ins += image
        if fault is not None:
            faults.inject(platform, training, fault)
        arn = _start(platform, execution_input, name, retrain)
        try:
            with DecisionUrl(platform) if decide_with_tp else contextlib.nullcontext() as elsewhere:
                described, decisions = _follow(
                    platform,
                    arn,
                    printer,
                    approver=approver,
                    auto_approve=auto_approve,
                    reject=reject,
                    timeout_seconds=timeout_seconds,
                    verbose=verbose,
                    elsewhere=elsewhere,
                )
        finally:
            training.stop_all()
            for player in players.values():
                player.close()
        facts = report.collect(platform, training, arn, described, decisions, stand_ins=stand_ins)
        if fault is not None:
            _say(f"\n{fault}: {faults.ridden(platform, arn, fault, facts.jobs)}")
    return _write_report(facts, arn, described, run_dir, verbose=verbose, reject=reject)


def _start(platform: LocalPlatform, execution_input: dict[str, Any], name: str, retrain: dict[str, Any] | None) -> str:
    """Start the run as `name`, or play its retrain trigger's new data, whose sweep starts it: its execution ARN."""
    if retrain is not None:
        arn = new_data.play(platform, retrain, _say)
        _say("")
        return arn
    # The demo's settings subscribe DEMO_RECIPIENT (_context); the examples name no one, as the
    # shipped settings subscribe no one, so the demo's run asks for its notifications itself.
    arn = platform.start({"notify": [DEMO_RECIPIENT], **execution_input}, name=name)
    _say(f"started execution {name}\n")
    return arn


def _players(
    run_dir: Path,
    printer: _Printer,
    *,
    max_hosts: int,
    procs_per_host: int,
    spot_interrupt: bool = False,
    hang: bool = False,
    scale: Callable[[dict[str, str]], dict[str, str]] | None = None,
) -> tuple[LocalTraining, dict[str, LocalPlayer]]:
    """SageMaker's training jobs played on this machine, and the other backends' jobs (e.g. `"backend": "batch"`:
    AWS Batch multi-node jobs), their nodes on this machine too; `scale` sizes each job's hyperparameters for it."""
    training = LocalTraining(
        root=run_dir / "jobs",
        datasets_bucket="",
        max_hosts=max_hosts,
        procs_per_host=procs_per_host,
        spot_interrupt_after_checkpoint=spot_interrupt,
        hang_after_checkpoint=hang,
        on_line=printer.training_line,
        scale=scale,
    )
    players = {
        name: make(run_dir / name, max_hosts=max_hosts, spot_interrupt=spot_interrupt, on_line=printer.training_line)
        for name, make in player_factories().items()
    }
    return training, players


def _made_ready(
    platform: LocalPlatform,
    training: LocalTraining,
    players: dict[str, LocalPlayer],
    execution_input: dict[str, Any],
    input_dir: Path,
    *,
    run_dir: Path,
    steps: int | None,
    hang: bool,
    say: Callable[[str], None],
) -> tuple[dict[str, Any], str, list[report.StandIn]]:
    """The run's data seeded and its local scale set: the input as it starts (its own code uploaded, named by its
    digest), what its data is, and the image's stand-in (this machine's interpreter) for a run's own code."""
    training.datasets_bucket = platform.environment("Validate")["DATASETS_BUCKET"]
    folder = own_code.local_folder(execution_input, input_dir)
    image: list[report.StandIn] = []
    if folder is None:
        corpus = _seed_datasets(platform, execution_input, run_dir.parent / "corpus", say)
        training.local_hyperparameters = _local_hyperparameters(execution_input, steps, say)
    else:  # its own code: its arguments size it for this machine, its own data maker makes its data
        image.append(own_code.run_here(platform))
        artifacts = platform.environment("Validate")["ARTIFACTS_BUCKET"]
        execution_input = own_code.upload(
            execution_input, folder, run_dir / "code", artifacts_bucket=artifacts, say=_say
        )
        corpus = own_code.seed(execution_input, folder, run_dir, datasets_bucket=training.datasets_bucket, say=_say)
    if hang:
        # The 10-minute floor fits a GPU cluster's first step; this machine's steps take milliseconds.
        training.local_hyperparameters = {**training.local_hyperparameters, "hang.floor_minutes": "0.1"}
        say("hang: the hang check's floor is 6 s here (hang.floor_minutes=0.1)")
    for player in players.values():
        player.datasets_bucket = training.datasets_bucket
        player.local_hyperparameters = training.local_hyperparameters
    return execution_input, corpus, image


def _local_hyperparameters(
    execution_input: dict[str, Any], steps: int | None, say: Callable[[str], None], *, cap_steps: bool = True
) -> dict[str, str]:
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
    scaled = local_scale(requested, steps, cap_steps=cap_steps)
    # A tuning job's trials run the values it samples, never a local override of them.
    tuned = set((execution_input.get("tuning") or {}).get("ranges", {}))
    scaled = {k: v for k, v in scaled.items() if k not in tuned}
    if scaled:
        say(
            "local scale (the request, the job and the lineage keep the input's values): "
            + ", ".join(f"{k}={v}" for k, v in sorted(scaled.items()))
        )
    else:
        say("the training job runs the input's hyperparameters as given")
    return scaled


def local_stand_ins(
    execution_input: dict[str, Any], scaled: dict[str, str], *, max_hosts: int, corpus: str
) -> list[report.StandIn]:
    """What this machine runs in place of the request, old -> new: instances, data, hyperparameters."""
    out: list[report.StandIn] = []
    groups = execution_input.get("instance_groups") or [
        {"name": "", "instance_type": execution_input.get("instance_type"), "instance_count": 1}
        | ({"instance_count": execution_input["instance_count"]} if "instance_count" in execution_input else {})
    ]
    for group in groups:
        label = f" (group {group['name']})" if group.get("name") else ""
        count = int(group.get("instance_count", 1))
        out.append(
            report.StandIn(
                f"instances{label}", f"{count} x {group['instance_type']}", _local_hosts(min(count, max_hosts))
            )
        )
    for key in ("dataset", "validation_dataset"):
        if isinstance(execution_input.get(key), str):
            out.append(report.StandIn(key.replace("_", " "), execution_input[key], corpus))
    original = {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in execution_input.get("hyperparameters", {}).items()
    }
    original |= {
        "model": str(execution_input.get("model") or original.get("model", "tiny")),
        "distribution": str(execution_input.get("distribution", "ddp")),
    }
    for key, value in sorted(scaled.items()):
        if original.get(key) != value:  # an override that repeats the input's value changes nothing
            out.append(report.StandIn(f"hyperparameter {key}", original.get(key, "(trainer default)"), value))
    return out


def _follow(
    platform: LocalPlatform,
    arn: str,
    printer: _Printer,
    *,
    approver: str,
    auto_approve: bool,
    reject: str | None,
    timeout_seconds: float,
    verbose: bool,
    elsewhere: DecisionUrl | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Print states as they are entered and answer gates until the execution ends: (described, decisions)."""
    decisions: list[dict[str, Any]] = []
    started = time.monotonic()
    session = platform.person(approver, "demo")  # signed in once, not at every look
    while True:
        described: dict[str, Any] = platform.sfn.describe_execution(executionArn=arn)
        printer.states(platform, arn, started)
        decisions.extend(
            _answer_gates(
                platform,
                [arn],
                session=session,
                look=awaits_a_decision(platform.history(arn)),
                approver=approver,
                auto_approve=auto_approve,
                reject=reject,
                verbose=verbose,
                before=lambda: printer.states(platform, arn, started),  # the gate's state first, then the gate
                elsewhere=elsewhere,
            )
        )
        if described["status"] != "RUNNING":
            break
        if time.monotonic() - started > timeout_seconds:
            platform.sfn.stop_execution(executionArn=arn, error="DemoTimeout", cause="local time limit")
            name = arn.rsplit(":", 1)[-1]
            raise TimeoutError(f"execution {name} still running after {timeout_seconds:.0f} s")
        time.sleep(0.3)
    printer.states(platform, arn, started)
    return described, decisions


def _local_hosts(count: int) -> str:
    return f"{count} CPU process{'es' if count != 1 else ''} on this machine (gloo over loopback)"


def _prefix(uri: object, bucket: str) -> str | None:
    """The datasets bucket's prefix a dataset location names (None: Validate will reject it)."""
    if not isinstance(uri, str):
        return None
    if uri.startswith("fsx:///datasets/"):
        return uri.removeprefix("fsx:///datasets/").strip("/") + "/"
    if uri.startswith(f"s3://{bucket}/"):
        return split_s3_uri(uri)[1].strip("/") + "/"
    return None


def _seed_datasets(platform: Any, execution_input: dict[str, Any], workdir: Path, say: Callable[[str], None]) -> str:
    """Put the generated corpus where the input's datasets point (as if engineers had uploaded it); say what it is.
    A fine-tuning input (init_from) gets a generated model folder there and chat records as its dataset."""
    bucket = platform.environment("Validate")["DATASETS_BUCKET"]
    s3 = boto3.client("s3", region_name=REGION)
    if (model_prefix := _prefix(execution_input.get("init_from"), bucket)) is not None:
        folder, files = build_fine_tuning(workdir)
        for path in sorted(folder.iterdir()):
            s3.upload_file(str(path), bucket, model_prefix + path.name)
        say(f"seeded s3://{bucket}/{model_prefix} with a random small Llama model folder (transformers' layout)")
        described = f"generated chat records ({sum(len(f.read_text().splitlines()) for f in files)} conversations)"
    else:
        files = build_shards(workdir)
        tokens = sum((s.stat().st_size - 1024) // 2 for s in files)
        described = f"the generated demo corpus ({len(files)} shards, {tokens:,} tokens)"
    for key in ("dataset", "validation_dataset"):
        if (prefix := _prefix(execution_input.get(key), bucket)) is None:
            continue
        for path in files:
            s3.upload_file(str(path), bucket, prefix + path.name)
        say(f"seeded s3://{bucket}/{prefix} with {described}")
    return described


def _answer_gates(
    platform: Any,
    executions: Collection[str],
    *,
    session: Any,
    look: bool = True,
    approver: str,
    auto_approve: bool,
    reject: str | None,
    verbose: bool,
    before: Callable[[], None],
    elsewhere: DecisionUrl | None = None,
) -> list[dict[str, Any]]:
    """Decide open requests of these executions as `approver` (signed in as `session`), as `tp approve|reject` does,
    through the real handler; or, with `elsewhere`, say once per request how to decide it with tp, and return what
    was decided. `look=False`: none of them awaits a decision (`awaits_a_decision`), so no request is looked for."""
    answered = elsewhere.take_decisions() if elsewhere is not None else []
    for result in answered:
        _say(f"    -> {result.get('decision')} by {result.get('by')} (tp, from another terminal)")
    pending = json.loads(platform.call_decision_url(session, "GET")["body"])["pending"] if look else []
    for request in pending:
        if request["execution"] not in executions:
            continue
        if elsewhere is not None:
            if request["request_id"] not in elsewhere.announced:
                before()
                elsewhere.announced.add(request["request_id"])
                _say(f"  approval needed: {request['gate']} gate of {request['run_name']}")
                _say(_tp_instructions(elsewhere.url, session, request["request_id"]))
            continue
        before()
        summary = json.loads(request["summary"])
        gate = request["gate"]
        prompt = reject not in ("any", gate) and not auto_approve and sys.stdin.isatty()
        _say(f"  approval needed: {gate} gate of {request['run_name']} (request {request['request_id']})")
        if verbose or prompt:
            for key, value in sorted(summary.items()):
                _say(f"    {key}: {value}")
        if reject in ("any", gate):
            decision = "reject"
            reason = f"rejected in the demo (--reject{'' if reject == 'any' else ' ' + gate})"
        elif not prompt:
            decision, reason = "approve", "approved in the demo (--auto-approve)"
        else:
            answer = input("    approve? [y/N] ").strip().lower()
            decision = "approve" if answer in ("y", "yes") else "reject"
            reason = input("    reason: ").strip() or f"{decided(decision)} at the demo prompt"
        body = {"request_id": request["request_id"], "decision": decision, "reason": reason}
        response = platform.call_decision_url(session, "POST", body)
        result = json.loads(response["body"])
        _say(f"    -> {result.get('decision', result.get('error'))} by {result.get('by', approver)}")
        answered.append(result)
    return answered


def _tp_instructions(url: str, session: Any, request_id: str) -> str:
    """How to decide a request from another terminal: the demo approver's local credentials and tp."""
    keys = session.get_credentials().get_frozen_credentials()
    return (
        "    decide it from another terminal, as the demo's approver:\n"
        f"      export TP_DECISION_URL={url} AWS_REGION={REGION} AWS_ACCESS_KEY_ID={keys.access_key} "
        f"AWS_SECRET_ACCESS_KEY={keys.secret_key} AWS_SESSION_TOKEN={keys.token}\n"
        "      .venv/bin/tp pending\n"
        f'      .venv/bin/tp approve {request_id} --reason "..."   (or tp reject)'
    )


_TASK_ENDS = ("TaskSucceeded", "TaskFailed", "TaskTimedOut", "TaskStartFailed", "TaskSubmitFailed")


def awaits_a_decision(history: list[dict[str, Any]]) -> bool:
    """Whether a task of the execution waits for its task token, as a gate waits for its decision: only then may it have
    a request for an approver, so only then does the demo look at the decision URL (a look is a signed call of the real
    handler, some 70 ms of CPU)."""
    waiting = 0
    for event in history:
        details: dict[str, Any] = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
        if str(details.get("resource", "")).endswith(".waitForTaskToken"):
            if event["type"] == "TaskScheduled":
                waiting += 1
            elif event["type"] in _TASK_ENDS:
                waiting -= 1
    return waiting > 0


@dataclass(frozen=True)
class Retry:
    """A new attempt of the training step, as the state that tells the run why (RETRY_TOLD) enters with it."""

    attempt: int
    failure: Failure
    """Why the last job was replaced."""
    cluster: str
    """The cluster the attempt runs on: the request's `cluster`, as the run's notification names it (next_cluster)."""
    alternative: int
    """Which of the request's clusters that is: 0 its own, i its fallback[i - 1]."""

    def line(self, last_alternative: int) -> str:
        """What the terminal says of it, after an attempt on the request's cluster `last_alternative`."""
        moved = self.alternative != last_alternative
        where = f"the fallback cluster {self.cluster}" if moved else "fresh instances"
        why = self.failure.cause or self.failure.error
        return f"retrying: attempt {self.attempt}, a new job on {where}, after {why}"


def retried(event: dict[str, Any]) -> Retry | None:
    """The training step's new attempt, from the state that tells the run why it retries (polled_job.py RETRY_TOLD),
    entered once the attempt's cluster is settled; None for any other event."""
    details = event.get("stateEnteredEventDetails")
    if not details or not details["name"].startswith(RETRY_TOLD):
        return None
    state = json.loads(details["input"])
    train, request = state[str(TRAIN).removeprefix("$.")], state[str(REQUEST).removeprefix("$.")]
    return Retry(
        attempt=int(train["attempt"]),
        failure=Failure.model_validate(train["retried_after"]),
        cluster=request["cluster"],
        alternative=int(request["alternative"]),
    )


class _Printer:
    """States as they are entered; training steps with loss and throughput.

    Quiet (the default), a loop's states are shown once, a job's loss every PROGRESS_STEPS steps, and of the
    local jobs' own lines only interruptions and resumes; verbose shows every state, step and job line.
    """

    def __init__(self, *, verbose: bool) -> None:
        self.verbose = verbose
        self.seen = 0
        self.recent: list[str] = []
        self.shown_steps: dict[str, int] = {}
        self.jobs: dict[str, None] = {}
        self.alternative = 0
        """Which of the request's clusters the training step's latest attempt runs on (Retry.alternative)."""
        self.lock = threading.Lock()

    def states(self, platform: Any, arn: str, started: float) -> None:
        """The states entered since the last look, and why the training step started a new attempt, once each."""
        events = platform.history(arn)
        with self.lock:
            for event in events[self.seen :]:
                if event["type"].endswith("StateEntered"):
                    name = event["stateEnteredEventDetails"]["name"]
                    if self.verbose or name not in self.recent:
                        _say(f"[{time.monotonic() - started:6.1f}s] > {name}")
                    self.recent = [*self.recent, name][-LOOP_STATES:]
                if (retry := retried(event)) is not None:
                    _say(f"          {retry.line(self.alternative)}")
                    self.alternative = retry.alternative
            self.seen = len(events)

    def training_line(self, job: str, line: str) -> None:
        step, values = parse_line(line) or (0, {})
        with self.lock:
            if self.verbose:
                self._verbose_line(job, line, step, values)
                return
            self.jobs.setdefault(job, None)
            label = f"[{job}] " if len(self.jobs) > 1 else ""  # named once a second job (a trial) speaks
            if TRAIN_LOSS in values:
                if step < self.shown_steps.get(job, -PROGRESS_STEPS) + PROGRESS_STEPS:
                    return
                self.shown_steps[job] = step
                rate = f"  {values[TOKENS_PER_SEC]:>7,.0f} tokens/s" if TOKENS_PER_SEC in values else ""
                _say(f"          {label}step {step:>5}  loss {values[TRAIN_LOSS]:.3f}{rate}")
            elif VALIDATION_LOSS in values:
                _say(f"          {label}step {step:>5}  validation loss {values[VALIDATION_LOSS]:.3f}")
            elif "resumed from checkpoint" in line:
                self.shown_steps.pop(job, None)  # the resumed run's first step is shown
                _say(f"          {label}{line[line.index('resumed from checkpoint') :].split(' (', 1)[0]}")
            elif "spot interruption" in line or "host is lost" in line:
                _say(f"          {label}{line.strip(' -')}")

    @staticmethod
    def _verbose_line(job: str, line: str, step: int, values: dict[str, float]) -> None:
        if TRAIN_LOSS in values:
            rate = f" tokens/s={values[TOKENS_PER_SEC]:,.0f}" if TOKENS_PER_SEC in values else ""
            _say(f"          [{job}] step {step:>4} loss {values[TRAIN_LOSS]:.4f}{rate}")
        elif VALIDATION_LOSS in values:
            _say(f"          [{job}] step {step:>4} validation loss {values[VALIDATION_LOSS]:.4f}")
        elif line.startswith("--") or "resumed from checkpoint" in line or "Error" in line:
            _say(f"          [{job}] {line.strip()}")


def _write_report(
    facts: report.RunFacts,
    arn: str,
    described: dict[str, Any],
    run_dir: Path,
    *,
    verbose: bool,
    reject: str | None,
) -> Outcome:
    """Save the run's files and report.md, print a summary (with --verbose, the report), and return the outcome."""
    report.save(facts, run_dir)
    text = report.render(facts, run_dir)
    path = run_dir / "report.md"
    path.write_text(text + "\n")
    if verbose:
        _say("")
        _say(text)
    _say("")
    for line in summary(facts, path, reject=reject):
        _say(line)
    return Outcome(
        execution_arn=arn,
        described=described,
        states=facts.states,
        job_names=[job.name for job in facts.jobs],
        report=path,
        decisions=facts.decisions,
    )


def summary(facts: report.RunFacts, path: Path, *, reject: str | None) -> list[str]:
    """The run in a few lines: outcome, report, model package, cost estimate, actual cost, best trial, goodput,
    stand-ins."""
    outcome = facts.status if facts.status == "SUCCEEDED" else f"{facts.status}: {facts.error}: {facts.cause}"
    lines = [f"outcome:       {outcome}", f"report:        {path}"]
    packages = [f"{r.package_arn} ({report.status_words(r.approval_status)})" for r in facts.registrations]
    lines.append(f"model package: {', '.join(packages) or 'none registered'}")
    estimate = facts.estimate
    if estimate:
        spot = (
            f", spot ${estimate['spot_usd'][0]:,.2f}-{estimate['spot_usd'][1]:,.2f}" if estimate.get("spot_usd") else ""
        )
        gate = "launch approval needed" if estimate["approval_required"] else "no launch approval needed"
        lines.append(
            f"cost estimate: at most ${estimate['max_cost_usd']:,.2f} on demand{spot} "
            f"(threshold ${estimate['threshold_usd']:,.2f}: {gate})"
        )
        if reject == "launch" and not estimate["approval_required"]:
            lines.append("--reject launch: this input's estimate does not reach the launch gate")
    if facts.charges:
        billed = sum(charge.billed_seconds or 0 for charge in facts.charges)
        count = sum(charge.jobs for charge in facts.charges)
        jobs = f"{count} job{'s' if count != 1 else ''}"
        lines.append(
            f"actual cost:   {report.usd(facts.actual_usd)} at list price ({jobs}, {billed} s of billed cluster time)"
        )
    lines += [f"best trial:    {best}, of {len(facts.trials)} trials" for best in report.best_trials(facts.trials)]
    if clusters := report.clusters(facts.jobs):
        lines.append(f"clusters:      {clusters}")
    if facts.goodput is not None:
        lines.append(f"goodput:       {facts.goodput.summary()}")
    if facts.stand_ins:
        lines.append(f"local stand-ins: {len(facts.stand_ins)}, listed in the report")
    return lines


def serve(
    *,
    out: Path,
    verbose: bool = False,
    assembly: Path | None = None,
    max_hosts: int = 2,
    procs_per_host: int = 1,
    wait_seconds: float = 2.0,
    stop: threading.Event | None = None,
) -> None:
    """`make demo ARGS=--serve`: the local platform kept up and served on loopback (localrun/aws/served.py) for `tp` in
    another terminal, which starts, watches, stops and decides its runs; each run's states and training are shown
    here as it goes. Ends on Ctrl-C (or when `stop` is set)."""
    out.mkdir(parents=True, exist_ok=True)
    detail = _say if verbose else _quiet
    context = _context(out)
    assembly = assembly or synthesize(out, detail)
    folder = out / "local"
    folder.mkdir(parents=True, exist_ok=True)
    cdk_json = folder / "cdk.json"
    cdk_json.write_text(json.dumps({"context": context}, indent=2))
    printer = _Printer(verbose=verbose)
    training, players = _players(
        folder,
        printer,
        max_hosts=max_hosts,
        procs_per_host=procs_per_host,
        scale=lambda requested: local_scale(requested, None),
    )
    clock = Clock(wait_scale=wait_seconds / 300, retry_scale=0.01)
    stage = settings_from_context(context, os.environ.get(OVERRIDES_VARIABLE)).stage
    with (
        (folder / "handlers.log").open("w") as handler_log,
        _engine_quiet(not verbose),
        LocalPlatform(assembly, training=training, clock=clock, handler_log=handler_log, players=players) as platform,
        ServedPlatform(platform, folder, stage=stage, approver=DEMO_APPROVER, cdk_json=cdk_json) as served,
    ):
        training.datasets_bucket = platform.environment("Validate")["DATASETS_BUCKET"]
        for example in sorted((REPO / "examples").glob("*.json")):
            document = json.loads(example.read_text())
            if not is_scenario(document):  # every example's datasets, as if engineers had uploaded them
                _seed_datasets(platform, document, out / "corpus", detail)
        for player in players.values():
            player.datasets_bucket = training.datasets_bucket
            player.local_hyperparameters = local_scale({"model": "gpt2", "max_steps": "100000"}, None)
        _say(_serve_instructions(served))
        try:
            _follow_all(platform, stop or threading.Event())
        except KeyboardInterrupt:
            _say("\nstopping the local platform")
        finally:
            training.stop_all()
            for player in players.values():
                player.close()


def _serve_instructions(served: ServedPlatform) -> str:
    here = Path.cwd()
    env = served.env_file.relative_to(here) if served.env_file.is_relative_to(here) else served.env_file
    return "\n".join(
        [
            f"the local platform is up: AWS endpoint {served.endpoint}, decision URL {served.decision_url.url}",
            "in another terminal, from this folder (tp is then the platform's ML engineer):",
            f"  source {env}",
            "  .venv/bin/tp check",
            "  .venv/bin/tp start examples/demo.json --name my-first-run",
            "  .venv/bin/tp watch my-first-run     (tp list, tp logs my-first-run --follow, tp show my-first-run)",
            "  AWS_PROFILE=local-approver .venv/bin/tp pending    (then tp approve <request> --reason '...')",
            "each run is shown here as it goes; Ctrl-C stops the platform and every run on it",
            "",
        ]
    )


def _follow_all(platform: LocalPlatform, stop: threading.Event) -> None:
    """Print each run's states as it enters them, whoever started it, until `stop` is set."""
    printers: dict[str, tuple[_Printer, float]] = {}
    while not stop.is_set():
        listed = platform.sfn.list_executions(stateMachineArn=platform.state_machine_arn)["executions"]
        for execution in sorted(listed, key=lambda e: e["startDate"]):
            arn = execution["executionArn"]
            if arn not in printers:
                printers[arn] = (_Printer(verbose=False), time.monotonic())
                _say(f"run {execution['name']} started")
            printer, started = printers[arn]
            printer.states(platform, arn, started)
        stop.wait(0.5)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=REPO / "examples" / "demo.json", help="execution input JSON")
    parser.add_argument("--out", type=Path, default=REPO / "demo-out", help="where the run's files go")
    parser.add_argument("--auto-approve", action="store_true", help="approve every gate without asking")
    parser.add_argument(
        "--reject",
        nargs="?",
        const="any",
        choices=("any", *GATES),
        help="reject a gate: every gate the run reaches (no value), or only the launch or promotion gate",
    )
    parser.add_argument(
        "--decide-with-tp",
        action="store_true",
        help="leave each gate to `tp approve|reject` from another terminal (the demo prints how)",
    )
    parser.add_argument("--verbose", action="store_true", help="the harness's own lines and the whole report too")
    parser.add_argument("--spot-interrupt", action="store_true", help="interrupt the job after its first checkpoint")
    parser.add_argument(
        "--hang", action="store_true", help="stop a training worker after the first checkpoint (the hang check's retry)"
    )
    parser.add_argument("--hosts", type=int, default=2, help="local hosts (processes started like instances)")
    parser.add_argument("--procs-per-host", type=int, default=1, help="training processes per host")
    parser.add_argument("--steps", type=int, help="override the local run's max_steps")
    parser.add_argument(
        "--fault",
        choices=faults.FAULTS,
        help="monitor-throttle, monitor-timeout: transient faults at the progress handler; insufficient-capacity: "
        "the run's first cluster has no instances (SageMaker's CapacityError), so it falls back to its next",
    )
    parser.add_argument(
        "--new-data",
        action=argparse.BooleanOptionalAction,
        help="play a retrain example as its trigger's S3 event: the demo writes the new data, the deployed rule's "
        "RetrainRecord and RetrainSweep start the run (the default for examples/retrain-on-new-data.json); "
        "--no-new-data starts it as an ordinary run",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep the local platform up for `tp` in another terminal (it prints what to source); no run of its own",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for var, value in {
        "AWS_ACCESS_KEY_ID": "demo",
        "AWS_SECRET_ACCESS_KEY": "demo",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        os.environ[var] = value
    os.environ.pop("AWS_PROFILE", None)
    started = time.monotonic()
    if args.serve:
        if one_run := [*_one_run_options(args), *(["--auto-approve"] if args.auto_approve else [])]:
            parser.error(f"--serve starts no run of its own: {', '.join(one_run)} apply to `make demo` with an input")
        serve(out=args.out, verbose=args.verbose, max_hosts=args.hosts, procs_per_host=args.procs_per_host)
        # Ctrl-C, which ends it, reached jsii's Node.js process too (one process group): jsii's exit hook would
        # then fail on its closed pipe with a traceback. Everything of ours is closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    document = json.loads(args.input.read_text())
    if scenario.is_scenario(document):  # e.g. examples/teams.json: several runs of several teams
        return _main_scenario(args, scenario.parse(document), started)
    try:
        retrain = new_data.chosen(args.input, args.new_data)
    except new_data.NewDataError as exc:
        parser.error(str(exc))
    outcome = run_demo(
        execution_input=document,
        out=args.out,
        auto_approve=args.auto_approve,
        reject=args.reject,
        spot_interrupt=args.spot_interrupt,
        hang=args.hang,
        max_hosts=args.hosts,
        procs_per_host=args.procs_per_host,
        steps=args.steps,
        fault=args.fault,
        verbose=args.verbose,
        decide_with_tp=args.decide_with_tp,
        input_dir=args.input.resolve().parent,
        retrain=retrain,
    )
    _say(f"demo finished in {time.monotonic() - started:.0f} s")
    expected = "FAILED" if args.reject else "SUCCEEDED"
    return 0 if outcome.described["status"] == expected else 1


def _one_run_options(args: argparse.Namespace) -> list[str]:
    """The options given that apply to one run started by the demo (not to a scenario's runs, nor to --serve)."""
    given = {
        "--reject": args.reject,
        "--decide-with-tp": args.decide_with_tp,
        "--spot-interrupt": args.spot_interrupt,
        "--hang": args.hang,
        "--fault": args.fault,
        "--steps": args.steps,
        "--new-data" if args.new_data else "--no-new-data": args.new_data is not None,
    }
    return [option for option, value in given.items() if value]


def _main_scenario(args: argparse.Namespace, parsed: scenario.Scenario, started: float) -> int:
    """A scenario runs every gate approved; the options of one run's faults do not apply to it."""
    if unsupported := _one_run_options(args):
        raise scenario.ScenarioError(f"{args.input} is a scenario: {', '.join(unsupported)} apply to one run only")
    outcome = run_scenario(parsed, out=args.out, verbose=args.verbose)
    _say(f"demo finished in {time.monotonic() - started:.0f} s")
    return 0 if outcome.as_expected else 1


# -- teams scenarios (make demo INPUT=examples/teams.json; localrun/demo/scenario.py) ---------------------------------
@dataclass
class ScenarioOutcome:
    runs: list[report.TeamRun]
    report: Path

    @property
    def as_expected(self) -> bool:
        """Every run ended as its step expects, and every twin's losses matched."""
        return all(r.as_expected and r.twin_matches is not False for r in self.runs)


class _Driver:
    """The scenario's runs on one platform: starts them, follows them, answers their gates."""

    def __init__(self, platform: LocalPlatform, training: LocalTraining, *, approver: str, verbose: bool) -> None:
        self.platform, self.training, self.approver, self.verbose = platform, training, approver, verbose
        self.session = platform.person(approver, "demo")
        """The approver, signed in once, not at every look."""
        self.arns: dict[str, str] = {}
        self.runs: dict[str, Run] = {}
        self.finished: set[str] = set()
        """Runs whose execution had ended before the driver last read their history: nothing more to follow."""
        self.seen: dict[str, int] = {}
        self.recent: dict[str, list[str]] = {}
        self.queue_states: dict[str, tuple[str, str] | None] = {}
        """Run -> its service job's status and reason as last shown (a waiting job's reason is shown as it changes)."""
        self.told_queued: set[str] = set()
        """Runs whose wait for capacity the terminal has told."""
        self.steps: dict[str, int] = {}
        """Training job name -> the last step its log reported."""
        self.started = time.monotonic()
        self.printer = _Printer(verbose=verbose)

    # -- what the terminal shows ------------------------------------------------------------------
    def training_line(self, job: str, line: str) -> None:
        step, values = parse_line(line) or (0, {})
        if values:
            self.steps[job] = max(self.steps.get(job, 0), step)
        self.printer.training_line(self.label(job), line)

    def label(self, training_job: str) -> str:
        """A training job as the terminal names it: its run and attempt."""
        jobs = self.platform.queue.jobs.values() if self.platform.queue else []
        for job in list(jobs):
            for number, attempt in enumerate(job.attempts, start=1):
                if attempt.training_job == training_job:
                    return f"{self.run_of(job) or job.name} attempt {number}"
        return training_job

    def queue_line(self, line: str) -> None:
        _say(f"[{time.monotonic() - self.started:6.1f}s] queue: {line}")

    def follow(self) -> None:
        """Bring the queue up to date (Batch schedules on its own, not when asked), print new states, answer gates."""
        assert self.platform.queue is not None
        self.platform.queue.advance()
        running = []
        for run_id, arn in self.arns.items():
            if run_id in self.finished:
                continue
            # Whether it had ended before its history is read: that read then holds its every state.
            if self.ended(run_id):
                self.finished.add(run_id)
            else:
                running.append(arn)
            entered = self.platform.states_entered(arn)
            for name in entered[self.seen.get(run_id, 0) :]:
                recent = self.recent.setdefault(run_id, [])
                if self.verbose or name not in recent:
                    _say(f"[{time.monotonic() - self.started:6.1f}s] {run_id} > {name}")
                self.recent[run_id] = [*recent, name][-LOOP_STATES:]
            self.seen[run_id] = len(entered)
            job = self.service_job(run_id)
            said = (job.status, job.status_reason) if job is not None else None
            if job is not None and said != self.queue_states.get(run_id) and job.status == "RUNNABLE":
                _say(f"[{time.monotonic() - self.started:6.1f}s] {run_id} queued: {job.status_reason}")
                self.told_queued.add(run_id)
            elif job is not None and job.waited and run_id not in self.told_queued:
                # The scheduler may hold a job and start it between two looks (it also runs when the
                # platform's handlers call Batch): say once that it waited, and why.
                _say(f"[{time.monotonic() - self.started:6.1f}s] {run_id} queued: {job.held_for}")
                self.told_queued.add(run_id)
            self.queue_states[run_id] = said
        running = [arn for arn in running if awaits_a_decision(self.platform.history(arn))]
        if (
            running
        ):  # one look at the pending requests for every run at a gate (each look is a call of the decision URL)
            _answer_gates(
                self.platform,
                running,
                session=self.session,
                approver=self.approver,
                auto_approve=True,
                reject=None,
                verbose=self.verbose,
                before=lambda: None,
            )

    # -- the steps ----------------------------------------------------------------------------------
    def service_job(self, run_id: str) -> ServiceJob | None:
        """The run's service job (the latest it submitted), by its execution tag."""
        assert self.platform.queue is not None
        arn = self.arns[run_id]
        mine = [
            # A copy: the scheduler adds jobs on the handlers' threads.
            j
            for j in list(self.platform.queue.jobs.values())
            if j.request.get("tags", {}).get(EXECUTION_TAG) == arn
        ]
        return mine[-1] if mine else None

    def run_of(self, job: ServiceJob) -> str | None:
        arn = job.request.get("tags", {}).get(EXECUTION_TAG)
        return next((run_id for run_id, a in self.arns.items() if a == arn), None)

    def ended(self, run_id: str) -> bool:
        return str(self.platform.sfn.describe_execution(executionArn=self.arns[run_id])["status"]) != "RUNNING"

    def holds(self, after: After, since: float) -> bool:
        if after.condition is None:
            return time.monotonic() - since >= after.seconds
        assert after.run is not None
        if after.condition == "ended":
            return self.ended(after.run)
        job = self.service_job(after.run)
        if job is None:
            return False
        if after.condition == "started":
            return job.status == "RUNNING"
        if after.condition == "queued":  # held for capacity, even if it has started since the last look
            return job.status == "RUNNABLE" or job.waited
        return bool(job.attempts) and self.steps.get(job.attempts[-1].training_job, 0) >= after.step

    def _until(self, done: Callable[[], bool], deadline: float, waiting: str) -> None:
        """Follow the runs until `done()` holds; TimeoutError after the scenario's deadline."""
        while not done():
            self.follow()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scenario's time limit passed {waiting}")
            time.sleep(0.3)

    def wait_for(self, after: After, deadline: float) -> None:
        since = time.monotonic()

        def done() -> bool:
            if self.holds(after, since):
                return True
            if after.run is not None and after.condition != "ended" and self.ended(after.run):
                ended = self.platform.sfn.describe_execution(executionArn=self.arns[after.run])
                raise ScenarioError(
                    f"{after.run} ended {ended['status']} before the next step's condition held ({after.describe()}): "
                    f"{ended.get('error')}: {ended.get('cause')}"
                )
            return False

        self._until(done, deadline, f"waiting {after.describe()}")

    def start(self, run: Run, deadline: float) -> None:
        """Start the run; a queue run expected to succeed reaches the queue while every training job is held.

        On AWS a request reaches its queue in seconds while jobs train for hours. Here the pipeline's states and
        the jobs share this machine's cores and a job trains for seconds, so under load a job could end before a
        run started while it trained was submitted. Training is held meanwhile (LocalTraining.paused), so the
        queue sees what the scenario's steps say on any machine. A run expected to fail is not waited for: the
        shipped scenario's are refused before or at their submission, which what the queue holds does not decide.
        """
        name = f"{run.id}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        execution_input = {"notify": [DEMO_RECIPIENT], **run.input}
        queued = run.input.get("backend") == "queue" and run.expect == "SUCCEEDED"
        with self.training.paused() if queued else contextlib.nullcontext():
            self.arns[run.id] = self.platform.start(execution_input, name=name, requester=run.principal)
            self.runs[run.id] = run
            who = run.principal.rsplit("/", 1)[-1]
            _say(
                f"[{time.monotonic() - self.started:6.1f}s] {run.id}: started by {who} as team {run.input.get('team')}"
            )
            if queued:
                self._until(
                    lambda: self.service_job(run.id) is not None or self.ended(run.id),
                    deadline,
                    f"while {run.id}'s request went to the queue",
                )
                self.follow()  # the scheduler's pass over the new job (a preemption's SIGTERM arrives on the release)

    def budget_stop(self, team: str) -> None:
        """What AWS Budgets does at 100% of the team's actual spend: attach its deny policy to the action's roles."""
        definition = team_budget_action(self.platform, team)
        iam = boto3.client("iam", region_name="us-east-1")
        for role in definition["Roles"]:
            iam.attach_role_policy(RoleName=role, PolicyArn=definition["PolicyArn"])
        roles = ", ".join(definition["Roles"])
        _say(f"[{time.monotonic() - self.started:6.1f}s] budget stop: team {team}'s budget is spent; deny on {roles}")


def team_budget_action(platform: LocalPlatform, team: str) -> dict[str, Any]:
    """The team's budget action's IAM action definition (stacks/constructs/cost_controls.py TeamBudget), resolved."""
    for stack, logical, action in platform.assembly.resources("AWS::Budgets::BudgetsAction"):
        if f"/{TEAM_BUDGET}-{team}/" in platform.assembly.construct_paths[stack].get(logical, ""):
            props = platform.resolver.resolve(stack, action["Properties"])
            definition: dict[str, Any] = props["Definition"]["IamActionDefinition"]
            return definition
    raise ScenarioError(f"the synthesized platform has no budget action for team {team}")


def run_scenario(
    scenario: Scenario,
    *,
    out: Path,
    assembly: Path | None = None,
    approver: str = DEMO_APPROVER,
    wait_seconds: float = 2.0,
    timeout_seconds: float = 900.0,
    verbose: bool = False,
) -> ScenarioOutcome:
    """Synthesize with the scenario's settings (unless given an assembly), carry out its steps, write the report."""
    missing = sorted({str(r.input.get("backend", "sagemaker")) for r in scenario.runs} - set(BACKENDS))
    if missing:
        raise ScenarioError(f"the scenario's runs ask for backends {missing}, which lambdas/backends does not register")
    out.mkdir(parents=True, exist_ok=True)
    detail: Callable[[str], None] = _say if verbose else _quiet
    assembly = assembly or synthesize(out, detail, settings=scenario.settings)
    run_dir = out / f"teams-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    training = LocalTraining(root=run_dir / "jobs", datasets_bucket="", max_hosts=1)
    clock = Clock(wait_scale=wait_seconds / 300, retry_scale=0.01)
    handler_log = (run_dir / "handlers.log").open("w")
    deadline = time.monotonic() + timeout_seconds
    with (
        handler_log,
        _engine_quiet(not verbose),
        LocalPlatform(assembly, training=training, clock=clock, handler_log=handler_log) as platform,
    ):
        if platform.queue is None:
            raise ScenarioError("the synthesized platform has no team queue: the settings need teams and capacity")
        driver = _Driver(platform, training, approver=approver, verbose=verbose)
        training.on_line = driver.training_line
        platform.queue.on_line = driver.queue_line
        training.datasets_bucket = platform.environment("Validate")["DATASETS_BUCKET"]
        for run in scenario.runs:
            _seed_datasets(platform, run.input, out / "corpus", detail)
            # The member's role and tags, as the account's SSO would have them.
            platform.person(run.principal, tags=scenario.principal_tags.get(run.principal))
        # Every run is tiny: the jobs run their own steps; only a model too large for this machine is replaced.
        training.local_hyperparameters = _local_hyperparameters(scenario.runs[0].input, None, detail, cap_steps=False)
        try:
            for step in scenario.steps:
                driver.wait_for(step.after, deadline)
                if step.run is not None:
                    driver.start(step.run, deadline)
                elif step.budget_stop is not None:
                    driver.budget_stop(step.budget_stop)
            while not all(driver.ended(run_id) for run_id in driver.arns):
                driver.follow()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"runs still going after {timeout_seconds:.0f} s")
                time.sleep(0.3)
            driver.follow()
        finally:
            training.stop_all()
        runs = [_team_run(driver, run_id) for run_id in driver.arns]
        _compare_twins(runs)
        log = list(platform.queue.log)
        denials = platform.iam.denials()
    text = report.render_teams(runs, log, denials)
    report.save_teams(runs, run_dir)
    path = run_dir / "report.md"
    path.write_text(text + "\n")
    for team_run in runs:
        for job in team_run.jobs:
            (run_dir / f"{job.name}.log").write_text(job.log)
    _say("")
    for line in report.teams_summary(runs):
        _say(line)
    _say(f"report:        {path}")
    return ScenarioOutcome(runs=runs, report=path)


def _team_run(driver: _Driver, run_id: str) -> report.TeamRun:
    platform, run = driver.platform, driver.runs[run_id]
    described = platform.sfn.describe_execution(executionArn=driver.arns[run_id])
    job = driver.service_job(run_id)
    jobs = []
    for attempt in job.attempts if job is not None else []:
        log = driver.training.logs(attempt.training_job) if attempt.training_job in driver.training.jobs else ""
        train, _ = loss_curve(log)
        jobs.append(
            report.TeamAttempt(attempt.training_job, log, dict(train), attempt.status_reason, attempt.preempted)
        )
    return report.TeamRun(
        id=run_id,
        team=str(run.input.get("team")),
        requester=run.principal,
        execution=driver.arns[run_id],
        status=described["status"],
        expected=run.expect,
        error=described.get("error"),
        cause=described.get("cause"),
        queue_wait_seconds=(
            (job.attempts[0].started_at - job.created_at) / 1000 if job is not None and job.attempts else None
        ),
        service_job_status=job.status if job is not None else None,
        jobs=jobs,
        first_started_ms=job.attempts[0].started_at if job is not None and job.attempts else None,
        ended_ms=job.stopped_at if job is not None else None,
        twin_of=run.uninterrupted_twin_of,
        charges=report.charges(platform.history(driver.arns[run_id])),
    )


def _compare_twins(runs: list[report.TeamRun]) -> None:
    """A twin's losses at the steps its preempted run trained after resuming: identical, or the difference said."""
    by_id = {r.id: r for r in runs}
    for twin in runs:
        if twin.twin_of is None:
            continue
        resumed = by_id[twin.twin_of]
        after = resumed.jobs[-1].losses if len(resumed.jobs) > 1 else {}
        reference = {s: v for j in twin.jobs for s, v in j.losses.items()}
        twin.twin_matches = bool(after) and after == {s: reference.get(s) for s in after}
        differing = sorted(s for s in after if reference.get(s) != after[s])
        twin.twin_note = (
            f"{len(after)} steps after the resume (from step {min(after)}) equal to the uninterrupted run's"
            if twin.twin_matches
            else f"{twin.twin_of} has no resumed attempt"
            if not after
            else f"steps {differing[:5]} differ from the uninterrupted run's"
        )

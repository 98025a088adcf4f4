"""`tp`, the training platform's command line: validate, estimate, start and decide runs.

Offline commands (validate, estimate) read the settings in cdk.json; the others reach a deployed stage
through boto3 with whatever credentials it finds (profile, SSO, environment).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import boto3
import typer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contract import goodput, layout
from contract.code_archive import Packed
from contract.config import ConfigError, from_hyperparameters
from contract.execution_state import CostEstimate, EstimateEvent
from contract.metrics import TOKENS_PER_SEC, TRAIN_LOSS
from lambdas.approvals import identity
from lambdas.approvals.store import PAGE_SIZE
from lambdas.estimate.handler import estimate as estimate_cost
from lambdas.shared.errors import InvalidRequest, Problem
from lambdas.validate import start_proof
from lambdas.validate.code import PackedCode
from lambdas.validate.model_folder import LocalFolder
from lambdas.validate.request import resolve
from stacks import outputs as stack_outputs
from stacks.settings import (
    OFFLINE_ARTIFACTS_BUCKET,
    OFFLINE_DATASETS_BUCKET,
    OVERRIDES_VARIABLE,
    PlatformSettings,
    SettingsError,
    settings_from_context,
    stage_prefix,
)
from tools import code_pack
from tools.scenario_files import how_to_play, is_scenario

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
# Soft wrap: an ARN, a cursor or a log line printed for a pipe or a narrow terminal stays whole.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

_URL = re.compile(r"^https://[a-z0-9]+\.lambda-url\.([a-z0-9-]+)\.on\.aws/?$")
# The decision URL the local platform serves on this machine's loopback (localrun/aws/decision_url.py).
_LOOPBACK = re.compile(r"^http://127\.0\.0\.1:\d{1,5}/?$")

Stage = Annotated[str, typer.Option(envvar="TP_STAGE", help="the platform's stage (settings' `stage`)")]
Region = Annotated[str | None, typer.Option(envvar=["TP_REGION", "AWS_REGION"], help="the stage's AWS region")]
StateMachine = Annotated[
    str | None, typer.Option(envvar="TP_STATE_MACHINE", help="the training state machine ARN (else the stack's)")
]
DecisionUrl = Annotated[
    str | None, typer.Option(envvar="TP_DECISION_URL", help="the approvals decision URL (else the stack's)")
]
ArtifactsBucket = Annotated[
    str | None, typer.Option(envvar="TP_ARTIFACTS_BUCKET", help="the artifacts bucket (else the stack's)")
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
Reason = Annotated[str, typer.Option(help="recorded with the decision (at most 512 characters)")]


# -- offline: the settings, Validate and Estimate ----------------------------------------------------


def load_settings(cdk_json: Path) -> PlatformSettings:
    """The platform settings the synth reads: cdk.json's context, with make's CONTEXT= merged over it."""
    context: dict[str, Any] = json.loads(cdk_json.read_text())["context"]
    return settings_from_context(context, os.environ.get(OVERRIDES_VARIABLE))


def offline_check(
    execution_input: Any,
    settings: PlatformSettings,
    *,
    datasets_bucket: str = OFFLINE_DATASETS_BUCKET,
    model_folder: Path | None = None,
    packed_code: PackedCode | None = None,
) -> tuple[dict[str, Any], CostEstimate]:
    """Validate's request and Estimate's answer for the input, or InvalidRequest with every problem. With
    `model_folder`, a local copy of the input's init_from, that folder is judged as Validate judges the stored one
    (and the run's memory per GPU estimated). `packed_code`: the archive of the input's code, as `tp` packed it
    (None: the code is not checked)."""
    limits = settings.offline_limits(datasets_bucket=datasets_bucket)  # the backends the settings deploy
    folder_at = None
    if model_folder is not None:
        # Where the stored folder is, as Validate resolves init_from; the dataset has no local copy and is not read.
        unread = resolve(execution_input, execution_name="tp-validate", limits=limits, check_membership=False)
        stored = (unread.get("base_model") or {}).get("s3_uri")

        def folder_at(uri: str) -> LocalFolder:
            return LocalFolder(model_folder if uri == stored else None)

    # Offline there is no requester: a team's run is checked in full except who starts it (judged by `tp start`).
    request = resolve(
        execution_input,
        execution_name=f"tp-validate-{uuid.uuid4().hex[:16]}",
        limits=limits,
        check_membership=False,
        folder_at=folder_at,
        packed_code=packed_code,
    )
    pipeline = settings.pipeline
    cost = estimate_cost(
        EstimateEvent.model_validate({"request": request}).request,
        threshold_usd=pipeline.approval_threshold_usd,
        spot_fraction=pipeline.spot_cost_fraction,
        price_overrides=pipeline.price_overrides,
        monthly_budget_usd=pipeline.monthly_budget_usd,
        team_budgets_usd={team.name: team.monthly_budget_usd for team in settings.teams},
    )
    return request, cost


MAX_INPUT_DEPTH = 64
"""Far deeper than any execution input (its deepest value is a few levels down), far shallower than Python's
recursion limit, which what reads the input (the schema's error messages, the start proof's JSON) recurses into."""


def _depth(value: Any) -> int:
    """How many levels of arrays and objects `value` nests, counted without recursion."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, depth = level.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            level.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            level.extend((child, depth + 1) for child in item)
    return deepest


def _read_input(path: Path) -> Any:
    """The input file's JSON; a file that cannot be read as JSON ends the command with one line saying why."""
    try:
        loaded = json.loads(path.read_bytes().decode("utf-8"))
        depth = _depth(loaded)
        if depth <= MAX_INPUT_DEPTH:
            return loaded
        problem = (
            f'nested {depth} levels deep; an execution input is an object of the keys in README "Starting a training '
            f'run", at most {MAX_INPUT_DEPTH} levels deep'
        )
    except (OSError, json.JSONDecodeError) as exc:
        problem = str(exc)
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 JSON"
    except RecursionError:
        problem = (
            f"nested deeper than the {sys.getrecursionlimit()} levels Python reads; an execution input is an object "
            'of the keys in README "Starting a training run", a few levels deep'
        )
    err.print(f"{path}: {problem}", style="red", markup=False, highlight=False)
    raise typer.Exit(2)


def _execution_input(path: Path) -> Any:
    """The input file's JSON; an empty file or a demo scenario, which no run takes, ends the command saying so."""
    with contextlib.suppress(OSError):  # a file that cannot be read is said so by _read_input
        if not path.read_bytes().strip():
            err.print(f"{path} is empty: an execution input is a JSON object (docs/reference/run-input.md)")
            raise typer.Exit(2)
    document = _read_input(path)
    if is_scenario(document):
        err.print(how_to_play(path), markup=False, highlight=False)
        raise typer.Exit(2)
    return document


def pack_for(
    execution_input: Any, folder: Path | None, settings: PlatformSettings, into: Path, *, artifacts_bucket: str
) -> tuple[Any, Packed | None]:
    """The input with the code of `folder` packed into `into` for the settings' image (code_pack.py), and the archive
    (None: no folder to pack); PackError says what cannot be packed."""
    if folder is None:
        return execution_input, None
    image = settings.base_image()
    return code_pack.packed_input(
        execution_input,
        folder,
        into,
        artifacts_bucket=artifacts_bucket,
        target=image.wheel_target,
        provided=image.provides,
    )


def _load(cdk_json: Path) -> PlatformSettings:
    try:
        return load_settings(cdk_json)
    except (OSError, KeyError, json.JSONDecodeError, SettingsError) as exc:
        err.print(f"cannot read the platform settings from {cdk_json} (--cdk-json or TP_CDK_JSON): {exc}")
        raise typer.Exit(2) from None


def _check(
    path: Path,
    cdk_json: Path,
    datasets_bucket: str,
    as_json: bool,
    *,
    source_dir: Path | None = None,
    model_folder: Path | None = None,
) -> tuple[dict[str, Any], CostEstimate, PlatformSettings]:
    settings = _load(cdk_json)
    execution_input = _execution_input(path)
    not_packed: list[Problem] = []
    packed_code = None
    with tempfile.TemporaryDirectory(prefix="tp-code-") as scratch:
        try:
            folder = code_pack.code_folder(execution_input, path.parent, source_dir)
            execution_input, packed = pack_for(
                execution_input, folder, settings, Path(scratch), artifacts_bucket=OFFLINE_ARTIFACTS_BUCKET
            )
            packed_code = code_pack.found(packed) if packed is not None else None
        except code_pack.PackError as exc:
            not_packed.append(Problem(exc.field, None, exc.message))
            # The input's other problems too: judged with its code stood in by an archive of no known content.
            if isinstance(execution_input.get("code"), dict):
                execution_input = code_pack.at(execution_input, OFFLINE_ARTIFACTS_BUCKET, "0" * 64)
        try:
            request, cost = offline_check(
                execution_input,
                settings,
                datasets_bucket=datasets_bucket,
                model_folder=model_folder,
                packed_code=packed_code,
            )
        except InvalidRequest as exc:
            _rejected(path, [*not_packed, *exc.problems], datasets_bucket, as_json)
    if not_packed:
        _rejected(path, not_packed, datasets_bucket, as_json)
    return request, cost, settings


def _rejected(path: Path, problems: list[Problem], datasets_bucket: str, as_json: bool) -> NoReturn:
    """Print why the pipeline would reject the input, every problem, and exit 1."""
    if as_json:
        listed = [{"field": p.field, "value": p.value, "message": p.message} for p in problems]
        out.print_json(data={"valid": False, "problems": listed})
    else:
        count = len(problems)
        err.print(f"{path}: the pipeline would reject this input ({count} problem{'' if count == 1 else 's'}):")
        for problem in problems:
            err.print(f"  - {problem}", markup=False, highlight=False)
        if datasets_bucket == OFFLINE_DATASETS_BUCKET and any(p.field == "dataset" for p in problems):
            err.print(
                f"  ({OFFLINE_DATASETS_BUCKET!r} stands in for the stage's datasets bucket: name it with "
                "--datasets-bucket or TP_DATASETS_BUCKET)"
            )
    raise typer.Exit(1)


def _print_estimate(cost: CostEstimate, settings: PlatformSettings) -> None:
    budget = settings.pipeline.monthly_budget_usd
    table = Table(show_header=False, box=None)
    table.add_row("hourly (cluster)", f"${cost.hourly_usd:,.2f}")
    table.add_row("worst case (on demand)", f"${cost.max_cost_usd:,.2f}")
    if cost.fallback_hourly_usd:
        table.add_row("worst case is on", cost.worst_case)
    if cost.spot_usd:
        table.add_row("spot (expected range)", f"${cost.spot_usd[0]:,.2f} – ${cost.spot_usd[1]:,.2f}")
    table.add_row("approval threshold", f"${cost.threshold_usd:,.2f}")
    table.add_row("needs launch approval", "yes" if cost.approval_required else "no")
    table.add_row("share of monthly budget", f"{cost.max_cost_usd / budget:.1%} of ${budget:,.2f}")
    table.add_row("prices", cost.price_source)
    if cost.gpu_memory:
        table.add_row("GPU memory (model, gradients, optimizer)", cost.gpu_memory)
    out.print(table)
    if cost.budget_warning:
        out.print(f"warning: {cost.budget_warning}", style="yellow", markup=False, highlight=False)


CdkJson = Annotated[
    Path, typer.Option(envvar="TP_CDK_JSON", help="the platform's cdk.json, whose settings Validate applies")
]
ModelFolder = Annotated[
    Path | None,
    typer.Option(help="a local copy of the input's init_from: judged as Validate judges it, and the memory estimated"),
]
SourceDir = Annotated[
    Path | None,
    typer.Option(
        help="your code's folder: packed, with its requirements' wheels for the image, as the input's `code`"
        " (else `code.source` may name a folder, relative to the input file)"
    ),
]
DatasetsBucket = Annotated[
    str,
    typer.Option(envvar="TP_DATASETS_BUCKET", help="the stage's datasets bucket, which s3:// datasets must be in"),
]


@app.command()
def validate(
    input_file: Path,
    *,
    source_dir: SourceDir = None,
    datasets_bucket: DatasetsBucket = OFFLINE_DATASETS_BUCKET,
    cdk_json: CdkJson = Path("cdk.json"),
    as_json: AsJson = False,
    model_folder: ModelFolder = None,
) -> None:
    """Check an execution input as Validate would, offline (packing its code); print every problem, then the
    estimate."""
    request, cost, settings = _check(
        input_file, cdk_json, datasets_bucket, as_json, source_dir=source_dir, model_folder=model_folder
    )
    if as_json:
        out.print_json(data={"valid": True, "request": request, "estimate": cost.model_dump(mode="json")})
        return
    out.print(f"[green]{input_file}: valid[/green] (run {request['run_name']})")
    if request["team"]:
        out.print(f"(whether you are a member of team {request['team']!r} is checked when the run starts)")
    _print_estimate(cost, settings)


@app.command()
def estimate(
    input_file: Path,
    *,
    source_dir: SourceDir = None,
    datasets_bucket: DatasetsBucket = OFFLINE_DATASETS_BUCKET,
    cdk_json: CdkJson = Path("cdk.json"),
    as_json: AsJson = False,
    model_folder: ModelFolder = None,
) -> None:
    """The run's cost bound as Estimate computes it: spot range, approval threshold, share of the budget; with
    --model-folder, a fine-tuning run's memory per GPU."""
    _, cost, settings = _check(
        input_file, cdk_json, datasets_bucket, as_json, source_dir=source_dir, model_folder=model_folder
    )
    if as_json:
        budget = settings.pipeline.monthly_budget_usd
        out.print_json(data={**cost.model_dump(mode="json"), "monthly_budget_usd": budget})
        return
    _print_estimate(cost, settings)


# -- a deployed stage ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a stage's runs and approvals are reached."""

    session: Any
    state_machine: str | None
    decision_url: str | None
    artifacts_bucket: str | None = None

    def need_state_machine(self) -> str:
        if not self.state_machine:
            raise typer.BadParameter("no state machine: pass --state-machine or set TP_STATE_MACHINE")
        return self.state_machine

    def need_artifacts_bucket(self) -> str:
        if not self.artifacts_bucket:
            raise typer.BadParameter("no artifacts bucket: pass --artifacts-bucket or set TP_ARTIFACTS_BUCKET")
        return self.artifacts_bucket

    def need_decision_url(self) -> str:
        if not self.decision_url:
            raise typer.BadParameter("no decision URL: pass --decision-url or set TP_DECISION_URL")
        return self.decision_url


def stage_outputs(session: Any, stage: str) -> dict[str, str]:
    """The pipeline stack's outputs by key, or {} where the stack is not found (or has none)."""
    cloudformation = session.client("cloudformation")
    stack_name = stack_outputs.pipeline_stack_name(stage_prefix(stage))
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:  # a stack not deployed leaves the flags and environment to say; other errors tell
        if "does not exist" in exc.response.get("Error", {}).get("Message", ""):
            return {}
        raise
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def target(
    stage: str,
    region: str | None,
    state_machine: str | None,
    decision_url: str | None,
    artifacts_bucket: str | None = "",
) -> Target:
    """What the flags and environment name, the rest from the stage's stack outputs ("" for not needed)."""
    session = boto3.Session(region_name=region)
    if None in (state_machine, decision_url, artifacts_bucket):
        outputs = stage_outputs(session, stage)
        state_machine = state_machine or outputs.get(stack_outputs.STATE_MACHINE_ARN)
        decision_url = decision_url or outputs.get(stack_outputs.DECISION_URL)
        artifacts_bucket = artifacts_bucket or outputs.get(stack_outputs.ARTIFACTS_BUCKET)
    return Target(session, state_machine, decision_url, artifacts_bucket)


def _credentials(session: Any) -> Any:
    credentials = session.get_credentials()
    if credentials is None:
        raise SystemExit("no AWS credentials found: sign in (e.g. aws sso login) and try again")
    return credentials.get_frozen_credentials()


def with_proof(
    execution_input: dict[str, Any], state_machine: str, name: str, session: Any, artifacts_bucket: str | None = None
) -> dict[str, Any]:
    """The input plus `requester_proof`, bound to this state machine, execution name and input, and for an input
    that names a team, `membership_proof` on the artifacts bucket."""
    return start_proof.attach(
        execution_input,
        state_machine=state_machine,
        execution_name=name,
        credentials=_credentials(session),
        artifacts_bucket=artifacts_bucket,
    )


def signed_request(
    url: str, method: str, body: dict[str, Any] | None, session: Any, *, query: dict[str, str] | None = None
) -> urllib.request.Request:
    """The call to the decision URL: an identity proof for what it asks, the whole request SigV4-signed."""
    match = _URL.match(url)
    if match is not None:
        region = match.group(1)
    elif _LOOPBACK.match(url) and session.region_name:  # the local platform's (make demo ARGS=--decide-with-tp)
        region = session.region_name
    else:
        raise SystemExit(
            f"{url} is not a Lambda function URL (https://<id>.lambda-url.<region>.on.aws/), nor the local "
            "platform's on 127.0.0.1 (with AWS_REGION set)"
        )
    credentials = _credentials(session)
    if method == "GET":
        page = {"cursor": (query or {}).get("cursor", ""), "limit": (query or {}).get("limit", str(PAGE_SIZE))}
        asked = identity.binding("list", page)
    else:
        asked = identity.binding(
            "decide", {k: str((body or {}).get(k, "")) for k in ("request_id", "decision", "reason")}
        )
    full_url = url + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    headers = {
        "content-type": "application/json",
        identity.PROOF_HEADER: identity.make_proof(credentials, region, asked),
    }
    request = AWSRequest(method=method, url=full_url, data=data, headers=headers)
    SigV4Auth(credentials, "lambda", region).add_auth(request)
    return urllib.request.Request(full_url, data=data, headers=dict(request.headers), method=method)  # noqa: S310


def send(request: urllib.request.Request) -> tuple[int, str]:
    """Deliver a signed request to the decision URL: (status, body)."""
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - https or loopback, checked in signed_request
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _decision_call(t: Target, method: str, body: dict[str, Any] | None, query: dict[str, str] | None) -> Any:
    status, text = send(signed_request(t.need_decision_url(), method, body, t.session, query=query))
    if status != 200:
        err.print(f"{status}: {text}", markup=False, highlight=False)
        raise typer.Exit(1)
    return json.loads(text)


def _execution_arn(state_machine: str, run: str) -> str:
    if run.startswith("arn:"):
        return run
    return f"{state_machine.replace(':stateMachine:', ':execution:')}:{run}"


@app.command()
def start(
    input_file: Path,
    *,
    name: Annotated[str | None, typer.Option(help="the execution name (default: generated)")] = None,
    source_dir: SourceDir = None,
    cdk_json: CdkJson = Path("cdk.json"),
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    artifacts_bucket: ArtifactsBucket = None,
    as_json: AsJson = False,
) -> None:
    """Start a run, with the proof of who starts it (pipeline.forbid_self_approval needs it) and, for a team's
    run, of the starter's team tag; its code folder packed and uploaded to the run's code prefix first."""
    execution_input = _execution_input(input_file)
    if not isinstance(execution_input, dict):
        err.print(f"{input_file} must hold a JSON object (docs/reference/run-input.md)")
        raise typer.Exit(2)
    folder = _code_folder(execution_input, input_file, source_dir)
    for_team = isinstance(execution_input.get("team"), str)
    t = target(stage, region, state_machine, "", artifacts_bucket if for_team or folder else "")
    machine = t.need_state_machine()
    with tempfile.TemporaryDirectory(prefix="tp-code-") as scratch:
        execution_input = upload_code(execution_input, folder, _load(cdk_json), Path(scratch), t)
    name = name or f"{execution_input.get('run_name', 'run')}-{uuid.uuid4().hex[:8]}"
    proven = with_proof(execution_input, machine, name, t.session, t.need_artifacts_bucket() if for_team else None)
    started = t.session.client("stepfunctions").start_execution(
        stateMachineArn=machine, name=name, input=json.dumps(proven)
    )
    if as_json:
        out.print_json(data={"name": name, "execution_arn": started["executionArn"]})
    else:
        out.print(started["executionArn"], markup=False, highlight=False)


def _code_folder(execution_input: dict[str, Any], input_file: Path, source_dir: Path | None) -> Path | None:
    try:
        return code_pack.code_folder(execution_input, input_file.parent, source_dir)
    except code_pack.PackError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def upload_code(
    execution_input: dict[str, Any], folder: Path | None, settings: PlatformSettings, scratch: Path, t: Target
) -> dict[str, Any]:
    """The input naming its code in the run's code prefix, the folder packed and uploaded there (once: an archive
    of the same digest there already is the same code); the input as it is without a folder to pack."""
    if folder is None:
        return execution_input
    try:
        ready, packed = pack_for(execution_input, folder, settings, scratch, artifacts_bucket=t.need_artifacts_bucket())
        assert packed is not None  # a folder was packed
        written = code_pack.upload(t.session.client("s3"), packed, ready["code"]["source"])
    except code_pack.PackError as exc:
        err.print(f"the run was not started: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    err.print(
        f"{'uploaded' if written else 'already uploaded:'} {ready['code']['source']} ({packed.size:,} bytes)",
        markup=False,
        highlight=False,
    )
    return dict(ready)


@app.command("list")
def list_runs(
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    status: Annotated[str | None, typer.Option(help="RUNNING, SUCCEEDED, FAILED, TIMED_OUT or ABORTED")] = None,
    as_json: AsJson = False,
) -> None:
    """The stage's runs, newest first."""
    t = target(stage, region, state_machine, "")
    sfn = t.session.client("stepfunctions")
    kwargs = {"stateMachineArn": t.need_state_machine(), **({"statusFilter": status} if status else {})}
    runs = [
        {
            "name": e["name"],
            "status": e["status"],
            "started": e["startDate"].isoformat(),
            "stopped": e["stopDate"].isoformat() if e.get("stopDate") else None,
            "execution_arn": e["executionArn"],
        }
        for page in sfn.get_paginator("list_executions").paginate(**kwargs)
        for e in page["executions"]
    ]
    if as_json:
        out.print_json(data=runs)
        return
    table = Table("run", "status", "started", "stopped")
    table.columns[0].overflow = "fold"  # a name to pass to tp watch|logs|stop: never cut
    for run in runs:
        table.add_row(run["name"], run["status"], run["started"], run["stopped"] or "")
    out.print(table)


@app.command()
def stop(
    run: str,
    *,
    reason: Annotated[str, typer.Option(help="recorded as the execution's cause")] = "stopped with tp",
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    as_json: AsJson = False,
) -> None:
    """Stop a run (its name or execution ARN); the pipeline stops its training job. A run that had already ended
    is left as it ended, and said so (exit 1)."""
    t = target(stage, region, state_machine, "")
    arn = _execution_arn(t.need_state_machine(), run)
    sfn = t.session.client("stepfunctions")
    described = sfn.describe_execution(executionArn=arn)
    if described["status"] in STOPPABLE:
        sfn.stop_execution(executionArn=arn, error=STOPPED_BY_USER, cause=reason)
        described = _after_stop(sfn, arn)
        # Or it ended on its own between the two calls: StopExecution leaves an ended execution as it was.
        if described["status"] in (*STOPPABLE, "ABORTED") and described.get("error") in (None, STOPPED_BY_USER):
            if as_json:
                out.print_json(data={"execution_arn": arn, "stopped": True, "reason": reason})
            else:
                out.print(f"stopped {arn}", markup=False, highlight=False)
            return
    ended = _ended(described)
    if as_json:
        out.print_json(data={"execution_arn": arn, "stopped": False, "status": described["status"], "ended": ended})
    else:
        err.print(f"not stopped: {arn} {ended}", markup=False, highlight=False)
    raise typer.Exit(1)


STOPPABLE = ("RUNNING", "PENDING_REDRIVE")
"""The statuses of an execution that StopExecution ends; any other has ended already."""
STOPPED_BY_USER = "StoppedByUser"


def _after_stop(sfn: Any, arn: str, *, seconds: float = 10.0) -> dict[str, Any]:
    """The execution once StopExecution has ended it (or after `seconds`, as it is then)."""
    deadline = time.monotonic() + seconds
    while True:
        described: dict[str, Any] = sfn.describe_execution(executionArn=arn)
        if described["status"] not in STOPPABLE or time.monotonic() > deadline:
            return described
        time.sleep(0.2)


def _ended(described: dict[str, Any]) -> str:
    """How an ended execution ended, in words: its status, when, and its error and cause."""
    stopped = described.get("stopDate")
    when = f" at {stopped.isoformat()}" if isinstance(stopped, datetime) else ""
    how = {
        "SUCCEEDED": "succeeded",
        "FAILED": "failed",
        "TIMED_OUT": "timed out",
        "ABORTED": "was stopped",
    }.get(described["status"], described["status"])
    said = ": ".join(str(described[k]) for k in ("error", "cause") if described.get(k))
    return f"had already ended: it {how}{when}" + (f" ({said})" if said else "")


@app.command()
def pending(
    *,
    stage: Stage = "dev",
    region: Region = None,
    decision_url: DecisionUrl = None,
    limit: Annotated[int | None, typer.Option(help=f"requests per page (1-{PAGE_SIZE})")] = None,
    cursor: Annotated[str | None, typer.Option(help="the `next` value of the previous page")] = None,
    as_json: AsJson = False,
) -> None:
    """Approval requests waiting for your decision, newest first."""
    t = target(stage, region, "", decision_url)
    page = {"cursor": cursor, "limit": None if limit is None else str(limit)}
    answer = _decision_call(t, "GET", None, {k: v for k, v in page.items() if v} or None)
    if as_json:
        out.print_json(data=answer)
        return
    table = Table("request id", "gate", "run", "team", "requested by", "estimate", "code")
    table.columns[0].overflow = "fold"  # an id to paste into tp approve: never cut
    table.columns[-1].overflow = "fold"  # the code's digest: never cut
    for request in answer.get("pending", []):
        summary = json.loads(request.get("summary") or "{}")
        cost = f"${summary['max_cost_usd']:,.2f}" if isinstance(summary.get("max_cost_usd"), int | float) else ""
        shown = ("request_id", "gate", "run_name", "team", "requested_by")
        table.add_row(*(str(request.get(k) or "") for k in shown), cost, str(summary.get("code") or ""))
    out.print(table)
    if answer.get("next"):
        out.print(f"more: --cursor {answer['next']}", markup=False, highlight=False)


def _decide(decision: str, request_id: str, reason: str, t: Target, as_json: bool) -> None:
    answer = _decision_call(t, "POST", {"request_id": request_id, "decision": decision, "reason": reason}, None)
    if as_json:
        out.print_json(data=answer)
    else:
        out.print(f"{decision}d {request_id}", markup=False, highlight=False)


@app.command()
def approve(
    request_id: str,
    *,
    reason: Reason,
    stage: Stage = "dev",
    region: Region = None,
    decision_url: DecisionUrl = None,
    as_json: AsJson = False,
) -> None:
    """Approve a pending request (as an approver of its run's team, or of the platform)."""
    _decide("approve", request_id, reason, target(stage, region, "", decision_url), as_json)


@app.command()
def reject(
    request_id: str,
    *,
    reason: Reason,
    stage: Stage = "dev",
    region: Region = None,
    decision_url: DecisionUrl = None,
    as_json: AsJson = False,
) -> None:
    """Reject a pending request (as an approver of its run's team, or of the platform)."""
    _decide("reject", request_id, reason, target(stage, region, "", decision_url), as_json)


def lineage_records(s3: Any, bucket: str) -> list[dict[str, Any]]:
    """Every registered run's lineage record in the artifacts bucket."""
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=layout.RUNS)
        for o in page.get("Contents", [])
        if o["Key"].endswith(f"/{layout.LINEAGE}{layout.LINEAGE_RECORD}")
    ]
    return [json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in keys]


_COSTS = ("actual_usd", "on_demand_usd", "spot_savings_usd")


def _totals(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: sum(r[key] or 0 for r in runs) for key in _COSTS}


@app.command()
def cost(
    *,
    team: Annotated[str | None, typer.Option(help="only this team's runs")] = None,
    stage: Stage = "dev",
    region: Region = None,
    artifacts_bucket: ArtifactsBucket = None,
    as_json: AsJson = False,
) -> None:
    """Spend across registered runs, from their lineage records: actual, on demand, spot savings; by team too."""
    t = target(stage, region, "", "", artifacts_bucket)
    runs = [
        # A record written before teams has no `team`: the run is no team's.
        {"run_name": r["run_name"], "team": r.get("team"), "training_job": r["training_job"], **r["cost"]}
        for r in lineage_records(t.session.client("s3"), t.need_artifacts_bucket())
    ]
    if team is not None:
        runs = [r for r in runs if r["team"] == team]
    teams = sorted({r["team"] for r in runs}, key=lambda name: (name is None, name or ""))
    by_team = [{"team": name, **_totals([r for r in runs if r["team"] == name])} for name in teams]
    totals = _totals(runs)
    if as_json:
        out.print_json(data={"runs": runs, "teams": by_team, "total": totals})
        return
    table = Table("run", "team", "training job", "actual", "on demand", "spot savings", "estimate")
    for r in runs:
        table.add_row(
            r["run_name"],
            r["team"] or "",
            r["training_job"],
            *(f"${r[k]:,.2f}" if r[k] is not None else "" for k in _COSTS),
            f"${r['estimate_usd']:,.2f}",
        )
    for subtotal in by_team:
        table.add_row("team total", subtotal["team"] or "(none)", "", *(f"${subtotal[k]:,.2f}" for k in _COSTS), "")
    table.add_row("total", "", "", *(f"${totals[k]:,.2f}" for k in _COSTS), "")
    out.print(table)


def _history(sfn: Any, execution_arn: str) -> list[dict[str, Any]]:
    return [
        e
        for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
        for e in page["events"]
    ]


def _training_jobs(events: list[dict[str, Any]]) -> list[str]:
    """The training jobs a run created, from its execution history, in order. A team's run queues them as service
    jobs, and Batch names the training jobs: those are the ones its progress polls followed."""
    names: list[str] = []
    queued: set[str] = set()
    for event in events:
        if event["type"] == "TaskScheduled":
            parameters = json.loads(event["taskScheduledEventDetails"]["parameters"])
            name = parameters.get("TrainingJobName")
            if isinstance(name, str) and name not in names:
                names.append(name)
            if "ServiceRequestPayload" in parameters:
                queued.add(parameters["JobName"])
    if queued:
        followed = [r.get("job_name") for r in _task_results(events) if {"queued", "preemptions"} <= r.keys()]
        names += [n for n in dict.fromkeys(followed) if isinstance(n, str) and n not in queued and n not in names]
    return names


_SUCCEEDED = {
    "TaskSucceeded": "taskSucceededEventDetails",
    "LambdaFunctionSucceeded": "lambdaFunctionSucceededEventDetails",
}


def _task_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the run's tasks returned, in order (a Lambda task's Payload unwrapped; truncated outputs skipped)."""
    results = []
    for event in events:
        details = event.get(_SUCCEEDED.get(event["type"], ""))
        if not details or details.get("outputDetails", {}).get("truncated"):
            continue
        output = json.loads(details.get("output") or "null")
        if isinstance(output, dict):
            payload = output.get("Payload", output)
            results.append(payload if isinstance(payload, dict) else output)
    return results


@app.command()
def logs(
    run: str,
    *,
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    as_json: AsJson = False,
) -> None:
    """The run's training job logs from CloudWatch, stream by stream (one stream per host)."""
    t = target(stage, region, state_machine, "")
    arn = _execution_arn(t.need_state_machine(), run)
    cloudwatch = t.session.client("logs")
    streams: dict[str, list[str]] = {}
    for job in _training_jobs(_history(t.session.client("stepfunctions"), arn)):
        pages = cloudwatch.get_paginator("filter_log_events").paginate(
            logGroupName=stack_outputs.SAGEMAKER_TRAINING_LOG_GROUP, logStreamNamePrefix=f"{job}/"
        )
        for page in pages:
            for event in page["events"]:
                streams.setdefault(event["logStreamName"], []).append(event["message"])
    if as_json:
        out.print_json(data=streams)
        return
    if not streams:
        err.print(f"no training logs yet for {arn}", markup=False, highlight=False)
    for stream, lines in streams.items():
        out.rule(stream)
        for line in lines:
            out.print(line, markup=False, highlight=False)


def snapshot(session: Any, execution_arn: str, *, now: datetime | None = None) -> dict[str, Any]:
    """The run now: its state, its latest training job (status, loss, tokens/s, step, ETA), its cost so far
    at the estimate's list price (every job it started, spot billing included once SageMaker reports it) and
    its newest checkpoint, as the platform's last progress poll saw it."""
    now = now or datetime.now(UTC)
    sfn = session.client("stepfunctions")
    described = sfn.describe_execution(executionArn=execution_arn)
    events = _history(sfn, execution_arn)
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if e["type"].endswith("StateEntered")]
    results = _task_results(events)
    estimate = next((r for r in reversed(results) if {"hourly_usd", "max_cost_usd"} <= r.keys()), None)
    progress = next((r for r in reversed(results) if {"checkpoint", "interruptions"} <= r.keys()), None)
    state: dict[str, Any] = {
        "run": described["name"],
        "status": described["status"],
        "state": entered[-1] if entered else None,
        "job": None,
        "cost_so_far_usd": None,
        "max_cost_usd": estimate["max_cost_usd"] if estimate else None,
        "checkpoint": (progress or {}).get("checkpoint"),
        "interruptions": (progress or {}).get("interruptions"),
        "queued": (progress or {}).get("queued"),
        "preemptions": (progress or {}).get("preemptions"),
        "goodput": _goodput(results),
    }
    sagemaker = session.client("sagemaker")
    described_jobs = [job for job in (_described_job(sagemaker, name) for name in _training_jobs(events)) if job]
    if not described_jobs:
        return state
    if estimate:
        seconds = sum(_billed_seconds(job, now) for job in described_jobs)
        state["cost_so_far_usd"] = round(estimate["hourly_usd"] * seconds / 3600, 2)
    job = described_jobs[-1]
    metrics = {m["MetricName"]: m["Value"] for m in job.get("FinalMetricDataList", [])}
    step = (state["checkpoint"] or {}).get("step")
    max_steps = _max_steps(job.get("HyperParameters", {}))
    training = _trained_seconds(job, now)
    state["job"] = {
        "name": job["TrainingJobName"],
        "status": job["TrainingJobStatus"],
        "secondary_status": job.get("SecondaryStatus"),
        "loss": metrics.get(TRAIN_LOSS),
        "tokens_per_sec": metrics.get(TOKENS_PER_SEC),
        "checkpointed_step": step,
        "max_steps": max_steps,
        "eta_seconds": round((max_steps - step) * training / step) if step and max_steps and training else None,
        "billable_seconds": job.get("BillableTimeInSeconds"),
        "training_seconds": job.get("TrainingTimeInSeconds"),
        "max_runtime_seconds": job.get("StoppingCondition", {}).get("MaxRuntimeInSeconds"),
    }
    return state


def _goodput(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The goodput of the run's finished jobs, from the ledgers their last progress polls returned."""
    ledgers = {r["job_name"]: r["goodput"] for r in results if r.get("goodput") and "job_name" in r}
    if not ledgers:
        return None
    run = goodput.RunLedger([goodput.JobLedger.from_json(body) for body in ledgers.values()])
    return {**run.to_json(), "summary": run.summary()}


def _described_job(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob, or None for a job the run asked for that SageMaker has not created yet."""
    try:
        return dict(sagemaker.describe_training_job(TrainingJobName=name))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationException":
            return None
        raise


def _billed_seconds(job: dict[str, Any], now: datetime) -> float:
    """SageMaker's billable seconds once it reports them; until then the seconds trained."""
    billable = job.get("BillableTimeInSeconds")
    return float(billable) if billable is not None else _trained_seconds(job, now)


def _trained_seconds(job: dict[str, Any], now: datetime) -> float:
    """SageMaker's training seconds once it reports them; until then the time since training started."""
    if job.get("TrainingTimeInSeconds") is not None:
        return float(job["TrainingTimeInSeconds"])
    started, ended = job.get("TrainingStartTime"), job.get("TrainingEndTime")
    if not isinstance(started, datetime):
        return 0.0
    return max(0.0, ((ended if isinstance(ended, datetime) else now) - started).total_seconds())


def _max_steps(hyperparameters: dict[str, str]) -> int | None:
    try:
        return from_hyperparameters(hyperparameters).train.max_steps
    except ConfigError:
        return None


@app.command()
def watch(
    run: str,
    *,
    once: Annotated[bool, typer.Option(help="print one snapshot and exit")] = False,
    interval: Annotated[float, typer.Option(help="seconds between snapshots")] = 30.0,
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    as_json: AsJson = False,
) -> None:
    """Follow a run: its state, step, loss and tokens/s, ETA, cost so far and newest checkpoint."""
    t = target(stage, region, state_machine, "")
    arn = _execution_arn(t.need_state_machine(), run)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=out, disable=once or as_json
    ) as progress:
        task = progress.add_task(run, total=None)
        while True:
            state = snapshot(t.session, arn)
            job = state["job"] or {}
            if once or as_json:
                if as_json:
                    out.print_json(data=state)
                else:
                    out.print(_describe(state), markup=False, highlight=False)
                return
            progress.update(
                task,
                description=_describe(state),
                completed=job.get("checkpointed_step") or 0,
                total=job.get("max_steps"),
            )
            if state["status"] != "RUNNING":
                return
            time.sleep(interval)


def _describe(state: dict[str, Any]) -> str:
    parts = [f"{state['run']}: {state['status']}" + (f" at {state['state']!r}" if state["state"] else "")]
    if state.get("queued"):
        parts.append(str(state["queued"]))
    if state.get("preemptions"):
        parts.append(f"preempted {state['preemptions']} times, resumed from checkpoints")
    job = state["job"]
    if job is not None and not state.get("queued"):
        parts.append(f"job {job['name']} {job['status']}/{job['secondary_status']}")
        if job["checkpointed_step"] is not None:
            parts.append(f"step {job['checkpointed_step']}/{job['max_steps'] or '?'} (checkpointed)")
        if job["loss"] is not None:
            parts.append(f"loss {job['loss']:.4g}")
        if job["tokens_per_sec"] is not None:
            parts.append(f"{job['tokens_per_sec']:,.0f} tokens/s")
        if job["eta_seconds"] is not None:
            parts.append(f"ETA {timedelta(seconds=job['eta_seconds'])}")
    if state["cost_so_far_usd"] is not None:
        bound = f" of at most ${state['max_cost_usd']:,.2f}" if state["max_cost_usd"] is not None else ""
        parts.append(f"${state['cost_so_far_usd']:,.2f} so far{bound}")
    if state["interruptions"]:
        parts.append(f"{state['interruptions']} spot interruptions")
    if state["goodput"] is not None:
        parts.append(f"goodput of finished jobs {100 * state['goodput']['goodput']:.1f}%")
    return ", ".join(parts)


def main() -> None:
    try:
        app()
    except ClientError as exc:  # what AWS refused, said once, without a traceback
        error = exc.response.get("Error", {})
        err.print(f"{exc.operation_name}: {error.get('Code')}: {error.get('Message')}", markup=False, highlight=False)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import ClientError, NoCredentialsError
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from contract import layout
from contract.code_archive import Packed
from contract.execution_state import CostEstimate, EstimateEvent
from lambdas.approvals import identity
from lambdas.approvals.store import PAGE_SIZE
from lambdas.estimate.handler import estimate as estimate_cost
from lambdas.handover import chain as handover_chain
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
from tools import approval_view, aws_session, code_pack, run_state, run_view, stage_check
from tools.cli_errors import UserError, budget_refusal, budget_stop, explain
from tools.scenario_files import how_to_play, is_scenario


class _Commands(typer.core.TyperGroup):
    """tp's commands: an error a user can cause ends in a line or two with its fix (tools/cli_errors.py), exit 1;
    `tp --debug` keeps the traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            said = explain(exc, budget_contact=budget_contact)  # None for typer's own exits and for faults of ours
            if said is None or (ctx.obj or {}).get("debug"):
                raise
            err.print(said, style="red", markup=False, highlight=False)
            raise typer.Exit(1) from None


app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, cls=_Commands)
# Soft wrap: an ARN, a cursor or a log line printed for a pipe or a narrow terminal stays whole.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="TP_DEBUG", help="on an error, show its traceback, not its explanation")
    ] = False,
) -> None:
    ctx.obj = {"debug": debug}


_URL = re.compile(r"^https://[a-z0-9]+\.lambda-url\.([a-z0-9-]+)\.on\.aws/?$")
# The decision URL the local platform serves on this machine's loopback (localrun/aws/decision_url.py).
_LOOPBACK = re.compile(r"^http://127\.0\.0\.1:\d{1,5}/?$")

Stage = Annotated[str, typer.Option(envvar="TP_STAGE", help="the platform's stage (settings' `stage`)")]
Region = Annotated[
    str | None,
    typer.Option(help="the stage's AWS Region (else TP_REGION, AWS_REGION, AWS_DEFAULT_REGION or the profile's)"),
]
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


RUN_INPUT_PAGE = "docs/reference/run-input.md"
"""Where the run input's keys are documented (generated from the model by tools/docs.py)."""
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
            f"nested {depth} levels deep; an execution input is an object of the keys in {RUN_INPUT_PAGE}, at most "
            f"{MAX_INPUT_DEPTH} levels deep"
        )
    except (OSError, json.JSONDecodeError) as exc:
        problem = str(exc)
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 JSON"
    except RecursionError:
        problem = (
            f"nested deeper than the {sys.getrecursionlimit()} levels Python reads; an execution input is an object "
            f"of the keys in {RUN_INPUT_PAGE}, a few levels deep"
        )
    err.print(f"{path}: {problem}", style="red", markup=False, highlight=False)
    raise typer.Exit(2)


def _execution_input(path: Path) -> Any:
    """The input file's JSON; an empty file or a demo scenario, which no run takes, ends the command saying so."""
    with contextlib.suppress(OSError):  # a file that cannot be read is said so by _read_input
        if not path.read_bytes().strip():
            err.print(f"{path} is empty: an execution input is a JSON object ({RUN_INPUT_PAGE})")
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
        table.add_row("memory per GPU (the plan)", cost.gpu_memory)
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
            raise UserError(f"no state machine: pass --state-machine or set TP_STATE_MACHINE{_NOT_FOUND}")
        return self.state_machine

    def need_artifacts_bucket(self) -> str:
        if not self.artifacts_bucket:
            raise UserError(f"no artifacts bucket: pass --artifacts-bucket or set TP_ARTIFACTS_BUCKET{_NOT_FOUND}")
        return self.artifacts_bucket

    def need_decision_url(self) -> str:
        if not self.decision_url:
            raise UserError(f"no decision URL: pass --decision-url or set TP_DECISION_URL{_NOT_FOUND}")
        return self.decision_url


_NOT_FOUND = " (the stage's pipeline stack names it, where tp finds the stack: --stage, --region; see `tp check`)"


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
    session = aws_session.session(region)
    if None in (state_machine, decision_url, artifacts_bucket):
        outputs = stage_outputs(session, stage)
        state_machine = state_machine or outputs.get(stack_outputs.STATE_MACHINE_ARN)
        decision_url = decision_url or outputs.get(stack_outputs.DECISION_URL)
        artifacts_bucket = artifacts_bucket or outputs.get(stack_outputs.ARTIFACTS_BUCKET)
    return Target(session, state_machine, decision_url, artifacts_bucket)


def _credentials(session: Any) -> Any:
    credentials = session.get_credentials()
    if credentials is None:
        raise NoCredentialsError()
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
        raise UserError(
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
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach the decision URL {request.full_url.split('?')[0]} ({reason}): the stage's pipeline stack "
            "names the current one (tp check); the local platform's lives as long as `make demo` runs"
        ) from None


def _decision_call(t: Target, method: str, body: dict[str, Any] | None, query: dict[str, str] | None) -> Any:
    status, text = send(signed_request(t.need_decision_url(), method, body, t.session, query=query))
    if status != 200:
        raise UserError(_refusal_words(status, text))
    return json.loads(text)


def _refusal_words(status: int, text: str) -> str:
    """What the decision URL's refusal says: its `error` message (the function's words), else its body."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        answer = None
    message = answer.get("error") or answer.get("message") if isinstance(answer, dict) else None
    if isinstance(message, str) and message:
        return message
    return f"the decision URL answered {status}: {text.strip() or '(no body)'}"


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
    wait: Annotated[
        float, typer.Option(help="seconds to wait for Validate's answer, to print a refusal here (0: do not wait)")
    ] = 60.0,
    as_json: AsJson = False,
) -> None:
    """Start a run, with the proof of who starts it (pipeline.forbid_self_approval needs it) and, for a team's
    run, of the starter's team tag; its code folder packed and uploaded to the run's code prefix first; then wait
    for Validate's answer and print a refusal in its words (exit 1)."""
    execution_input = _execution_input(input_file)
    if not isinstance(execution_input, dict):
        err.print(f"{input_file} must hold a JSON object ({RUN_INPUT_PAGE})")
        raise typer.Exit(2)
    folder = _code_folder(execution_input, input_file, source_dir)
    for_team = isinstance(execution_input.get("team"), str)
    t = target(stage, region, state_machine, "", artifacts_bucket if for_team or folder else "")
    machine = t.need_state_machine()
    with tempfile.TemporaryDirectory(prefix="tp-code-") as scratch:
        execution_input = upload_code(execution_input, folder, _load(cdk_json), Path(scratch), t)
    name = name or f"{execution_input.get('run_name', 'run')}-{uuid.uuid4().hex[:8]}"
    proven = with_proof(execution_input, machine, name, t.session, t.need_artifacts_bucket() if for_team else None)
    sfn = t.session.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine, name=name, input=json.dumps(proven))["executionArn"]
    try:
        answer = _validation(sfn, arn, wait) if wait > 0 else None
    except ClientError as exc:  # the run started; only reading it back is refused
        if exc.response.get("Error", {}).get("Code") not in ("AccessDenied", "AccessDeniedException"):
            raise
        err.print(f"started; Validate's answer is not shown: {explain(exc)}", markup=False, highlight=False)
        answer, wait = None, 0
    refusal = None if answer is None or answer["valid"] else _in_words(answer["message"], execution_input.get("team"))
    if as_json:
        valid = None if answer is None else answer["valid"]
        out.print_json(data={"name": name, "execution_arn": arn, "valid": valid, "refusal": refusal})
    else:
        out.print(arn, markup=False, highlight=False)
        if answer is None and wait > 0:
            err.print(f"Validate has not answered in {wait:g} s; follow the run with: tp watch {name}", highlight=False)
    if refusal is not None:
        err.print(refusal, style="red", markup=False, highlight=False)
        raise typer.Exit(1)


def _validation(sfn: Any, arn: str, seconds: float) -> dict[str, Any] | None:
    """Validate's answer for the run ({"valid", "message"}), or the run's end if it ended first; None while it has
    not answered after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        described = sfn.describe_execution(executionArn=arn)  # before the history: an ended run's is complete
        answer = run_state.validation(run_state.history(sfn, arn))
        if answer is not None:
            return {"valid": bool(answer.get("valid")), "message": str(answer.get("message") or "")}
        if described["status"] != "RUNNING":
            said = ": ".join(str(described[k]) for k in ("error", "cause") if described.get(k))
            return {"valid": False, "message": f"the run ended {described['status']} before Validate answered: {said}"}
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


def _in_words(message: str, team: Any) -> str:
    """A refusal or failure cause as the person reads it: a budget stop's raw deny as whose budget and whom to ask."""
    kind = budget_stop(message)
    if kind is None:
        return message
    return budget_refusal(kind, team if isinstance(team, str) else None, budget_contact)


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
    """Stop a run (its name or execution ARN); the pipeline stops its training job. A run handed over to a new
    execution is stopped in the execution it goes on in. A run that had already ended is left as it ended, and said
    so (exit 1)."""
    t = target(stage, region, state_machine, "")
    sfn = t.session.client("stepfunctions")
    arn, described = handover_chain.executions(sfn, _execution_arn(t.need_state_machine(), run))[-1]
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
    """Approval requests waiting for your decision, newest first: each with what to decide on."""
    t = target(stage, region, "", decision_url)
    page = {"cursor": cursor, "limit": None if limit is None else str(limit)}
    answer = _decision_call(t, "GET", None, {k: v for k, v in page.items() if v} or None)
    requests = answer.get("pending", [])
    if as_json:
        out.print_json(data={**answer, "pending": [approval_view.as_json(r) for r in requests]})
        return
    _print_requests(requests)
    if answer.get("next"):
        out.print(f"more: --cursor {answer['next']}", markup=False, highlight=False)


def _print_requests(requests: list[dict[str, Any]], *, full: bool = False) -> None:
    if not requests:
        out.print("no approval request waits for your decision")
    for request in requests:
        for line in approval_view.card(request, full=full):
            out.print(line, markup=False, highlight=False)
        out.print()
    if requests and not full:
        out.print('decide: tp approve|reject <request> --reason "..."; more: tp show <request>', highlight=False)


def _decide(decision: str, request_id: str, reason: str, t: Target, as_json: bool) -> None:
    answer = _decision_call(t, "POST", {"request_id": request_id, "decision": decision, "reason": reason}, None)
    if as_json:
        out.print_json(data=answer)
    else:
        out.print(f"{answer.get('decision')} {request_id} as {answer.get('by')}", markup=False, highlight=False)


def _decision_command(decision: str) -> Callable[..., None]:
    """The command that decides a pending request with `decision` ("approve" or "reject")."""

    def command(
        request_id: str,
        *,
        reason: Reason,
        stage: Stage = "dev",
        region: Region = None,
        decision_url: DecisionUrl = None,
        as_json: AsJson = False,
    ) -> None:
        _decide(decision, request_id, reason, target(stage, region, "", decision_url), as_json)

    command.__doc__ = (
        f"{decision.capitalize()} a pending request (as an approver of its run's team, or of the platform)."
    )
    return command


approve = app.command("approve")(_decision_command("approve"))
reject = app.command("reject")(_decision_command("reject"))


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


Since = Annotated[
    str | None, typer.Option(help="only lines since then: a duration ago (30s, 10m, 2h, 1d) or an ISO 8601 time")
]


@app.command()
def logs(
    run: str,
    *,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until the run ends")] = False,
    since: Since = None,
    host: Annotated[
        list[str] | None, typer.Option(help="only this host's lines (algo-1, node-0; repeat for several)")
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between looks for new lines (--follow)")] = 5.0,
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    as_json: AsJson = False,
) -> None:
    """The run's job logs from CloudWatch, one stream per host: SageMaker training jobs, a tuning job's trials and
    AWS Batch jobs' nodes."""
    t = target(stage, region, state_machine, "")
    arn = _execution_arn(t.need_state_machine(), run)
    sfn, cloudwatch = t.session.client("stepfunctions"), t.session.client("logs")
    since_ms = _since_ms(since)
    seen: set[str] = set()
    shown: dict[str, list[str]] = {}
    while True:
        ended = sfn.describe_execution(executionArn=arn)["status"] != "RUNNING"  # before the last look
        chosen = [s for s in run_state.streams(t.session, run_state.history(sfn, arn)) if not host or s.host in host]
        for stream, event in run_state.events_of(cloudwatch, chosen, since_ms=since_ms):
            if event["eventId"] in seen:
                continue
            seen.add(event["eventId"])
            if follow and not as_json:
                out.print(f"[{stream.label}] {event['message'].rstrip()}", markup=False, highlight=False)
            else:
                shown.setdefault(stream.name, []).append(event["message"])
        if not follow or ended:
            break
        time.sleep(interval)
    _print_logs(shown, arn, as_json=as_json, followed=follow, anything=bool(seen))


def _since_ms(since: str | None) -> int | None:
    if since is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", since.strip())
    if match:
        seconds = float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
        return int((time.time() - seconds) * 1000)
    try:
        moment = datetime.fromisoformat(since.strip())
    except ValueError:
        raise typer.BadParameter(f"{since!r}: give a duration ago (30s, 10m, 2h, 1d) or an ISO 8601 time") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


def _print_logs(shown: dict[str, list[str]], arn: str, *, as_json: bool, followed: bool, anything: bool) -> None:
    if as_json:
        out.print_json(data=shown)
        return
    if not anything:
        err.print(f"no log lines yet for {arn}", markup=False, highlight=False)
    if followed:
        return
    for stream, lines in shown.items():
        out.rule(stream)
        for line in lines:
            out.print(line, markup=False, highlight=False)


snapshot = run_state.snapshot


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
    """Follow a run: its state; the step, loss, validation loss and tokens/s its job last logged, its ETA; the cost
    so far; the goodput of its running and finished jobs; spot interruptions."""
    t = target(stage, region, state_machine, "")
    arn = _execution_arn(t.need_state_machine(), run)
    if once or as_json:
        state = snapshot(t.session, arn)
        if as_json:
            out.print_json(data=state)
        else:
            _print_watch(state)
        return
    with Live(console=out, auto_refresh=False) as live:
        while True:
            state = snapshot(t.session, arn)
            live.update(_watch_view(state), refresh=True)
            if state["status"] != "RUNNING":
                return
            time.sleep(interval)


def _print_watch(state: dict[str, Any]) -> None:
    for line in run_view.watch_lines(state, _in_words):
        out.print(line, markup=False, highlight=False)


def _watch_view(state: dict[str, Any]) -> Group:
    step, most = run_view.progress(state)
    lines = [Text(line) for line in run_view.watch_lines(state, _in_words)]
    return Group(*lines, ProgressBar(total=most, completed=step, width=60)) if most else Group(*lines)


@app.command()
def show(
    what: Annotated[str, typer.Argument(help="an approval request's id, or a run's name or execution ARN")],
    *,
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    decision_url: DecisionUrl = None,
    as_json: AsJson = False,
) -> None:
    """A pending approval request with everything to decide on, or a run: its request, estimate, decisions, jobs,
    model and how it ended."""
    if approval_view.REQUEST_ID.match(what):
        request = _pending_request(target(stage, region, "", decision_url), what)
        if as_json:
            out.print_json(data=approval_view.as_json(request))
        else:
            _print_requests([request], full=True)
        return
    t = target(stage, region, state_machine, "")
    facts = run_view.run_facts(t.session, _execution_arn(t.need_state_machine(), what))
    if as_json:
        out.print_json(data=facts)
        return
    for line in run_view.run_lines(facts, _in_words):
        out.print(line, markup=False, highlight=False)


def _pending_request(t: Target, request_id: str) -> dict[str, Any]:
    """The pending request of this id, looked for page by page; UserError when no pending one has it."""
    query: dict[str, str] | None = None
    while True:
        answer = _decision_call(t, "GET", None, query)
        found = [r for r in answer.get("pending", []) if r.get("request_id") == request_id]
        if found:
            return dict(found[0])
        if not answer.get("next"):
            raise UserError(
                f"no pending request {request_id} that you decide: it was decided or has expired, or is another "
                "team's (tp pending lists yours; tp show <run> shows a run and its decisions)"
            )
        query = {"cursor": str(answer["next"])}


@app.command()
def check(
    *,
    stage: Stage = "dev",
    region: Region = None,
    state_machine: StateMachine = None,
    decision_url: DecisionUrl = None,
    artifacts_bucket: ArtifactsBucket = None,
    cdk_json: CdkJson = Path("cdk.json"),
) -> None:
    """Whether tp can reach the stage: Region, credentials, who you are, its stack and outputs, your team."""
    given = {
        "TP_STATE_MACHINE": state_machine,
        "TP_DECISION_URL": decision_url,
        "TP_ARTIFACTS_BUCKET": artifacts_bucket,
    }
    lines = list(stage_check.check(stage, region, lambda: load_settings(cdk_json), given=given))
    _print_check(lines)
    if any(line.ok is False for line in lines):
        raise typer.Exit(1)


def _print_check(lines: list[stage_check.Line]) -> None:
    for line in lines:
        mark, style = {True: ("OK  ", "green"), False: ("FIX ", "red"), None: ("    ", "")}[line.ok]
        out.print(f"[{style or 'default'}]{mark}[/] {escape(line.text)}", highlight=False)


def budget_contact(team: str | None) -> str:
    """Whom to ask about a budget stop: the team's e-mails (its budget's recipients), else the platform's contact."""
    try:
        settings = load_settings(Path(os.environ.get("TP_CDK_JSON", "cdk.json")))
    except (OSError, KeyError, json.JSONDecodeError, SettingsError):
        return "the platform team"
    emails = next((t.notification_emails for t in settings.teams if t.name == team), [])
    return ", ".join(emails) or settings.budget_contact


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""`tp`, driven through typer's CliRunner: offline against cdk.json's settings, and against the local platform
(moto, IAM enforced) as an ML engineer and an approver would use it."""

from __future__ import annotations

import contextlib
import io
import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from rich.console import Console
from typer.testing import CliRunner

from contract.config import from_hyperparameters
from contract.metrics import TOKENS_PER_SEC, TRAIN_LOSS
from localrun.aws.cfn import REGION
from localrun.aws.clock import Clock
from localrun.aws.decision_url import function_url_event
from localrun.aws.engine import REQUESTER
from localrun.aws.iam import SAGEMAKER
from localrun.aws.served import person_statements
from localrun.backends.scripted import Poll
from stacks.settings import PipelineSettings
from tests.conftest import APPROVER, EXAMPLE_INPUTS, REPO
from tests.pipeline.conftest import Pipeline
from tests.pipeline.test_resume_from import Uploads
from tests.pipeline.test_trust_storage import _s3_as

runner = CliRunner()


def tp(*args: str, env: dict[str, str] | None = None) -> Any:
    from tools.tp import app

    return runner.invoke(app, list(args), env=env, catch_exceptions=False)


def _answer(output: str) -> Any:
    """tp's (indented) JSON document in the output, less the platform handlers' one-line logs and metrics, which
    they write to stdout from other threads meanwhile."""
    lines = [line for line in output.splitlines() if not line.startswith('{"')]
    return json.loads("\n".join(lines))


def _lines(output: str) -> list[str]:
    """tp's lines in the output, less the platform handlers' JSON log lines (other threads write them meanwhile)."""
    return [line for line in output.splitlines() if not line.startswith('{"')]


# -- offline -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLE_INPUTS, ids=lambda p: p.stem)
def test_validate_accepts_every_example_on_the_shipped_settings_and_prints_its_estimate(example: Path) -> None:
    result = tp("validate", str(example))
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
    assert "approval threshold" in result.output
    assert "share of monthly budget" in result.output


def _three_mistakes(tmp_path: Path) -> Path:
    """A typo'd key, an instance type without `ml.` and a dataset in a bucket not the stage's."""
    example = json.loads((REPO / "examples" / "single-node-ddp.json").read_text())
    example["hyperparameter"] = example.pop("hyperparameters")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**example, "instance_type": "p4d.24xlarge", "dataset": "s3://someone-else/data/"}))
    return bad


def test_validate_names_every_problem_in_one_call_with_its_fix(tmp_path: Path) -> None:
    result = tp("validate", str(_three_mistakes(tmp_path)), env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "3 problems" in result.output
    assert "did you mean 'hyperparameters'" in result.output
    assert "ml.p4d.24xlarge" in result.output
    assert "someone-else" in result.output
    assert "approval threshold" not in result.output


def test_validate_json_lists_each_problem_with_field_and_value(tmp_path: Path) -> None:
    result = tp("validate", "--json", str(_three_mistakes(tmp_path)))
    assert result.exit_code == 1
    answer = _answer(result.stdout)
    assert answer["valid"] is False
    by_field = {p["field"]: p for p in answer["problems"]}
    assert set(by_field) == {"hyperparameter", "instance_type", "dataset"}
    assert by_field["instance_type"]["value"] == "p4d.24xlarge"
    assert "ml.p4d.24xlarge" in by_field["instance_type"]["message"]
    assert by_field["dataset"]["value"] == "s3://someone-else/data/"


def _demo_with(tmp_path: Path, **changes: Any) -> Path:
    example = json.loads((REPO / "examples" / "demo.json").read_text())
    path = tmp_path / "input.json"
    path.write_text(json.dumps({**example, **changes}))
    return path


def test_validate_names_every_hyperparameter_problem_at_once_with_did_you_mean(tmp_path: Path) -> None:
    mistakes = {"batchsize": 8, "max_step": 10, "lr": -1, "seq_len": "abc"}
    result = tp("validate", str(_demo_with(tmp_path, hyperparameters=mistakes)), env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "(4 problems)" in result.output
    assert "hyperparameters.batchsize: unknown hyperparameter 'batchsize' (did you mean 'batch_size'?)" in result.output
    assert "hyperparameters.max_step: unknown hyperparameter 'max_step' (did you mean 'max_steps'?)" in result.output
    assert "hyperparameters.lr: hyperparameter optim.lr=-1.0 is invalid" in result.output
    assert "hyperparameters.seq_len: hyperparameter seq_len='abc' is invalid: use an integer" in result.output


def test_an_unknown_hyperparameter_does_not_hide_a_top_level_model_reported_under_model(tmp_path: Path) -> None:
    result = tp("validate", "--json", str(_demo_with(tmp_path, model="gpt5", hyperparameters={"batchsize": 8})))
    assert result.exit_code == 1
    by_field = {p["field"]: p for p in _answer(result.stdout)["problems"]}
    assert set(by_field) == {"model", "hyperparameters.batchsize"}
    assert by_field["model"]["value"] == "gpt5"
    assert "choose one of" in by_field["model"]["message"] and "did you mean 'gpt2'?" in by_field["model"]["message"]


def test_a_value_of_the_wrong_type_is_named_with_what_to_write(tmp_path: Path) -> None:
    result = tp("validate", str(_demo_with(tmp_path, spot="yes", instance_count="two")), env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "spot: 'yes' is not a boolean; write true or false, without quotes" in result.output
    assert "instance_count: 'two' is not a whole number" in result.output
    assert "(2 problems)" in result.output


def test_an_empty_input_file_is_said_to_be_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    for command in ("validate", "estimate", "start"):
        result = tp(command, str(empty))
        assert result.exit_code == 2, result.output
        assert f"{empty} is empty: an execution input is a JSON object" in result.output


def test_a_demo_scenario_given_to_validate_says_how_to_play_it() -> None:
    result = tp("validate", str(REPO / "examples" / "teams.json"), env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "is a demo scenario" in result.output
    assert "make demo INPUT=" in result.output and "teams.json ARGS=--auto-approve" in result.output
    assert "unknown key" not in result.output


def test_validate_warns_of_an_estimate_above_the_monthly_budget_and_still_accepts_it() -> None:
    result = tp("validate", str(REPO / "examples" / "multi-node-fsdp-spot.json"), env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "warning: the worst case, $" in result.output
    assert "of the platform's monthly budget of $10,000.00" in result.output
    quiet = tp("validate", str(REPO / "examples" / "demo.json"), env={"COLUMNS": "300"})
    assert quiet.exit_code == 0 and "warning" not in quiet.output
    answer = _answer(tp("estimate", "--json", str(REPO / "examples" / "multi-node-fsdp-spot.json")).stdout)
    assert "monthly budget" in answer["budget_warning"]


def test_validate_says_where_the_settings_are_looked_for(tmp_path: Path) -> None:
    missing = tp("validate", "--cdk-json", str(tmp_path / "cdk.json"), str(REPO / "examples" / "demo.json"))
    assert missing.exit_code == 2 and "--cdk-json or TP_CDK_JSON" in missing.output
    bad_overrides = tp("validate", str(REPO / "examples" / "demo.json"), env={"PLATFORM_CONTEXT": "[1]"})
    assert bad_overrides.exit_code == 2 and "must be a JSON object of settings" in bad_overrides.output


def test_estimate_json_has_the_spot_range_threshold_and_budget() -> None:
    result = tp("estimate", "--json", str(REPO / "examples" / "multi-node-fsdp-spot.json"))
    assert result.exit_code == 0, result.output
    estimate = _answer(result.stdout)
    low, high = estimate["spot_usd"]
    assert 0 < low <= high < estimate["on_demand_usd"]
    settings = PipelineSettings.model_validate(
        json.loads((REPO / "cdk.json").read_text())["context"]["platform"]["pipeline"]
    )
    assert estimate["threshold_usd"] == settings.approval_threshold_usd
    assert estimate["monthly_budget_usd"] == settings.monthly_budget_usd


def _unreadable_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Input files that are not JSON objects Python can read, and what tp must say of each."""
    example = (REPO / "examples" / "demo.json").read_text()
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(example.replace('"demo', '"d\u00e9mo', 1).encode("latin-1"))
    beyond_python = tmp_path / "beyond-python.json"
    beyond_python.write_text("[" * 100_000 + "]" * 100_000)
    deep = json.loads(example)
    deep["hyperparameters"] = {"nested": json.loads("[" * 900 + "]" * 900)}
    deep_in_a_key = tmp_path / "deep.json"
    deep_in_a_key.write_text(json.dumps(deep))
    return {
        "not UTF-8": (latin1, "not UTF-8 text"),
        "deeper than Python reads": (beyond_python, "nested deeper than"),
        "deeper than an input is": (deep_in_a_key, "nested 901 levels deep"),
    }


@pytest.mark.parametrize("command", ["validate", "start"])
@pytest.mark.parametrize("kind", ["not UTF-8", "deeper than Python reads", "deeper than an input is"])
def test_an_input_python_cannot_read_is_one_line_not_a_traceback(tmp_path: Path, command: str, kind: str) -> None:
    path, said = _unreadable_inputs(tmp_path)[kind]
    result = tp(command, str(path), env={"TP_STATE_MACHINE": "arn:aws:states:us-east-1:123456789012:stateMachine:x"})
    assert result.exit_code == 2
    assert said in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_estimate_shows_the_memory_plan_of_a_gpu() -> None:
    example = str(REPO / "examples" / "multi-node-fsdp-spot.json")
    memory = _answer(tp("estimate", "--json", example).stdout)["gpu_memory"]
    assert memory.startswith("on a process (dp_shard=32: parameters ", memory.index(" ") + 5)
    assert "of the 72.0 GiB a process may use on ml.p5.48xlarge's 80 GiB H100" in memory
    printed = tp("estimate", example).stdout
    assert "memory per GPU (the plan)" in printed


# -- against the local platform ------------------------------------------------------------------------


def _env(session: Any) -> dict[str, str]:
    keys = session.get_credentials().get_frozen_credentials()
    return {
        "AWS_ACCESS_KEY_ID": keys.access_key,
        "AWS_SECRET_ACCESS_KEY": keys.secret_key,
        "AWS_SESSION_TOKEN": keys.token,
        "AWS_REGION": session.region_name,
    }


@pytest.fixture
def local(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    return _wired(pipeline, monkeypatch)


@pytest.fixture
def training_forever(pipeline_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A platform whose job trains until something stops it."""
    return _wired(pipeline_factory(scripts=[[Poll()]], clock=Clock(wait_scale=0.001)), monkeypatch)


def _wired(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """`tp` pointed at the local platform; the decision URL reached as its function URL delivers a request."""
    import tools.tp

    def deliver(request: Any) -> tuple[int, str]:
        data = request.data if isinstance(request.data, bytes) else None
        query = urllib.parse.urlsplit(request.full_url).query
        event = function_url_event(request.get_method(), dict(request.header_items()), query, data)
        response = pipeline.local.invoke("ApprovalDecide", event)
        return int(response["statusCode"]), str(response["body"])

    monkeypatch.setattr(tools.tp, "send", deliver)
    monkeypatch.setenv("TP_STATE_MACHINE", pipeline.local.state_machine_arn)
    monkeypatch.setenv("TP_ARTIFACTS_BUCKET", pipeline.local.environment("Register")["ARTIFACTS_BUCKET"])
    monkeypatch.setenv("TP_DECISION_URL", pipeline.local.environment("ApprovalRequest")["DECISION_URL"])
    return pipeline


def _engineer(local: Pipeline) -> dict[str, str]:
    """The ML engineer's session, with what an engineer's role needs to use tp (localrun/aws/served.py's policy)."""
    session = local.local.person(REQUESTER, "engineer")
    boto3.client("iam", region_name=REGION).put_role_policy(
        RoleName=REQUESTER.rsplit("/", 1)[-1],
        PolicyName="UseTp",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": person_statements(local.local, engineer=True, stage="dev")}
        ),
    )
    return _env(session)


def _start(local: Pipeline, tmp_path: Path, name: str) -> str:
    run_input = tmp_path / "input.json"
    run_input.write_text(json.dumps(local.input()))
    engineer = _engineer(local)
    result = tp("start", str(run_input), "--name", name, "--json", env=engineer)
    assert result.exit_code == 0, result.output
    return str(_answer(result.stdout)["execution_arn"])


def _pending_id(local: Pipeline, arn: str) -> str:
    local.run_until(arn, "Approval gate (promotion)")
    local.pending("promotion")  # the request is open (the harness's own listing waits for it)
    result = tp("pending", "--json", env=_env(local.local.person(APPROVER)))
    assert result.exit_code == 0, result.output
    (request,) = [r for r in _answer(result.stdout)["pending"] if r["gate"] == "promotion"]
    return str(request["request_id"])


def test_start_list_pending_and_approve_a_run(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-1")
    request_id = _pending_id(local, arn)

    listed = tp("list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [(r["name"], r["status"]) for r in _answer(listed.stdout)] == [("tp-run-1", "RUNNING")]

    result = tp("approve", request_id, "--reason", "val loss is fine", env=_env(local.local.person(APPROVER)))
    assert result.exit_code == 0, result.output
    assert local.finish(arn)["status"] == "SUCCEEDED"

    spent = tp("cost", "--json")
    assert spent.exit_code == 0, spent.output
    (run,) = _answer(spent.stdout)["runs"]
    assert run["run_name"] == local.lineage()["run_name"]
    assert _answer(spent.stdout)["total"]["actual_usd"] == pytest.approx(local.lineage()["cost"]["actual_usd"])


def _lineage(run: str, team: str | None, actual_usd: float) -> dict[str, Any]:
    record = {
        "run_name": run,
        "team": team,
        "training_job": f"{run}-1",
        "cost": {"estimate_usd": 100.0, "actual_usd": actual_usd, "on_demand_usd": actual_usd, "spot_savings_usd": 0},
    }
    if team is None:
        del record["team"]  # a record Register wrote before teams
    return record


@mock_aws
def test_cost_totals_each_team_and_filters_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="artifacts")
    for record in (_lineage("a", "vision", 10.0), _lineage("b", "language", 4.0), _lineage("c", "vision", 2.5)):
        s3.put_object(
            Bucket="artifacts", Key=f"runs/{record['run_name']}/lineage/lineage.json", Body=json.dumps(record)
        )
    s3.put_object(Bucket="artifacts", Key="runs/d/lineage/lineage.json", Body=json.dumps(_lineage("d", None, 1.0)))
    where = ("--artifacts-bucket", "artifacts", "--region", REGION)

    every = _answer(tp("cost", *where, "--json").stdout)
    assert {r["run_name"]: r["team"] for r in every["runs"]} == {
        "a": "vision",
        "b": "language",
        "c": "vision",
        "d": None,
    }
    assert [(t["team"], t["actual_usd"]) for t in every["teams"]] == [("language", 4.0), ("vision", 12.5), (None, 1.0)]
    assert every["total"]["actual_usd"] == 17.5

    vision = _answer(tp("cost", *where, "--team", "vision", "--json").stdout)
    assert sorted(r["run_name"] for r in vision["runs"]) == ["a", "c"]
    assert [(t["team"], t["actual_usd"]) for t in vision["teams"]] == [("vision", 12.5)]
    assert vision["total"]["actual_usd"] == 12.5

    # The table as tp prints it, on a console of its own: other tests' platform threads also write to stdout.
    console = Console(record=True, width=200, file=io.StringIO())
    monkeypatch.setattr("tools.tp.out", console)
    table = tp("cost", *where)
    assert table.exit_code == 0, table.output
    rows = [line.split("│")[1:-1] for line in console.export_text().splitlines() if "│" in line]
    cells = {(row[0].strip(), row[1].strip()): row[3].strip() for row in rows}
    assert cells[("team total", "vision")] == "$12.50"
    assert cells[("team total", "(none)")] == "$1.00"
    assert cells[("total", "")] == "$17.50"
    assert cells[("a", "vision")] == "$10.00"


def test_logs_shows_each_hosts_stream(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-5")
    local.run_until(arn, "Approval gate (promotion)")
    (job,) = local.jobs()
    cloudwatch = boto3.client("logs", region_name=REGION)  # as SageMaker writes a job's logs, one stream per host
    with contextlib.suppress(cloudwatch.exceptions.ResourceAlreadyExistsException):
        cloudwatch.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    for host in ("algo-1", "algo-2"):
        stream = f"{job}/{host}-1700000000"
        cloudwatch.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
        cloudwatch.put_log_events(
            logGroupName="/aws/sagemaker/TrainingJobs",
            logStreamName=stream,
            logEvents=[{"timestamp": int(time.time() * 1000), "message": f"step 10 loss 2.5 on {host}"}],
        )
    result = tp("logs", "tp-run-5", "--json")
    assert result.exit_code == 0, result.output
    assert _answer(result.stdout) == {
        f"{job}/algo-1-1700000000": ["step 10 loss 2.5 on algo-1"],
        f"{job}/algo-2-1700000000": ["step 10 loss 2.5 on algo-2"],
    }


def _log(job: str, host: str, lines: list[str], *, at_ms: int) -> None:
    """Lines in a host's stream of the job, as SageMaker writes them, logged at `at_ms` (one a second after)."""
    cloudwatch = boto3.client("logs", region_name=REGION)
    with contextlib.suppress(cloudwatch.exceptions.ResourceAlreadyExistsException):
        cloudwatch.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    stream = f"{job}/{host}-1700000000"
    with contextlib.suppress(cloudwatch.exceptions.ResourceAlreadyExistsException):
        cloudwatch.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
    events = [{"timestamp": at_ms + 1000 * i, "message": line} for i, line in enumerate(lines)]
    cloudwatch.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=events)


def test_logs_keeps_one_host_and_the_lines_since_a_time_and_follows_a_run_to_its_end(
    local: Pipeline, tmp_path: Path
) -> None:
    arn = _start(local, tmp_path, "tp-run-10")
    local.run_until(arn, "Approval gate (promotion)")
    (job,) = local.jobs()
    now = int(time.time() * 1000)
    _log(job, "algo-1", ["an hour ago on algo-1"], at_ms=now - 3_600_000)
    _log(job, "algo-1", ["now on algo-1"], at_ms=now)
    _log(job, "algo-2", ["now on algo-2"], at_ms=now)
    recent = _answer(tp("logs", "tp-run-10", "--since", "10m", "--json").stdout)
    assert sorted(line for lines in recent.values() for line in lines) == ["now on algo-1", "now on algo-2"]
    one = _answer(tp("logs", "tp-run-10", "--host", "algo-2", "--json").stdout)
    assert one == {f"{job}/algo-2-1700000000": ["now on algo-2"]}
    assert tp("logs", "tp-run-10", "--since", "yesterday").exit_code == 2  # neither a duration nor a time
    local.decide("promotion", "approve")
    local.finish(arn)
    followed = tp("logs", "tp-run-10", "--follow", "--interval", "0.1")  # the run has ended: one look, then done
    assert followed.exit_code == 0, followed.output
    assert f"[{job}/algo-1] an hour ago on algo-1" in _lines(followed.stdout)


def test_watch_shows_the_step_and_losses_the_job_last_logged_each_on_a_line(
    training_forever: Pipeline, tmp_path: Path
) -> None:
    local = training_forever
    arn = _start(local, tmp_path, "tp-run-11")
    local.run_until(arn, "Check progress")
    (job,) = local.jobs()
    now = int(time.time() * 1000)
    lines = [f"step={step} loss={3 - step / 100} lr=0.0006 grad_norm=1.0 tokens_per_sec=5000" for step in (40, 60)]
    _log(job, "algo-1", [lines[0], "step=50 val_loss=2.4", lines[1]], at_ms=now - 100_000)
    state = _answer(tp("watch", "tp-run-11", "--json").stdout)
    latest = state["job"]["latest"]
    newest = (latest["step"], latest["loss"], latest["validation_loss"], latest["validation_step"])
    assert newest == (60, 2.4, 2.4, 50)
    assert state["job"]["step"] == 60 and state["job"]["tokens_per_sec"] == 5000
    max_steps = state["job"]["max_steps"]
    assert state["job"]["eta_seconds"] == round((max_steps - 60) / (20 / 2))  # 20 steps in the 2 s between lines
    shown = [" ".join(line.split()) for line in _lines(tp("watch", "tp-run-11", "--once").stdout)]
    assert shown[0].startswith("run tp-run-11: RUNNING at ")
    assert any(line.startswith(f"step 60 of {max_steps}, logged at ") for line in shown)
    assert "loss 2.4, validation 2.4 at step 50" in shown
    assert "speed 5,000 tokens/s" in shown
    assert any(line.startswith("goodput ") and line.endswith("so far (this job)") for line in shown)


def test_reject_ends_the_run_without_promotion(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-2")
    request_id = _pending_id(local, arn)
    result = tp("reject", request_id, "--reason", "not this one", env=_env(local.local.person(APPROVER)))
    assert result.exit_code == 0, result.output
    assert local.finish(arn)["status"] != "SUCCEEDED"
    assert "Promote" not in " ".join(local.local.states_entered(arn)).split("Approval gate (promotion)")[-1]


def test_someone_not_an_approver_decides_nothing(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-3")
    request_id = _pending_id(local, arn)
    engineer = _env(local.local.person(REQUESTER, "engineer"))
    result = tp("approve", request_id, "--reason", "mine", env=engineer)
    assert result.exit_code == 1
    assert local.local.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"


def test_stop_stops_a_run_and_its_job(training_forever: Pipeline, tmp_path: Path) -> None:
    local = training_forever
    arn = _start(local, tmp_path, "tp-run-4")
    local.run_until(arn, "Check progress")
    result = tp("stop", "tp-run-4", "--reason", "wrong dataset", "--json")
    assert result.exit_code == 0, result.output
    assert _answer(result.stdout)["execution_arn"] == arn
    described = local.finish(arn)
    assert described["status"] == "ABORTED"
    local.local.wait(arn, 30, until=lambda: bool(local.local.events.deliveries))
    local.local.events.drain()
    assert local.training.stopped_names == local.jobs()


def test_stop_of_a_run_that_had_ended_says_how_it_ended_and_fails(training_forever: Pipeline, tmp_path: Path) -> None:
    local = training_forever
    arn = _start(local, tmp_path, "tp-run-5")
    local.run_until(arn, "Check progress")
    assert tp("stop", "tp-run-5", "--reason", "wrong dataset").exit_code == 0
    local.finish(arn)

    again = tp("stop", "tp-run-5", "--reason", "twice", env={"COLUMNS": "300"})
    assert again.exit_code == 1
    assert again.output.startswith(f"not stopped: {arn} had already ended")
    assert "had already ended: it was stopped at" in again.output
    assert "StoppedByUser: wrong dataset" in again.output
    as_json = _answer(tp("stop", "tp-run-5", "--json").stdout)
    assert (as_json["stopped"], as_json["status"]) == (False, "ABORTED")
    described = local.local.sfn.describe_execution(executionArn=arn)
    assert (described["status"], described["cause"]) == ("ABORTED", "wrong dataset")  # left as it ended


def test_watch_once_shows_the_run_and_its_job(training_forever: Pipeline, tmp_path: Path) -> None:
    local = training_forever
    arn = _start(local, tmp_path, "tp-run-6")
    local.run_until(arn, "Check progress")
    result = tp("watch", "tp-run-6", "--json")
    assert result.exit_code == 0, result.output
    state = _answer(result.stdout)
    (job,) = local.jobs()
    assert (state["run"], state["status"], state["job"]["name"]) == ("tp-run-6", "RUNNING", job)
    assert state["job"]["status"] == "InProgress"


def test_watch_shows_step_eta_cost_so_far_and_the_newest_checkpoint(
    pipeline_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    uploads = Uploads()
    metrics = {TRAIN_LOSS: 2.5, TOKENS_PER_SEC: 1234.0}
    playing = pipeline_factory(
        scripts=[[Poll(effect=uploads(10), metrics=metrics, training_seconds=100)]], clock=Clock(wait_scale=0.001)
    )
    local = _wired(playing, monkeypatch)
    uploads.s3 = _s3_as(local, SAGEMAKER)
    arn = _start(local, tmp_path, "tp-run-7")

    def watched() -> dict[str, Any]:
        result = tp("watch", "tp-run-7", "--json")
        assert result.exit_code == 0, result.output
        return dict(_answer(result.stdout))

    local.local.wait(arn, 60, until=lambda: watched()["checkpoint"] is not None)
    state = watched()
    max_steps = from_hyperparameters(local.input()["hyperparameters"]).train.max_steps
    assert state["checkpoint"]["step"] == 10
    assert state["job"]["checkpointed_step"] == 10
    assert (state["job"]["loss"], state["job"]["tokens_per_sec"]) == (2.5, 1234.0)
    assert state["job"]["max_steps"] == max_steps
    assert state["job"]["eta_seconds"] == round((max_steps - 10) * 100 / 10)
    # 100 s trained of a worst case that bills the whole cluster for max_runtime_hours
    worst_seconds = local.input()["max_runtime_hours"] * 3600
    assert state["cost_so_far_usd"] == round(state["max_cost_usd"] * 100 / worst_seconds, 2) > 0
    assert state["state"]

    shown = [" ".join(line.split()) for line in _lines(tp("watch", "tp-run-7", "--once").stdout)]
    assert f"step 10 of {max_steps} (last checkpoint; no log lines read)" in shown
    assert any(line.startswith("ETA ") for line in shown)
    assert any(line.startswith("cost $") and "so far, of at most $" in line for line in shown)


def test_watch_shows_the_goodput_of_the_runs_finished_jobs(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-8")
    local.run_until(arn, "Approval gate (promotion)")  # the job has ended and its ledger is written
    result = tp("watch", "tp-run-8", "--json")
    assert result.exit_code == 0, result.output
    found = _answer(result.stdout)["goodput"]
    (job,) = local.jobs()
    assert [j["job"] for j in found["jobs"]] == [job] and found["summary"].endswith(")")
    assert found == {**local.lineage()["goodput"], "summary": found["summary"]}  # as Register recorded it
    assert "goodput of the finished jobs" in tp("watch", "tp-run-8", "--once").stdout


def test_validate_rejects_a_backend_the_pipeline_does_not_deploy(tmp_path: Path) -> None:
    example = json.loads((REPO / "examples" / "demo.json").read_text())
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({**example, "backend": "sagemkaer"}))
    result = tp("validate", str(typo))
    assert result.exit_code == 1
    assert "backend 'sagemkaer'" in result.output


def test_a_dataset_outside_the_stand_in_bucket_is_explained(tmp_path: Path) -> None:
    example = json.loads((REPO / "examples" / "demo.json").read_text())
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({**example, "dataset": "s3://team-datasets/corpus/"}))
    refused = tp("validate", str(mine))
    assert refused.exit_code == 1 and "--datasets-bucket or TP_DATASETS_BUCKET" in refused.output
    assert tp("validate", "--datasets-bucket", "team-datasets", str(mine)).exit_code == 0


def test_pending_at_80_columns_keeps_id_run_and_requester_whole_and_shows_what_to_decide_on(
    local: Pipeline, tmp_path: Path
) -> None:
    arn = _start(local, tmp_path, "tp-run-8")
    request_id = _pending_id(local, arn)
    result = tp("pending", env={**_env(local.local.person(APPROVER)), "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = _lines(result.stdout)
    assert f"  request       {request_id}" in lines  # whole, on one line, to paste into tp approve
    assert "  run           gpt2-small" in lines
    assert any(line.endswith(f"requested by  {REQUESTER}") for line in lines)
    model = local.model_packages()[0]["ModelPackageArn"]
    assert f"  model         {model}" in lines
    assert any(line.startswith("  evaluation    validation:loss = 2.5 meets <= 3.0") for line in lines)
    assert all(len(line) <= 80 for line in lines if not line.startswith(("  model", "  lineage")))
    answer = _answer(tp("pending", "--json", env=_env(local.local.person(APPROVER))).stdout)
    (request,) = answer["pending"]
    assert request["summary"]["model_package"] == model  # an object, not a string of JSON


def test_launch_requests_show_the_cluster_runtime_and_cost(local: Pipeline, tmp_path: Path) -> None:
    run_input = tmp_path / "big.json"
    run_input.write_text(
        json.dumps(local.input(instance_type="ml.p5.48xlarge", instance_count=4, max_runtime_hours=10))
    )
    result = tp("start", str(run_input), "--name", "tp-big", "--json", env=_engineer(local))
    assert result.exit_code == 0, result.output
    local.run_until(_answer(result.stdout)["execution_arn"], "Approval gate (pre-launch)")
    local.pending("launch")
    shown = tp("pending", env={**_env(local.local.person(APPROVER)), "COLUMNS": "80"})
    lines = _lines(shown.stdout)
    assert "launch gate, waiting since" in lines[0]
    assert "  cluster       4 x ml.p5.48xlarge on demand, at most 10 h" in lines
    assert any(line.startswith("  cost          at most $4,522.80 (approval threshold $500.00)") for line in lines)
    assert "  dataset       fsx:///datasets/corpus/" in lines


def test_show_a_request_and_a_run_and_reject_says_rejected(local: Pipeline, tmp_path: Path) -> None:
    arn = _start(local, tmp_path, "tp-run-9")
    request_id = _pending_id(local, arn)
    approver = _env(local.local.person(APPROVER))
    card = _lines(tp("show", request_id, env=approver).stdout)
    assert card[0].startswith("promotion gate") and f"  execution     {arn}" in card
    rejected = tp("reject", request_id, "--reason", "not this one", env=approver)
    assert rejected.exit_code == 0, rejected.output
    assert f"rejected {request_id} as {APPROVER}" in _lines(rejected.stdout)
    again = tp("approve", request_id, "--reason", "changed my mind", env=approver)
    assert again.exit_code == 1
    assert again.output.strip().startswith(f"request {request_id} was already rejected by {APPROVER}")
    assert "409" not in again.output and '{"error"' not in again.output
    local.finish(arn)
    shown = _lines(tp("show", "tp-run-9", env=_engineer(local)).stdout)
    assert shown[0].startswith("run tp-run-9: FAILED")
    assert f"  requested by    {REQUESTER}" in shown
    assert any(line.startswith(f"  promotion gate  rejected by {APPROVER}") for line in shown)
    assert any(line.startswith("  ended           PromotionRejected: Rejected by") for line in shown)
    gone = tp("show", "0123456789abcdef0123456789abcdef", env=approver)
    assert gone.exit_code == 1 and "no pending request 0123456789abcdef0123456789abcdef" in gone.output


def test_start_prints_validates_refusal_in_its_words(local: Pipeline, tmp_path: Path) -> None:
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps(local.input(dataset="s3://someone-else/data/")))
    result = tp("start", str(refused), "--name", "tp-refused", env=_engineer(local))
    assert result.exit_code == 1
    assert "The training request cannot run:" in result.output and "someone-else" in result.output


def test_what_aws_refuses_is_one_line_not_a_traceback(
    local: Pipeline, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tools.tp

    monkeypatch.setattr("sys.argv", ["tp", "stop", "no-such-run"])
    with pytest.raises(SystemExit) as ended:
        tools.tp.main()
    assert ended.value.code == 1
    said = capsys.readouterr().err
    assert "ExecutionDoesNotExist" in said and len(said.strip().splitlines()) == 1


def test_an_unreadable_input_names_a_page_that_exists(tmp_path: Path) -> None:
    path, _ = _unreadable_inputs(tmp_path)["deeper than an input is"]
    result = tp("validate", str(path))
    named = [word.rstrip(",") for word in result.output.split() if word.startswith("docs/")]
    assert named and all((REPO / page).is_file() for page in named), result.output

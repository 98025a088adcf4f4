"""What a user can cause ends in a line or two with the fix, never a traceback: no Region, no credentials, an endpoint
or a decision URL out of reach, an expired token, throttling, a refusal, a budget stop; `tp --debug` keeps the
traceback; `make outputs` the same, and it reads AWS_REGION."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import NoRegionError
from typer.testing import CliRunner

from tests.conftest import REPO, SERVICE_ENVIRONMENT, TEAMS, cdk_context
from tools import outputs
from tools.run_view import watch_lines

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:training-platform-dev"
runner = CliRunner()


def _unset(*names: str) -> dict[str, str | None]:
    return dict.fromkeys(names)


# No Region, profile, config or instance metadata to fall back on; one attempt per call (no retry backoff).
BARE: dict[str, str | None] = {
    **_unset("AWS_REGION", "AWS_DEFAULT_REGION", "TP_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL"),
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_MAX_ATTEMPTS": "1",
    "TP_STATE_MACHINE": MACHINE,
}
KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": None}


def tp(*args: str, env: dict[str, str | None]) -> Any:
    from tools.tp import app

    return runner.invoke(app, list(args), env=env, catch_exceptions=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_region_says_how_to_name_one_and_debug_shows_the_traceback() -> None:
    result = tp("list", env={**BARE, **KEYS})
    assert result.exit_code == 1
    assert result.output.strip() == (
        "no AWS Region: pass --region, or set AWS_REGION (or TP_REGION, AWS_DEFAULT_REGION, or a region in your AWS "
        "profile)"
    )
    debugged = runner.invoke(__import__("tools.tp").tp.app, ["--debug", "list"], env={**BARE, **KEYS})
    assert isinstance(debugged.exception, NoRegionError)


def test_no_credentials_says_how_to_sign_in() -> None:
    result = tp("list", env={**BARE, "AWS_REGION": "eu-west-1", **_unset(*KEYS)})
    assert result.exit_code == 1
    assert "no AWS credentials found" in result.output and "aws sso login" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_endpoint_out_of_reach_and_a_decision_url_gone_are_said_with_the_fix() -> None:
    port = _closed_port()
    unreachable = tp(
        "list", env={**BARE, **KEYS, "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    )
    assert unreachable.exit_code == 1
    assert unreachable.output.startswith(
        f"cannot reach http://127.0.0.1:{port}/ (AWS_ENDPOINT_URL): start what it names"
    )
    gone = tp(
        "pending", env={**BARE, **KEYS, "AWS_REGION": "us-east-1", "TP_DECISION_URL": f"http://127.0.0.1:{port}/"}
    )
    assert gone.exit_code == 1
    assert gone.output.startswith(f"cannot reach the decision URL http://127.0.0.1:{port}/ (")
    assert "Traceback" not in unreachable.output + gone.output


class _Answers(BaseHTTPRequestHandler):
    """An AWS JSON endpoint that answers every call with the error the test set."""

    answer: tuple[int, str, str] = (400, "", "")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        status, code, message = self.answer
        body = json.dumps({"__type": code, "message": message}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/x-amz-json-1.0")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def answering() -> Iterator[tuple[ThreadingHTTPServer, dict[str, str | None]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {**BARE, **KEYS, "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}"}
    yield server, env
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "code", "message", "said"),
    [
        (400, "ExpiredTokenException", "The security token included in the request is expired", "have expired"),
        (400, "ThrottlingException", "Rate exceeded", "wait a minute and try again"),
        (
            400,
            "AccessDeniedException",
            "User: x is not authorized to perform: states:ListExecutions",
            "ask the platform",
        ),
    ],
)
def test_an_expired_token_throttling_and_a_refusal_each_say_what_to_do(
    answering: Any, status: int, code: str, message: str, said: str
) -> None:
    server, env = answering
    server.RequestHandlerClass.answer = (status, code, message)
    result = tp("list", env=env)
    assert result.exit_code == 1
    first, second = result.output.strip().splitlines()
    assert first == f"ListExecutions: {code}: {message}"
    assert said in second


def test_a_budget_stops_deny_is_said_as_whose_budget_and_whom_to_ask(answering: Any, tmp_path: Path) -> None:
    server, env = answering
    deny = (
        "User: arn:aws:sts::123456789012:assumed-role/Engineer/x is not authorized to perform: states:ListExecutions "
        "with an explicit deny in an identity-based policy: arn:aws:iam::123456789012:policy/training-platform-dev-"
        "pipeline-BudgetStopDeny1A2B3C-XYZ"
    )
    server.RequestHandlerClass.answer = (400, "AccessDeniedException", deny)
    settings = tmp_path / "cdk.json"
    context = cdk_context()
    context["platform"]["pipeline"] = {**context["platform"]["pipeline"], "budget_contact": "finops@example.org"}
    settings.write_text(json.dumps({"context": context}))
    result = tp("list", env={**env, "TP_CDK_JSON": str(settings)})
    assert result.exit_code == 1
    assert result.output.strip() == (
        "the platform's monthly budget is spent: AWS Budgets has stopped new training jobs (jobs already training keep "
        "running). Ask finops@example.org to raise the budget or to reverse the budget action."
    )


def test_a_run_failed_by_a_teams_budget_stop_is_said_with_the_teams_contact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tools.tp import _in_words

    settings = tmp_path / "cdk.json"
    settings.write_text(json.dumps({"context": cdk_context(teams=TEAMS, service_environment=SERVICE_ENVIRONMENT)}))
    monkeypatch.setenv("TP_CDK_JSON", str(settings))
    cause = (
        "ServiceJobNotSubmitted: User: arn:aws:sts::123456789012:assumed-role/StateMachineRole/x is not authorized to "
        "perform: batch:SubmitServiceJob on resource: arn:aws:batch:us-east-1:123456789012:quota-share/q/vision "
        "with an explicit deny in an identity-based policy: arn:aws:iam::123456789012:policy/training-platform-dev-"
        "pipeline-TeamBudgetvisionStopDeny9F8E7D-ABC"
    )
    state = {
        "run": "r",
        "status": "FAILED",
        "state": "Submit service job",
        "error": "ServiceJobNotSubmitted",
        "cause": cause,
        "team": "vision",
        "job": None,
        "cost_so_far_usd": None,
        "max_cost_usd": None,
        "goodput": None,
        "interruptions": None,
    }
    (heading, ended) = watch_lines(state, _in_words)
    assert heading == "run r: FAILED"
    assert ended == (
        "  ended  ServiceJobNotSubmitted: team vision's monthly budget is spent: AWS Budgets has stopped new training "
        "jobs (jobs already training keep running). Ask vision@example.org to raise the budget or to reverse the "
        "budget action."
    )


def test_a_real_process_prints_one_line_and_exits_1() -> None:
    env = {k: v for k, v in {**dict(__import__("os").environ), **BARE, **KEYS}.items() if v is not None}
    done = subprocess.run(
        [sys.executable, "-m", "tools.tp", "list"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().startswith("no AWS Region:") and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_make_outputs_reads_aws_region_and_says_what_a_user_can_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in {**BARE, **KEYS}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert outputs.main([]) == 1
    assert capsys.readouterr().err.strip().startswith("no AWS Region: pass --region, or set AWS_REGION")
    port = _closed_port()
    monkeypatch.setenv("AWS_REGION", "eu-west-2")  # AWS_REGION alone: botocore reads only AWS_DEFAULT_REGION
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    assert outputs.main([]) == 1
    assert capsys.readouterr().err.strip().startswith(f"cannot reach http://127.0.0.1:{port}/ (AWS_ENDPOINT_URL)")


def test_check_names_each_thing_to_fix() -> None:
    regionless = tp("check", env={**BARE, **KEYS})
    assert regionless.exit_code == 1
    assert regionless.output.startswith("FIX  Region: none found; pass --region")
    keyless = tp("check", env={**BARE, "AWS_REGION": "eu-west-1", **_unset(*KEYS)})
    assert keyless.exit_code == 1
    assert keyless.output.splitlines() == [
        "OK   Region eu-west-1 (from AWS_REGION)",
        "FIX  credentials: none found; sign in (aws sso login, or AWS_PROFILE naming a profile of ~/.aws/config) and "
        "try again",
    ]

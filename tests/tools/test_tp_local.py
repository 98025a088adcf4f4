"""The local mode, end to end: the local platform served on loopback (localrun/aws/served.py, as `make demo
ARGS=--serve` serves it), and `tp` in processes of its own, as from another terminal, with only what env.sh
exports: check, start, list, watch, pending, approve. IAM is enforced on every call the served endpoint answers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.aws.clock import Clock
from localrun.aws.served import APPROVER as APPROVER_PROFILE
from localrun.aws.served import ServedPlatform
from localrun.backends.scripted import Poll
from tests.conftest import APPROVER, REPO
from tests.pipeline.conftest import COMPLETED, Pipeline


@pytest.fixture
def served(pipeline_factory: Any, tmp_path: Path) -> Iterator[tuple[Pipeline, ServedPlatform]]:
    pipeline = pipeline_factory(scripts=[[Poll(), Poll(), COMPLETED]], clock=Clock(wait_scale=0.002))
    with ServedPlatform(pipeline.local, tmp_path / "local", stage="dev", approver=APPROVER) as platform:
        yield pipeline, platform


def _sourced(env_file: Path) -> dict[str, str]:
    """A shell's environment after `source env.sh`: its unsets and exports over a clean AWS environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TP_"))}
    for line in env_file.read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
    return env


def test_every_step_of_a_run_from_another_terminal(served: tuple[Pipeline, ServedPlatform], tmp_path: Path) -> None:
    pipeline, platform = served
    env = _sourced(platform.env_file)

    def tp(*args: str, profile: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "tools.tp", *args],
            cwd=REPO,
            env={**env, **({"AWS_PROFILE": profile} if profile else {})},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    checked = tp("check").stdout.splitlines()
    assert checked[0] == "OK   Region us-east-1 (from AWS_REGION)"
    assert "OK   signed in as arn:aws:sts::123456789012:assumed-role/MLEngineer/engineer" in checked
    assert not any(line.startswith("FIX") for line in checked)

    run_input = tmp_path / "input.json"
    run_input.write_text(json.dumps(pipeline.input()))
    started = json.loads(tp("start", str(run_input), "--name", "from-tp", "--json").stdout)
    assert started["valid"] is True and started["execution_arn"].endswith(":from-tp")

    listed = json.loads(tp("list", "--json").stdout)
    assert [(r["name"], r["status"]) for r in listed] == [("from-tp", "RUNNING")]

    pipeline.run_until(started["execution_arn"], "Approval gate (promotion)")
    watched = tp("watch", "from-tp", "--once").stdout.splitlines()
    assert watched[0] == "run from-tp: RUNNING at 'Approval gate (promotion)'"
    assert any(re.match(r"  job +gpt2-small-[0-9a-f]+-1: Completed", line) for line in watched)

    pending = tp("pending", profile=APPROVER_PROFILE).stdout.splitlines()
    (request_id,) = [line.split()[-1] for line in pending if line.startswith("  request ")]
    approved = tp("approve", request_id, "--reason", "from the other terminal", profile=APPROVER_PROFILE)
    assert approved.stdout.strip() == f"approved {request_id} as {APPROVER}"
    assert pipeline.finish(started["execution_arn"])["status"] == "SUCCEEDED"
    assert pipeline.local.iam.denials() == []
    judged = {j.action for j in pipeline.local.iam.judgements if ":assumed-role/MLEngineer/" in j.principal}
    assert {"states:StartExecution", "states:ListExecutions", "states:GetExecutionHistory"} <= judged


def test_the_endpoint_is_tls_and_judges_every_call(served: tuple[Pipeline, ServedPlatform]) -> None:
    import boto3
    from botocore.exceptions import ClientError

    _, platform = served
    env = _sourced(platform.env_file)
    assert env["AWS_ENDPOINT_URL"].startswith("https://127.0.0.1:")
    keys = {
        line.split(" = ")[0]: line.split(" = ")[1]
        for line in (platform.folder / "credentials").read_text().split("[local-approver]")[1].splitlines()
        if " = " in line
    }
    approver = boto3.client(
        "stepfunctions",
        region_name="us-east-1",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        verify=env["AWS_CA_BUNDLE"],
        **keys,
    )
    with pytest.raises(ClientError, match="not authorized to perform: states:StartExecution"):
        approver.start_execution(stateMachineArn=env["TP_STATE_MACHINE"], name="not-mine", input="{}")

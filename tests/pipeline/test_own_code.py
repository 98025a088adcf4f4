"""A run of its own code through the local platform, IAM enforced: the code `tp` uploads is what Validate checks, the
job receives, the approver sees, the start proof binds and the lineage records; a replaced archive, code outside
the run's own prefix, and writes by anyone who may not write them are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from contract import user_code
from contract.layout import code_key, run_code, team_code
from lambdas.validate import start_proof
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.engine import LocalPlatform
from localrun.aws.iam import SAGEMAKER
from localrun.backends.batch import ECS_TASKS
from localrun.backends.scripted import ScriptedTraining
from stacks.images import WheelTarget
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_approvals import EXPENSIVE
from tests.pipeline.test_queue import RUNNING, TEAM_A, TEAM_B, submitted, team_input, teams
from tests.pipeline.test_trust_storage import _s3_as
from tests.pipeline.test_tuning import _trial
from tests.tools.test_code_pack import UPLOADER_POLICY
from tools.code_pack import pack_code, upload

__all__ = ["teams"]  # the fixture, from tests/pipeline/test_queue.py

ENGINEER = f"arn:aws:iam::{ACCOUNT}:role/MLEngineer"


def _folder(tmp_path: Path, text: str = "print('training')\n") -> Path:
    folder = tmp_path / "my_project"
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "train.py").write_text(text)
    return folder


def _packed(tmp_path: Path, text: str = "print('training')\n") -> Any:
    return pack_code(
        _folder(tmp_path, text), tmp_path / "packed", requirements=None, target=WheelTarget("3.13"), provided={}
    )


def _artifacts(local: LocalPlatform) -> str:
    return local.environment("Validate")["ARTIFACTS_BUCKET"]


def _with_code(pipeline: Pipeline, packed: Any, run_name: str = "gpt2-small", **changes: Any) -> dict[str, Any]:
    """The pipeline's input with `model` traded for the packed code, as `tp start --source-dir` sends it."""
    uri = f"s3://{_artifacts(pipeline.local)}/{code_key(run_name, None, packed.sha256)}"
    code = {"source": uri, "sha256": packed.sha256, "entry_point": "src/train.py", "args": ["--epochs", "1"]}
    return pipeline.input(model=None, run_name=run_name, code=code, hyperparameters={"epochs": 1}, **changes)


def _admin_s3() -> Any:
    """The harness's own client: what an account administrator (or a compromised writer) can do."""
    return boto3.client("s3", region_name=REGION)


def test_a_run_of_its_own_code_reaches_the_job_the_approver_and_the_lineage(pipeline: Pipeline, tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    execution_input = _with_code(pipeline, packed, **EXPENSIVE)
    assert upload(_admin_s3(), packed, execution_input["code"]["source"]) is True
    arn = pipeline.start(execution_input)
    launch = pipeline.pending("launch")
    summary = json.loads(launch["summary"])
    assert summary["code"] == (
        f"src/train.py --epochs 1 from {execution_input['code']['source']} (sha256 {packed.sha256})"
    )
    pipeline.decide("launch", "approve")
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=120)
    assert packed.sha256 in json.loads(pipeline.pending("promotion")["summary"])["code"]
    (model,) = pipeline.model_packages()
    assert model["CustomerMetadataProperties"]["code_sha256"] == packed.sha256
    pipeline.decide("promotion", "approve")
    assert pipeline.finish(arn, timeout=120)["status"] == "SUCCEEDED"

    (job,) = pipeline.jobs()
    request = pipeline.local.training_requests[job]
    code_channel = request["InputDataConfig"][-1]
    assert code_channel["ChannelName"] == user_code.CODE_CHANNEL
    assert code_channel["DataSource"]["S3DataSource"]["S3Uri"] == execution_input["code"]["source"]
    hyperparameters = request["HyperParameters"]
    assert hyperparameters[user_code.SHA256] == packed.sha256 and hyperparameters["epochs"] == "1"
    assert user_code.UserCode.from_hyperparameters(hyperparameters).entry_point.script == "src/train.py"
    lineage = pipeline.lineage()
    assert lineage["code"]["sha256"] == packed.sha256 and lineage["code"]["uri"] == execution_input["code"]["source"]


def test_a_replaced_archive_is_refused_before_anything_starts(pipeline: Pipeline, tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    execution_input = _with_code(pipeline, packed)
    upload(_admin_s3(), packed, execution_input["code"]["source"])
    # Replaced after it was packed, by someone the bucket policy does not judge (the account's administrator).
    bucket, key = _artifacts(pipeline.local), code_key("gpt2-small", None, packed.sha256)
    _admin_s3().put_object(Bucket=bucket, Key=key, Body=b"import os; os.system('...')", ChecksumAlgorithm="SHA256")
    arn = pipeline.start(execution_input)
    described = pipeline.finish(arn, timeout=120)
    assert (described["status"], pipeline.local.states_entered(arn)[-1]) == ("FAILED", "Request rejected")
    assert f"not {packed.sha256}: it is not the code that was packed" in described["cause"]
    assert pipeline.jobs() == []


def test_a_run_names_neither_another_runs_code_nor_code_that_is_not_there(pipeline: Pipeline, tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    theirs = _with_code(pipeline, packed, run_name="their-run")
    upload(_admin_s3(), packed, theirs["code"]["source"])
    mine = _with_code(pipeline, packed)
    mine["code"]["source"] = theirs["code"]["source"]
    described = pipeline.finish(pipeline.start(mine, name="other-runs-code"), timeout=120)
    assert (
        f"a run reads only its own packed code, s3://{_artifacts(pipeline.local)}/{run_code('gpt2-small', None)}"
        in (described["cause"])
    )
    missing = pipeline.finish(pipeline.start(_with_code(pipeline, packed), name="never-uploaded"), timeout=120)
    assert "there is no packed code at" in missing["cause"]
    assert pipeline.jobs() == []


def test_the_start_proof_binds_the_codes_digest(pipeline: Pipeline, tmp_path: Path) -> None:
    first, second = _packed(tmp_path / "a"), _packed(tmp_path / "b", "print('other')\n")
    signed = start_proof.attach(
        _with_code(pipeline, first),
        state_machine=pipeline.local.state_machine_arn,
        execution_name="swapped",
        credentials=pipeline.local.person(ENGINEER, "starter").get_credentials().get_frozen_credentials(),
    )
    other = _with_code(pipeline, second)
    upload(_admin_s3(), second, other["code"]["source"])
    swapped = {**signed, "code": other["code"]}  # the proof of one code, sent with another
    described = pipeline.finish(pipeline.start(swapped, name="swapped"), timeout=120)
    assert "requester_proof" in described["cause"] and pipeline.jobs() == []


def test_a_tuning_run_of_its_own_code_gives_every_trial_the_code(pipeline_factory: Any, tmp_path: Path) -> None:
    pipeline = pipeline_factory(scripts=[_trial(2.5), _trial(2.2)])
    packed = _packed(tmp_path)
    execution_input = _with_code(
        pipeline,
        packed,
        tuning={
            "ranges": {"learning-rate": {"type": "continuous", "min": 0.001, "max": 0.1}},
            "objective": {"metric": "validation:loss"},
            "max_jobs": 2,
        },
    )
    upload(_admin_s3(), packed, execution_input["code"]["source"])
    arn = pipeline.start(execution_input)
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=120)
    trials = pipeline.jobs()
    assert len(trials) == 2
    for trial in trials:
        request = pipeline.local.training_requests[trial]
        assert (
            request["InputDataConfig"][-1]["DataSource"]["S3DataSource"]["S3Uri"] == execution_input["code"]["source"]
        )
        assert request["HyperParameters"][user_code.SHA256] == packed.sha256
        assert "learning-rate" in request["HyperParameters"]  # the tuned value, beside the code's description
    assert pipeline.lineage()["code"]["sha256"] == packed.sha256


def test_a_teams_queued_run_of_its_own_code_submits_the_code_in_its_request(teams: Any, tmp_path: Path) -> None:
    pipeline = teams([[RUNNING, COMPLETED]])
    packed = _packed(tmp_path)
    execution_input = team_input(pipeline, "team-a", "queued-code", model=None, hyperparameters={"epochs": 2})
    uri = f"s3://{_artifacts(pipeline.local)}/{code_key('queued-code', 'team-a', packed.sha256)}"
    execution_input["code"] = {"source": uri, "sha256": packed.sha256, "entry_point": "src/train.py"}
    upload(_admin_s3(), packed, uri)
    with submitted() as sent:
        arn = pipeline.start(execution_input, requester=TEAM_A)
        pipeline.run_until(arn, "Approval gate (promotion)", timeout=120)
    (params,) = sent
    payload = json.loads(params["serviceRequestPayload"])
    assert payload["InputDataConfig"][-1]["DataSource"]["S3DataSource"]["S3Uri"] == uri
    assert payload["HyperParameters"][user_code.SHA256] == packed.sha256 and payload["HyperParameters"]["epochs"] == "2"


@pytest.mark.parametrize("service", [SAGEMAKER, ECS_TASKS])
def test_training_roles_read_the_code_prefix_and_never_write_it(
    pipeline: Pipeline, tmp_path: Path, service: str
) -> None:
    packed = _packed(tmp_path)
    uri = _with_code(pipeline, packed)["code"]["source"]
    upload(_admin_s3(), packed, uri)
    bucket, key = _artifacts(pipeline.local), code_key("gpt2-small", None, packed.sha256)
    s3 = _s3_as(pipeline, service)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == packed.path.read_bytes()
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]] == [key]
    for target in (key, code_key("another-run", None, "c" * 64)):
        with pytest.raises(ClientError, match="not authorized to perform: s3:PutObject"):
            s3.put_object(Bucket=bucket, Key=target, Body=b"planted", IfNoneMatch="*")


# -- who writes the code prefix: the bucket policy, on the teams platform --------------------------------------------


@pytest.fixture(scope="module")
def uploaders(teams_assembly: Path) -> Any:
    with LocalPlatform(teams_assembly, training=ScriptedTraining(scripts=[])) as local:
        iam = boto3.client("iam", region_name=REGION)
        for principal, tags in ((TEAM_A, None), (TEAM_B, {"platform-team": "team-b"}), (ENGINEER, None)):
            local.person(principal, tags=tags)
            iam.put_role_policy(
                RoleName=principal.rsplit("/", 1)[1], PolicyName="upload", PolicyDocument=json.dumps(UPLOADER_POLICY)
            )
        yield local


def _put(local: LocalPlatform, principal: str, key: str, **conditional: str) -> Any:
    s3 = local.person(principal).client("s3")
    return s3.put_object(Bucket=_artifacts(local), Key=key, Body=b"archive", **conditional)


def test_the_code_prefix_is_written_once_and_a_teams_by_its_members_only(uploaders: LocalPlatform) -> None:
    mine = f"{team_code('team-a')}a-run/{'d' * 64}.tar.gz"
    _put(uploaders, TEAM_A, mine, IfNoneMatch="*")  # team-a lists TeamAScientist
    with pytest.raises(ClientError, match="PreconditionFailed"):  # never replaced
        _put(uploaders, TEAM_A, mine, IfNoneMatch="*")
    with pytest.raises(ClientError, match="explicit deny"):  # nor written without the condition
        _put(uploaders, TEAM_A, f"{team_code('team-a')}a-run/{'e' * 64}.tar.gz")
    # team-b admits its tag; neither team writes the other's prefix, nor does anyone of no team.
    _put(uploaders, TEAM_B, f"{team_code('team-b')}b-run/{'d' * 64}.tar.gz", IfNoneMatch="*")
    for principal, team in ((TEAM_A, "team-b"), (TEAM_B, "team-a"), (ENGINEER, "team-a"), (ENGINEER, "team-b")):
        with pytest.raises(ClientError, match="explicit deny"):
            _put(uploaders, principal, f"{team_code(team)}x-run/{'f' * 64}.tar.gz", IfNoneMatch="*")
    _put(uploaders, ENGINEER, code_key("solo-run", None, "d" * 64), IfNoneMatch="*")  # a run of no team: any uploader

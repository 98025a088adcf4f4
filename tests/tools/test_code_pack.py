"""`tp`'s packing of a run's own code (tools/code_pack.py): the wheelhouse filled for the image from a local index,
what the image holds left out, a requirement that cannot be had refused at `tp validate` with every other problem,
and the archive uploaded to the run's code prefix once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract.code_archive import IMAGE, read, sha256_of
from contract.layout import code_key
from localrun.aws.engine import REQUESTER
from stacks.images import WheelTarget
from tests.pipeline.conftest import Pipeline
from tests.support.wheels import only_these_wheels, wheel
from tests.tools.test_tp import _answer, _engineer, local, tp
from tools.code_pack import PackError, pack_code, requirement_lines, upload

__all__ = ["local"]  # the fixture, from tests/tools/test_tp.py

# What a platform team grants its engineers for `tp start --source-dir` (docs/ml-engineer/your-own-code.md).
UPLOADER_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject"], "Resource": "arn:aws:s3:::*/code/*"},
        {"Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"], "Resource": "*"},
    ],
}

TARGET = WheelTarget(python="3.13")
IMAGE_HOLDS = {"torch": "2.10.0", "numpy": None}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package index of a few wheels: alpha needs beta and torch (which needs a CUDA library); gamma is built for
    CPython 3.11 only."""
    folder = tmp_path / "index"
    wheel(folder, "alpha", "1.0", ["beta>=2", "torch>=2.0", "delta; extra == 'fast'"])
    wheel(folder, "beta", "2.1")
    wheel(folder, "delta", "0.5")
    wheel(folder, "torch", "2.10.0", ["nvidia-cublas==12"], tag="cp313-cp313-manylinux_2_28_x86_64")
    wheel(folder, "nvidia-cublas", "12", tag="py3-none-manylinux_2_17_x86_64")
    wheel(folder, "gamma", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    only_these_wheels(monkeypatch, folder)
    return folder


def _project(tmp_path: Path, requirements: str) -> Path:
    folder = tmp_path / "my_project"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "requirements.txt").write_text(requirements)
    return folder


def test_the_wheelhouse_holds_what_the_requirements_need_beyond_what_the_image_holds(
    index: Path, tmp_path: Path
) -> None:
    folder = _project(tmp_path, "alpha[fast]==1.0\n# the image's own\ntorch\nzeta ; python_version < '3.0'\n")
    packed = pack_code(folder, tmp_path / "out", requirements="requirements.txt", target=TARGET, provided=IMAGE_HOLDS)
    record = read(packed.path, sha256=packed.sha256)  # the archive checks out against its record
    # torch and the CUDA library only it needs stay out; the extra's dependency comes in.
    assert sorted(record.wheels) == [
        "alpha-1.0-py3-none-any.whl",
        "beta-2.1-py3-none-any.whl",
        "delta-0.5-py3-none-any.whl",
    ]
    for name, digest in record.wheels.items():
        assert digest == sha256_of(index / name)  # the wheels pip resolved, hashes checked
    assert record.requires == {"alpha[fast]==1.0": "alpha-1.0-py3-none-any.whl", "torch": IMAGE}
    assert (record.python, record.platform, record.requirements) == ("3.13", TARGET.platform, "requirements.txt")


def test_a_requirement_with_no_wheel_for_the_image_is_refused(index: Path, tmp_path: Path) -> None:
    for line, said in (
        ("missing-project==1.0", "No matching distribution found for missing-project==1.0"),
        ("gamma", "No matching distribution found for gamma"),  # a wheel for CPython 3.11, not the image's 3.13
        ("alpha\ntorch<2", "torch"),  # what the image holds is not another version of it
    ):
        folder = _project(tmp_path, f"{line}\n")
        with pytest.raises(PackError) as refused:
            pack_code(folder, tmp_path / "out", requirements="requirements.txt", target=TARGET, provided=IMAGE_HOLDS)
        assert refused.value.field == "code.requirements"
        assert f"pip finds no wheels for Python 3.13 on {TARGET.platform}" in refused.value.message
        assert said in refused.value.message, refused.value.message


def test_requirements_the_image_meets_need_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_these_wheels(monkeypatch, tmp_path / "no-index")  # an empty folder: pip would find nothing
    folder = _project(tmp_path, "torch>=2.0\nnumpy\n")
    packed = pack_code(folder, tmp_path / "out", requirements="requirements.txt", target=TARGET, provided=IMAGE_HOLDS)
    assert packed.record.requires == {"torch>=2.0": IMAGE, "numpy": IMAGE} and packed.record.wheels == {}
    (folder / "requirements.txt").write_text("torch<2\n")
    with pytest.raises(PackError, match=r"'torch<2' \(the image holds 2.10.0\): require what the image holds"):
        pack_code(folder, tmp_path / "out", requirements="requirements.txt", target=TARGET, provided=IMAGE_HOLDS)


def test_only_projects_can_be_required(tmp_path: Path) -> None:
    path = (
        _project(tmp_path, "-r other.txt\n./local_pkg\ngit+https://example.org/x.git\nbeta>=2\n") / "requirements.txt"
    )
    with pytest.raises(PackError, match=r"requirements.txt:1 '-r other.txt', requirements.txt:2 './local_pkg'"):
        requirement_lines(path, TARGET)
    assert list(requirement_lines(_project(tmp_path, "beta>=2  # pinned\n") / "requirements.txt", TARGET)) == [
        "beta>=2"
    ]


def _input(tmp_path: Path, **changes: Any) -> Path:
    run = {
        "run_name": "my-run",
        "dataset": "s3://datasets-bucket/images/",
        "instance_type": "ml.g5.2xlarge",
        "max_runtime_hours": 1,
        "code": {"source": "my_project", "entry_point": "train.py", "requirements": "requirements.txt"},
        "hyperparameters": {"epochs": 2},
        **changes,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return path


def test_tp_validate_packs_the_folder_and_checks_the_archive(index: Path, tmp_path: Path) -> None:
    _project(tmp_path, "alpha==1.0\n")
    result = tp("validate", "--json", str(_input(tmp_path)))
    assert result.exit_code == 0, result.output
    request = _answer(result.stdout)["request"]
    sha256 = request["code"]["sha256"]
    assert request["code"]["uri"] == f"s3://artifacts-bucket/{code_key('my-run', None, sha256)}"
    assert request["hyperparameters"]["code.sha256"] == sha256 and request["hyperparameters"]["epochs"] == "2"
    # --source-dir names another folder for the same input; an entry point it lacks is found by the check.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "main.py").write_text("")
    (other / "requirements.txt").write_text("beta\n")
    missing = tp("validate", "--json", "--source-dir", str(other), str(_input(tmp_path)))
    assert missing.exit_code == 1
    (problem,) = _answer(missing.stdout)["problems"]
    assert problem["field"] == "code.entry_point" and "'train.py' is not in the packed code" in problem["message"]


def test_tp_validate_refuses_a_missing_wheel_with_every_other_problem(index: Path, tmp_path: Path) -> None:
    _project(tmp_path, "alpha==1.0\nmissing-project\n")
    result = tp("validate", "--json", str(_input(tmp_path, instance_type="g5.2xlarge")))
    assert result.exit_code == 1
    by_field = {p["field"]: p["message"] for p in _answer(result.stdout)["problems"]}
    assert "missing-project" in by_field["code.requirements"]
    assert "did you mean 'ml.g5.2xlarge'" in by_field["instance_type"]
    assert set(by_field) == {"code.requirements", "instance_type"}


@mock_aws
def test_the_archive_is_uploaded_once(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="artifacts")
    packed = pack_code(_project(tmp_path, ""), tmp_path / "out", requirements=None, target=TARGET, provided={})
    uri = f"s3://artifacts/{code_key('my-run', None, packed.sha256)}"
    assert upload(s3, packed, uri) is True
    assert upload(s3, packed, uri) is False  # the same archive there already: the same code
    stored = s3.head_object(Bucket="artifacts", Key=uri.split("/", 3)[3], ChecksumMode="ENABLED")
    assert stored["ContentLength"] == packed.size and stored["ChecksumSHA256"]
    other = pack_code(
        _project(tmp_path / "b", "beta\n"), tmp_path / "b" / "out", requirements=None, target=TARGET, provided={}
    )
    with pytest.raises(PackError, match="holds another archive than this code's"):
        upload(s3, other, uri)


def test_tp_start_uploads_the_code_and_starts_the_run_that_names_it(
    local: Pipeline, index: Path, tmp_path: Path
) -> None:
    _project(tmp_path, "alpha==1.0\n")
    engineer = _engineer(local)
    boto3.client("iam", region_name="us-east-1").put_role_policy(
        RoleName=REQUESTER.rsplit("/", 1)[-1], PolicyName="UploadCode", PolicyDocument=json.dumps(UPLOADER_POLICY)
    )
    run = json.loads(_input(tmp_path).read_text()) | {
        "dataset": "fsx:///datasets/corpus/",
        "notify": ["alice@example.org"],
        "quality": {"metric": "validation:loss", "max": 3.0},
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    result = tp("start", str(tmp_path / "run.json"), "--name", "own-code-1", "--json", env=engineer)
    assert result.exit_code == 0, result.output
    arn = _answer(result.stdout)["execution_arn"]
    local.run_until(arn, "Approval gate (promotion)", timeout=120)
    (job,) = local.jobs()
    sha256 = local.local.training_requests[job]["HyperParameters"]["code.sha256"]
    artifacts = local.local.environment("Register")["ARTIFACTS_BUCKET"]
    assert f"uploaded s3://{artifacts}/{code_key('my-run', None, sha256)}" in result.output
    assert local.lineage()["code"]["sha256"] == sha256
    # Started again, the same code is there already: not written twice.
    again = tp("start", str(tmp_path / "run.json"), "--name", "own-code-2", "--json", env=engineer)
    assert again.exit_code == 0, again.output
    assert "already uploaded:" in again.output
    local.run_until(_answer(again.stdout)["execution_arn"], "Accept request", timeout=120)

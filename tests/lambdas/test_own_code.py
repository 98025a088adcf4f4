"""Validate's checks of a run's own code (lambdas/validate/code.py): the archive the input names is the run's own,
is the one that was packed, holds the entry point, and carries the wheels its requirements need on the image;
the script's hyperparameters are its own; the request carries the code channel and its description."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract import user_code
from contract.code_archive import IMAGE, pack
from contract.execution_state import TrainingRequest
from contract.layout import code_key
from lambdas.shared.errors import InvalidRequest
from lambdas.validate import code as own_code
from lambdas.validate.code import PackedCode
from lambdas.validate.request import resolve
from lambdas.validate.resume import PreviousRun
from tests.lambdas.test_teams import LIMITS, VISION_SCIENTIST
from tests.lambdas.test_validate_fine_tuning import Folder

ARTIFACTS = LIMITS.artifacts_bucket
DATASETS = LIMITS.datasets_bucket
PYTHON, PLATFORM = LIMITS.code_python, LIMITS.code_platform
WHEEL = "tokenizers-0.21.0-cp39-abi3-manylinux_2_17_x86_64.whl"


def _packed(tmp_path: Path, **record: Any) -> PackedCode:
    """A real archive of a tiny folder (train.py, pkg/cli.py, requirements.txt) and what Validate reads of it."""
    folder = tmp_path / "code"
    for name, text in {
        "train.py": "print(1)\n",
        "pkg/__init__.py": "",
        "pkg/cli.py": "",
        "requirements.txt": "x",
    }.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    packed = pack(folder, tmp_path / "out")
    found = dataclasses.replace(packed.record, **record) if record else packed.record
    return PackedCode(size=packed.size, sha256=packed.sha256, record=found)


def _input(packed: PackedCode, *, team: str | None = None, run_name: str = "vision-run", **code: Any) -> dict[str, Any]:
    sha256 = packed.sha256 or "0" * 64
    described = {
        "source": f"s3://{ARTIFACTS}/{code_key(run_name, team, sha256)}",
        "sha256": sha256,
        "entry_point": "train.py",
        **code,
    }
    run = {
        "run_name": run_name,
        "dataset": f"s3://{DATASETS}/{'vision/' if team else ''}images/",
        "instance_type": "ml.p4d.24xlarge",
        "max_runtime_hours": 2,
        "code": {k: v for k, v in described.items() if v is not None},
        **({"team": team} if team else {}),
    }
    return run


def _resolve(event: dict[str, Any], packed: PackedCode | None, **kwargs: Any) -> dict[str, Any]:
    requested_by = VISION_SCIENTIST if event.get("team") else None
    return resolve(
        event, execution_name="exec-1", limits=LIMITS, requested_by=requested_by, packed_code=packed, **kwargs
    )


def _problems(event: dict[str, Any], packed: PackedCode | None, **kwargs: Any) -> str:
    with pytest.raises(InvalidRequest) as refused:
        _resolve(event, packed, **kwargs)
    return str(refused.value)


def test_a_run_of_its_own_code_carries_the_code_channel_and_the_codes_description(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    event = _input(packed, args=["--epochs", "3", "a b"], retry_on_exit_codes=[75])
    event["hyperparameters"] = {"lr": "warm-up then cosine", "model": "resnet18", "hang.minutes": 30}
    request = _resolve(event, packed)
    uri = event["code"]["source"]
    assert request["channels"][-1] == {
        "ChannelName": user_code.CODE_CHANNEL,
        "DataSource": {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}
        },
        "InputMode": "File",
    }
    # The script's own hyperparameters as given (no trainer judges `lr` or `model`), the launcher's beside them.
    assert request["hyperparameters"] == {
        "lr": "warm-up then cosine",
        "model": "resnet18",
        "hang.minutes": "30",
        "distribution": "ddp",
        user_code.ENTRY_POINT: "train.py",
        user_code.SHA256: packed.sha256,
        user_code.ARGS: '["--epochs", "3", "a b"]',
        user_code.RETRY_ON_EXIT_CODES: "[75]",
    }
    assert user_code.UserCode.from_hyperparameters(request["hyperparameters"]).args == ("--epochs", "3", "a b")
    assert request["code"]["sha256"] == packed.sha256 and request["code"]["size_bytes"] == packed.size
    assert request["code_summary"] == f"train.py --epochs 3 'a b' from {uri} (sha256 {packed.sha256})"
    assert TrainingRequest.parse(request).code is not None
    # A module as the entry point, found as its file in the archive.
    assert _resolve(_input(packed, entry_point="-m pkg.cli"), packed)["code"]["entry_point"] == "-m pkg.cli"


def test_a_runs_hyperparameters_for_its_own_code_are_refused_only_where_they_are_the_platforms(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    event = _input(packed, model="tiny")
    event["model"] = "tiny"
    event["code"].pop("model")
    event["hyperparameters"] = {"code.entry_point": "other.py", "hang.minutes": -1, "distribution": "fsdp"}
    message = _problems(event, packed)
    assert "model: a preset of the platform's trainer" in message
    assert "hyperparameters.code.entry_point: `code.` keys describe your code; set it in `code`" in message
    assert "hang.minutes=-1.0 is invalid" in message  # the launcher's own rule (contract/config.py)
    assert "hyperparameters.distribution: set `distribution` at the top level instead" in message


def test_a_tampered_archive_is_refused(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    event = _input(packed)
    other = dataclasses.replace(packed, sha256=hashlib.sha256(b"another archive").hexdigest())
    message = _problems(event, other)
    assert f"code.sha256: the stored archive's SHA-256 is {other.sha256}, not {packed.sha256}" in message
    assert "it is not the code that was packed" in message


def test_an_entry_point_not_in_the_archive_is_refused(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    message = _problems(_input(packed, entry_point="src/train.py"), packed)
    assert "code.entry_point: 'src/train.py' is not in the packed code; name a script by its path" in message
    assert "pkg/cli.py" not in message  # nothing of the archive is told before the run's team is proven
    assert "code.entry_point: '-m pkg.missing' is not in the packed code" in _problems(
        _input(packed, entry_point="-m pkg.missing"), packed
    )
    # Not a script nor a module: the launcher's own reading refuses it before the archive is looked at.
    assert "name a Python script by its path" in _problems(_input(packed, entry_point="../train.py"), packed)


def test_a_requirement_without_a_wheel_in_the_wheelhouse_is_refused(tmp_path: Path) -> None:
    wheels = {WHEEL: "0" * 64}
    requires = {"tokenizers==0.21": WHEEL, "torch": IMAGE, "numpy<2": "numpy-1.26.4-cp313-none-any.whl"}
    packed = _packed(tmp_path, requirements="requirements.txt", wheels=wheels, python=PYTHON, platform=PLATFORM)
    whole = dataclasses.replace(packed, record=dataclasses.replace(packed.record, requires=requires))
    message = _problems(_input(whole, requirements="requirements.txt"), whole)
    assert "code.requirements: 'numpy<2' has no wheel in the packed wheelhouse" in message
    assert "tokenizers" not in message and "torch" not in message
    # A wheel named for the requirement must be of its project.
    wrong = dataclasses.replace(packed.record, requires={"numpy": WHEEL})
    assert "'numpy' has no wheel" in _problems(
        _input(packed, requirements="requirements.txt"), dataclasses.replace(packed, record=wrong)
    )
    covered = dataclasses.replace(packed.record, requires={"tokenizers==0.21": WHEEL, "torch": IMAGE})
    assert _resolve(_input(packed, requirements="requirements.txt"), dataclasses.replace(packed, record=covered))


def test_wheels_chosen_for_another_python_or_platform_are_refused(tmp_path: Path) -> None:
    packed = _packed(
        tmp_path,
        requirements="requirements.txt",
        wheels={WHEEL: "0" * 64},
        python="3.11",
        platform=PLATFORM,
        requires={"tokenizers": WHEEL},
    )
    message = _problems(_input(packed, requirements="requirements.txt"), packed)
    assert f"the wheels were chosen for Python 3.11 on {PLATFORM}, the image runs Python {PYTHON}" in message
    assert "code.requirements: 'other.txt', but the code was packed with 'requirements.txt'" in _problems(
        _input(packed, requirements="other.txt"), packed
    )


def test_a_run_names_only_its_own_code(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    sha = packed.sha256
    own = f"s3://{ARTIFACTS}/code/teams/vision/vision-run/{sha}.tar.gz"
    assert _resolve(_input(packed, team="vision"), packed)["code"]["uri"] == own
    for elsewhere in (
        f"s3://{ARTIFACTS}/code/teams/language/vision-run/{sha}.tar.gz",  # another team's
        f"s3://{ARTIFACTS}/code/teams/vision/other-run/{sha}.tar.gz",  # another run's of the team
        f"s3://{ARTIFACTS}/code/runs/vision-run/{sha}.tar.gz",  # the prefix of runs of no team
        f"s3://{DATASETS}/code/teams/vision/vision-run/{sha}.tar.gz",  # another bucket
        f"s3://{ARTIFACTS}/code/teams/vision/vision-run/{'1' * 64}.tar.gz",  # named for another digest
    ):
        message = _problems(_input(packed, team="vision", source=elsewhere), packed)
        assert f"code.source {elsewhere!r}: a run reads only its own packed code, {own}" in message


def test_an_archive_over_the_limit_or_stored_without_a_checksum_is_refused(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    large = dataclasses.replace(packed, size=user_code.MAX_ARCHIVE_BYTES + 1, record=None)
    assert "the packed code is 1024 MiB, over the limit of 1024 MiB" in _problems(_input(packed), large)
    unvouched = dataclasses.replace(packed, sha256=None)
    assert "stored without S3's SHA-256 checksum" in _problems(_input(packed), unvouched)


def test_every_problem_is_said_at_once(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    event = _input(packed, entry_point="missing.py", requirements="requirements.txt")
    event["instance_type"] = "ml.p4d.24xlargee"
    event["hyperparameters"] = {"code.args": "[]"}
    message = _problems(event, packed)
    for said in (
        "ml.p4d.24xlargee",
        "code.entry_point: 'missing.py'",
        "code.requirements:",
        "hyperparameters.code.args",
    ):
        assert said in message


def test_a_tuning_run_of_its_own_code_tunes_the_scripts_hyperparameters(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    event = _input(packed)
    event["hyperparameters"] = {"epochs": 3}
    event["tuning"] = {
        "ranges": {
            "learning-rate": {"type": "continuous", "min": 0.0001, "max": 0.1},
            "width": {"type": "categorical", "values": ["a", "b"]},
        },
        "objective": {"metric": "validation:loss"},
        "max_jobs": 4,
    }
    request = _resolve(event, packed)
    ranges = request["tuning"]["config"]["ParameterRanges"]
    assert [r["Name"] for r in ranges["ContinuousParameterRanges"]] == ["learning-rate"]
    assert request["hyperparameters"]["epochs"] == "3" and request["hyperparameters"][user_code.SHA256] == packed.sha256
    event["tuning"]["ranges"] = {
        "hang.minutes": {"type": "integer", "min": 1, "max": 5},
        "epochs": {"type": "integer", "min": 1, "max": 5},
    }
    message = _problems(event, packed)
    assert "tuning.ranges.hang.minutes: a setting of the platform's launcher, not your script's; not tuned" in message
    assert "tuning.ranges.epochs: also fixed in `hyperparameters`" in message


def test_a_checkpoint_is_continued_by_code_of_the_same_kind(tmp_path: Path) -> None:
    packed = _packed(tmp_path)
    trainer_run = resolve(
        {
            "run_name": "vision-run",
            "dataset": f"s3://{DATASETS}/images/",
            "instance_type": "ml.p4d.24xlarge",
            "max_runtime_hours": 1,
        },
        execution_name="old",
        limits=LIMITS,
    )
    previous = PreviousRun(
        "arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:old", TrainingRequest.parse(trainer_run)
    )
    event = {**_input(packed), "resume_from": previous.execution}
    assert "ran the platform's trainer; only code of the same kind resumes it" in _problems(
        event, packed, continues=previous
    )
    own_run = _resolve(
        _input(packed), packed, execution="arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:own"
    )
    mine = PreviousRun(
        "arn:aws:states:us-east-1:123456789012:execution:TrainingPipeline:own", TrainingRequest.parse(own_run)
    )
    assert (
        _resolve(event | {"resume_from": mine.execution}, packed, continues=mine)["resume_from"]["run"]
        == own_run["job_name_base"]
    )


# -- what Validate reads of the stored archive -------------------------------------------------------------------


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=ARTIFACTS)
        yield client


def _upload(s3: Any, tmp_path: Path, run_name: str = "vision-run") -> tuple[dict[str, Any], Any]:
    folder = tmp_path / "code"
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text("print(1)\n")
    packed = pack(folder, tmp_path / "out")
    key = code_key(run_name, None, packed.sha256)
    checksum = base64.b64encode(bytes.fromhex(packed.sha256)).decode()
    s3.put_object(
        Bucket=ARTIFACTS, Key=key, Body=packed.path.read_bytes(), ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum
    )
    event = _input(PackedCode(packed.size, packed.sha256, packed.record), run_name=run_name)
    return event, packed


def test_validate_reads_the_stored_archives_size_digest_and_record(s3: Any, tmp_path: Path) -> None:
    event, packed = _upload(s3, tmp_path)
    found = own_code.find(event, artifacts_bucket=ARTIFACTS, s3=s3)
    assert found == PackedCode(packed.size, packed.sha256, packed.record)
    assert _resolve(event, found)["code"]["size_bytes"] == packed.size


def test_validate_finds_a_missing_or_replaced_archive(s3: Any, tmp_path: Path) -> None:
    event, packed = _upload(s3, tmp_path)
    # Replaced after it was packed: S3's checksum is the new content's.
    key = code_key("vision-run", None, packed.sha256)
    s3.put_object(Bucket=ARTIFACTS, Key=key, Body=b"print('something else')", ChecksumAlgorithm="SHA256")
    replaced = own_code.find(event, artifacts_bucket=ARTIFACTS, s3=s3)
    assert replaced is not None and replaced.sha256 == hashlib.sha256(b"print('something else')").hexdigest()
    assert "it is not the code that was packed" in _problems(event, replaced)
    # Stored without a checksum: nothing vouches for it.
    s3.put_object(Bucket=ARTIFACTS, Key=key, Body=packed.path.read_bytes())
    assert "stored without S3's SHA-256" in _problems(event, own_code.find(event, artifacts_bucket=ARTIFACTS, s3=s3))
    s3.delete_object(Bucket=ARTIFACTS, Key=key)
    with pytest.raises(own_code.CodeNotFoundError, match=f"there is no packed code at {event['code']['source']}"):
        own_code.find(event, artifacts_bucket=ARTIFACTS, s3=s3)


def test_validate_never_reads_code_outside_the_runs_own_prefix(tmp_path: Path) -> None:
    class Refuses:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"S3 {name} called for code that is not the run's own")

    packed = _packed(tmp_path)
    elsewhere = _input(packed, source=f"s3://{ARTIFACTS}/code/teams/language/vision-run/{packed.sha256}.tar.gz")
    assert own_code.find(elsewhere, artifacts_bucket=ARTIFACTS, s3=Refuses()) is None
    assert own_code.find({"run_name": "x"}, artifacts_bucket=ARTIFACTS, s3=Refuses()) is None
    assert own_code.find(json.loads('{"code": {"source": 1}}'), artifacts_bucket=ARTIFACTS, s3=Refuses()) is None


def test_a_run_of_its_own_code_reads_its_dataset_its_own_way(tmp_path: Path) -> None:
    """JSONL records in its dataset are the script's to read, not fine-tuning records asking for init_from."""
    packed = _packed(tmp_path)
    records = Folder({"stories.jsonl": b'{"text": "The cat found a red kite."}\n'})
    request = _resolve(_input(packed), packed, folder_at=lambda _uri: records)
    assert request["base_model"] is None and request["code"]["entry_point"] == "train.py"

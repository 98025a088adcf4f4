"""`make demo` of a run's own code: the folder packed and uploaded as `tp start` does, its data made by its own
`make_data.py`; the examples under examples/own-code/ run end to end through the image's launcher, one of them
interrupted and resumed."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from contract.code_archive import read
from contract.layout import code_key, split_s3_uri
from lambdas.validate.request import resolve
from localrun.aws.cfn import REGION
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import ScriptedTraining
from localrun.demo import own_code
from tests.conftest import APPROVER, OWN_CODE_EXAMPLES, RUN_EMAIL, hosts_left_running
from tests.lambdas.test_handlers import LIMITS
from tests.pipeline.conftest import COMPLETED, Pipeline
from tools.code_pack import at

# The launcher's own-code path and the SDK, which the examples run through.
RUNTIME = importlib.util.find_spec("training.sdk") is not None and all(
    (path.parent / json.loads(path.read_text())["code"]["source"]).is_dir() for path in OWN_CODE_EXAMPLES
)


@pytest.mark.parametrize("example", OWN_CODE_EXAMPLES, ids=lambda p: p.stem)
def test_the_own_code_examples_are_valid_inputs(example: Path) -> None:
    """Everything but the archive, which only packing makes (tests/tools/test_code_pack.py checks `tp`'s)."""
    execution_input = at(json.loads(example.read_text()), LIMITS.artifacts_bucket, "0" * 64)
    request = resolve(execution_input, execution_name="exec-1", limits=LIMITS)
    assert request["code"]["entry_point"] == "train.py" and request["channels"][-1]["ChannelName"] == "code"


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    (folder / "make_data.py").write_text(
        "import argparse, pathlib\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--out', type=pathlib.Path)\n"
        "out = parser.parse_args().out\n"
        "(out / 'part-0').mkdir(parents=True)\n"
        "(out / 'part-0' / 'rows.jsonl').write_text('{}\\n')\n"
    )
    return folder


def test_the_demo_packs_uploads_and_seeds_a_local_folder_as_tp_does(platform: Any, tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    execution_input = {
        "run_name": "my-code",
        "dataset": "fsx:///datasets/my-data/",
        "instance_type": "ml.m5.xlarge",
        "max_runtime_hours": 1,
        "notify": [RUN_EMAIL],
        "code": {"source": "my_project", "entry_point": "train.py", "args": ["--steps", "3"]},
    }
    training = ScriptedTraining(scripts=[[COMPLETED]])
    with LocalPlatform(Path(platform.assembly.directory), training=training) as local:
        pipeline = Pipeline(local, training)
        artifacts = local.environment("Validate")["ARTIFACTS_BUCKET"]
        datasets = local.environment("Validate")["DATASETS_BUCKET"]
        assert own_code.local_folder(execution_input, tmp_path) == folder
        replaced = own_code.run_here(local)
        assert local.environment("Validate")["CODE_PYTHON"] == own_code.local_target().python
        assert replaced.requested.startswith("Python 3.13 on manylinux_2_35_x86_64")  # the settings' image
        ready = own_code.upload(execution_input, folder, tmp_path / "packed", artifacts_bucket=artifacts, say=print)
        described = own_code.seed(ready, folder, tmp_path, datasets_bucket=datasets, say=print)
        assert described == "1 files made by my_project/make_data.py"
        sha256 = ready["code"]["sha256"]
        assert ready["code"]["source"] == f"s3://{artifacts}/{code_key('my-code', None, sha256)}"
        s3 = boto3.client("s3", region_name=REGION)
        stored = tmp_path / "stored.tar.gz"
        s3.download_file(*split_s3_uri(ready["code"]["source"]), str(stored))
        assert set(read(stored, sha256=sha256).files) == {"train.py", "make_data.py"}
        assert s3.get_object(Bucket=datasets, Key="my-data/part-0/rows.jsonl")["Body"].read() == b"{}\n"

        arn = pipeline.start(ready)
        pipeline.run_until(arn, "Approval gate (promotion)", timeout=120)
        (job,) = pipeline.jobs()
        assert local.training_requests[job]["HyperParameters"]["code.sha256"] == sha256
        assert pipeline.lineage()["code"]["sha256"] == sha256


def test_the_local_image_is_this_interpreter() -> None:
    target = own_code.local_target()
    assert target.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "torch" in own_code.local_image()  # what the local hosts import is left out of the wheels


# -- the examples end to end, through the image's launcher ------------------------------------------------------


def _demo(platform: Any, tmp_path: Path, example: str, **options: Any) -> Any:
    from localrun.demo.cli import run_demo

    path = next(p for p in OWN_CODE_EXAMPLES if p.stem == example)
    outcome = run_demo(
        execution_input={"notify": [RUN_EMAIL], **json.loads(path.read_text())},  # the fixture's settings subscribe it
        out=tmp_path,
        assembly=Path(platform.assembly.directory),
        auto_approve=True,
        reject=None,
        approver=APPROVER,
        wait_seconds=1.0,
        input_dir=path.parent,
        **{"spot_interrupt": False, **options},
    )
    assert hosts_left_running(tmp_path) == []
    return outcome


@pytest.mark.slow
@pytest.mark.skipif(not RUNTIME, reason="the image's launcher does not run a run's own code in this tree")
def test_the_vision_example_is_interrupted_and_resumes_from_its_recorded_checkpoint(
    platform: Any, tmp_path: Path
) -> None:
    outcome = _demo(platform, tmp_path, "own-code-vision", spot_interrupt=True)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    (job,) = outcome.job_names
    log = (outcome.run_dir / "jobs" / job / "logs" / "algo-1-gen1.log").read_text()
    resumed = re.search(r"resumed from checkpoint step-(\d+)", log)
    assert resumed is not None
    steps = [int(s) for s in re.findall(r"\bstep=(\d+) loss=", log)]
    assert steps and min(steps) > int(resumed.group(1))  # no step before the checkpoint is trained again
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert lineage["cluster"]["interruptions"] == 1 and lineage["code"]["entry_point"] == "train.py"


@pytest.mark.slow
@pytest.mark.skipif(not RUNTIME, reason="the image's launcher does not run a run's own code in this tree")
def test_the_hugging_face_example_trains_with_its_requirements(platform: Any, tmp_path: Path) -> None:
    outcome = _demo(platform, tmp_path, "own-code-hf")
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert lineage["code"]["requirements"] == "requirements.txt"
    assert lineage["metrics"]["train:loss"] <= 5.5

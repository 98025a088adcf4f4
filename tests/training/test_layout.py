"""The run layout and the container's environment names: one torch-free module every layer imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract import layout

REPO = Path(__file__).resolve().parents[2]


def test_a_step_directory_is_named_and_parsed_back() -> None:
    assert layout.step_dir(12) == "step-12"
    assert layout.step_of(layout.step_dir(12)) == 12
    for other in ("step-", "step-x", "step-12.tmp", "prefix-step-12", layout.MANIFEST):
        assert layout.step_of(other) is None


def test_the_manifest_glob_finds_committed_checkpoints_only(tmp_path: Path) -> None:
    for step, files in ((4, ("__0_0.distcp", layout.MANIFEST)), (8, ("__0_0.distcp",))):
        directory = tmp_path / layout.step_dir(step)
        directory.mkdir()
        for name in files:
            (directory / name).write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.glob(layout.MANIFEST_GLOB)] == ["step-4/manifest.json"]


def test_run_prefixes() -> None:
    assert layout.run_checkpoints("demo-1a2b") == "runs/demo-1a2b/checkpoints/"
    assert layout.run_output("demo-1a2b-2") == "runs/demo-1a2b-2/output/"
    assert layout.run_tensorboard("demo-1a2b") == "runs/demo-1a2b/tensorboard/"
    assert layout.run_lineage("demo-1a2b") == "runs/demo-1a2b/lineage/"
    assert layout.run_ledger("demo-1a2b") == "runs/demo-1a2b/lineage/checkpoints/"
    assert all(
        prefix.startswith(layout.RUNS)
        for prefix in (layout.run_checkpoints("x"), layout.run_output("x"), layout.PROFILER)
    )


def test_a_job_belongs_to_the_run_its_name_starts_with() -> None:
    assert layout.run_of("demo-1a2b3c4d-2") == "demo-1a2b3c4d"
    assert layout.run_checkpoints(layout.run_of("demo-1a2b3c4d-1")) == layout.run_checkpoints("demo-1a2b3c4d")


def test_the_stacks_templates_and_iam_patterns() -> None:
    assert layout.CHECKPOINTS_FORMAT == "runs/{}/checkpoints/"
    assert layout.OUTPUT_FORMAT == "runs/{}/output/"
    assert layout.TENSORBOARD_FORMAT == "runs/{}/tensorboard/"
    assert layout.CHECKPOINTS_FORMAT.format("r") == layout.run_checkpoints("r")
    assert layout.ANY_RUN == "runs/*"
    assert layout.ANY_CHECKPOINT == "runs/*/checkpoints/*"
    assert layout.ANY_OUTPUT == "runs/*/output/*"
    assert layout.ANY_LINEAGE == "runs/*/lineage/*"
    assert layout.PROFILER == "runs/profiler/"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/runs/r/checkpoints/", ("bucket", "runs/r/checkpoints/")),
        ("s3://bucket/key", ("bucket", "key")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket//double", ("bucket", "/double")),
    ],
)
def test_an_s3_uri_splits_into_bucket_and_key(uri: str, expected: tuple[str, str]) -> None:
    assert layout.split_s3_uri(uri) == expected


@pytest.mark.parametrize("uri", ["bucket/key", "fsx:///datasets/x/", "https://bucket.s3.amazonaws.com/k", "s3://", ""])
def test_anything_but_an_s3_uri_is_refused_by_name(uri: str) -> None:
    with pytest.raises(ValueError, match=r"not an S3 URI: .*expected s3://<bucket>/<key>"):
        layout.split_s3_uri(uri)


def test_every_environment_name_is_distinct_and_the_pipelines_spelling() -> None:
    names = {k: v for k, v in vars(layout).items() if k.endswith("_ENV")}
    assert len(set(names.values())) == len(names)
    assert names["EFA_ENV"] == "TRAINING_EFA"
    assert names["CHECKPOINTS_ENV"] == "TRAINING_CHECKPOINTS_S3"
    assert names["NODE_INDEX_ENV"] == "AWS_BATCH_JOB_NODE_INDEX"
    assert layout.PREFLIGHT_FAILED == "PreflightFailed"


def test_the_module_imports_without_torch() -> None:
    code = "import contract.layout, sys; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr

"""The examples of a run's own code (examples/own-code/), each run through the launcher with 2 processes on CPU:
to completion, and with the SDK stopped by SIGTERM after a checkpoint and resumed exactly (the same loss at the
same step as an uninterrupted run), from the checkpoint the run's ledger recorded."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from own_code import EXAMPLES, code_tree, launch, launcher_env, losses
from training_helpers import run_until

from contract.layout import LEDGER_CHANNEL, MANIFEST, step_dir, step_of
from contract.ledger import Record
from training.sagemaker_contract import Paths

pytestmark = pytest.mark.slow

VISION = {"max-steps": "8", "batch-size": "4", "checkpoint-every": "3"}
"""32 images, 2 ranks x 4 a batch: 4 steps an epoch, so a resume at step 3 or later crosses an epoch's end."""
LANGUAGE = {"max-steps": "8", "batch-size": "4", "checkpoint-every": "3"}
TABLE = {"max-steps": "8", "batch-size": "4", "checkpoint-every": "3"}
"""32 rows, 2 ranks x 4 a batch: 4 steps an epoch, so the resume at step 3 is within an epoch and crosses its end."""


def _made(factory: pytest.TempPathFactory, example: str, out: str, *args: str) -> Path:
    """A `train` channel written by the example's make_data.py (`out`: where in the folder; "" the folder itself)."""
    folder = factory.mktemp(example) / "train"
    make = EXAMPLES / example / "make_data.py"
    subprocess.run([sys.executable, str(make), "--out", str(folder / out), *args], check=True)
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(tmp_path_factory, "vision-ddp", "", "--per-class", "8")


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(tmp_path_factory, "hf-causal-lm", "stories.jsonl", "--lines", "200")


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _made(tmp_path_factory, "lightning-tabular", "points.csv", "--rows", "32")


def _record_only(paths: Paths, step: int) -> None:
    """The run's ledger, as the platform delivers it, recording the checkpoint of `step` alone."""
    manifest = (paths.checkpoints / step_dir(step) / MANIFEST).read_bytes()
    record = Record(f"{step_dir(step)}/", step, hashlib.sha256(manifest).hexdigest(), "job-1", "exec", "2026-12-02")
    paths.channel(LEDGER_CHANNEL).mkdir(parents=True, exist_ok=True)
    (paths.channel(LEDGER_CHANNEL) / f"{step_dir(step)}.json").write_text(json.dumps(record.__dict__))


def _interrupted_and_resumed(root: Path, paths: Paths) -> tuple[str, str]:
    """SIGTERM once the checkpoint of step 3 is committed; then the job again, with a ledger that records step 3
    alone (not the checkpoint the stop wrote: the resume must take the ledger's word)."""

    def stop(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGTERM)

    command = [sys.executable, "-m", "training.launcher", "train"]
    status, first = run_until(command, launcher_env(root), r"^step=3 phases ", stop, timeout=300)
    assert status == 0, first[-3000:]
    # The stop's checkpoint is of the last logged step or of the one in flight when the script saw the stop (a
    # Trainer saves the step it ends on, whose loss it never logs).
    saved = max(step for entry in paths.checkpoints.iterdir() if (step := step_of(entry.name)) is not None)
    assert saved >= max(3, *losses(first)), first[-2000:]
    _record_only(paths, 3)
    second = launch(root)
    assert second.returncode == 0, second.stdout[-3000:]
    return first, second.stdout


def _assert_resumed_exactly(reference: str, first: str, second: str) -> None:
    expected = losses(reference)
    assert sorted(expected) == list(range(1, 9))
    assert {step: expected[step] for step in losses(first)} == losses(first)
    resumed = losses(second)
    assert sorted(resumed) == list(range(4, 9))  # from the ledger's step 3, whatever the stop saved after it
    assert resumed == {step: expected[step] for step in resumed}
    assert "resumed from checkpoint step-3" in second


def test_the_vision_example_runs_without_the_sdk(tmp_path: Path, images: Path) -> None:
    hps = {**VISION, "code.args": '["--no-sdk"]'}
    paths = code_tree(tmp_path, EXAMPLES / "vision-ddp", hps, channels={"train": images})
    result = launch(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "step 8 loss" in result.stdout and (paths.model / "model.pt").is_file()
    assert not paths.checkpoints.exists()


def _resumes_exactly(tmp_path: Path, example: str, hyperparameters: dict[str, str], data: Path) -> Paths:
    """The example uninterrupted, then stopped and resumed (`_interrupted_and_resumed`); its tree."""
    code_tree(tmp_path / "reference", EXAMPLES / example, hyperparameters, channels={"train": data})
    reference = launch(tmp_path / "reference")
    assert reference.returncode == 0, reference.stdout[-3000:]
    paths = code_tree(tmp_path / "run", EXAMPLES / example, hyperparameters, channels={"train": data})
    first, second = _interrupted_and_resumed(tmp_path / "run", paths)
    _assert_resumed_exactly(reference.stdout, first, second)
    return paths


def test_the_vision_example_resumes_exactly_after_a_stop(tmp_path: Path, images: Path) -> None:
    assert (_resumes_exactly(tmp_path, "vision-ddp", VISION, images).model / "model.pt").is_file()


def test_the_language_example_resumes_exactly_after_a_stop(tmp_path: Path, stories: Path) -> None:
    assert (_resumes_exactly(tmp_path, "hf-causal-lm", LANGUAGE, stories).model / "model.safetensors").is_file()


def test_the_lightning_example_resumes_exactly_after_a_stop(tmp_path: Path, points: Path) -> None:
    assert (_resumes_exactly(tmp_path, "lightning-tabular", TABLE, points).model / "model.pt").is_file()

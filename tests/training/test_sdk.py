"""The SDK a run's own script may call (training/sdk): step reports, the metrics line, the stop, checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import REPO, clean_env

from contract.hang import newest_step
from contract.metrics import parse_metrics

STEPS = """
import os, signal
from training import sdk
for step in (1, 2, 3):
    sdk.report_step(step, loss=2.5 / step, lr=1e-3, grad_norm=0.5, accuracy=0.25 * step)
sdk.report_validation(3, 1.75)
print("stop before SIGTERM:", sdk.should_stop())
os.kill(os.getpid(), signal.SIGTERM)
print("stop after SIGTERM:", sdk.should_stop())
"""

CHECKPOINTS = """
import json, random, sys
import numpy as np
import torch
from training import sdk

torch.manual_seed(0)
random.seed(0)
np.random.seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
progress = {"epoch": 0}
checkpoints = sdk.Checkpointer(model, optimizer, scheduler, extra=progress)
start = checkpoints.resume()
for step in range(start + 1, int(sys.argv[1]) + 1):
    noise = random.random() + float(np.random.rand())  # each step draws from Python's and NumPy's streams too
    (model(torch.randn(3, 4)) * noise).square().mean().backward()
    optimizer.step(); optimizer.zero_grad(); scheduler.step()
    progress["epoch"] = step // 2
    if step % 2 == 0:
        checkpoints.save(step)
draws = [random.random(), float(np.random.rand()), float(torch.rand(1))]
print("RESULT", json.dumps({"start": start, "epoch": progress["epoch"], "lr": scheduler.get_last_lr()[0],
      "weight": model.weight.sum().item(), "draws": draws}))
"""


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )


def test_importing_the_sdk_imports_no_torch() -> None:
    code = "import sys, training.sdk, training.sdk.checkpoints as c; print('torch' in sys.modules)"
    done = _python("import sys, training.sdk; print('torch' in sys.modules)", clean_env(REPO))
    assert done.stdout.strip() == "False", done.stderr
    assert _python(code, clean_env(REPO)).stdout.strip() == "True"  # the checkpoints do need it


def test_steps_reach_the_hang_check_and_rank_0_prints_the_metrics_sagemaker_reads(tmp_path: Path) -> None:
    env = clean_env(tmp_path, TRAINING_HEARTBEAT_DIR=str(tmp_path / "beats"), RANK="0")
    env["TRAINING_CHECKPOINT_DIR"] = str(tmp_path / "checkpoints")
    done = _python(STEPS, env)
    assert done.returncode == 0, done.stderr
    assert newest_step(tmp_path / "beats") == 3
    found = parse_metrics(done.stdout)
    assert found["train:loss"] == [2.5, 1.25, 2.5 / 3] and found["train:lr"] == [1e-3] * 3
    assert found["train:grad_norm"] == [0.5] * 3 and found["validation:loss"] == [1.75]
    assert "step=3 loss=0.8333333333333334 lr=0.001 grad_norm=0.5 accuracy=0.75" in done.stdout
    assert "stop before SIGTERM: False" in done.stdout and "stop after SIGTERM: True" in done.stdout
    (record,) = (tmp_path / "checkpoints" / "progress").glob("*.json")  # rank 0's goodput record, at exit
    assert json.loads(record.read_text())["step"] == 3
    quiet = _python(STEPS, {**env, "RANK": "1", "TRAINING_HEARTBEAT_DIR": str(tmp_path / "beats1")})
    assert quiet.returncode == 0 and "step=" not in quiet.stdout and newest_step(tmp_path / "beats1") == 3


@pytest.mark.slow
def test_a_script_resumes_its_model_optimizer_schedule_values_and_random_streams_exactly(tmp_path: Path) -> None:
    env = clean_env(tmp_path, TRAINING_CHECKPOINT_DIR=str(tmp_path / "checkpoints"))

    def result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        return dict(json.loads(line.removeprefix("RESULT ")))

    straight = result(_python(CHECKPOINTS, {**env, "TRAINING_CHECKPOINT_DIR": str(tmp_path / "straight")}, "6"))
    first = result(_python(CHECKPOINTS, env, "4"))
    assert first["start"] == 0 and sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == [
        "step-2",
        "step-4",
    ]
    resumed = result(_python(CHECKPOINTS, env, "6"))
    assert resumed["start"] == 4
    assert resumed == {**straight, "start": 4}  # weights, schedule, own values and every random stream
    # Only what the run's ledger records is loaded: with step-2 alone recorded, the resume starts there.
    manifest = (tmp_path / "checkpoints" / "step-2" / "manifest.json").read_bytes()
    ledger = Path(tmp_path / "input" / "data" / "ledger")
    ledger.mkdir(parents=True)
    record = {"checkpoint": "step-2/", "step": 2, "manifest_sha256": hashlib.sha256(manifest).hexdigest()}
    (ledger / "step-2.json").write_text(json.dumps({**record, "job": "j", "execution": "e", "recorded_at": "now"}))
    again = _python(CHECKPOINTS, env, "6")
    assert result(again) == {**straight, "start": 2}
    assert "the run's ledger does not record it" in again.stderr
    assert os.path.isdir(tmp_path / "checkpoints" / "step-6")


def test_a_resumed_scripts_steps_up_to_an_earlier_starts_furthest_are_rework_then_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contract.goodput import ProgressWriter, local_records
    from training import sdk
    from training.sdk import run as sdk_run

    monkeypatch.setenv("TRAINING_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    ProgressWriter(tmp_path, job="earlier-start", started=0.0, first_step=0).write(8, {})  # it reached step 8
    run = sdk_run.Run()
    monkeypatch.setattr(sdk_run, "_RUN", [run])
    run.resumed(5)  # from the checkpoint of step 5: steps 6, 7 and 8 are done again
    phases = []
    for step in range(6, 11):
        sdk.report_step(step)
        phases.append(run.clock._phase)
    assert phases == ["rework", "rework", "rework", "train", "train"]
    assert run.progress is not None
    run.write_progress()
    (record,) = [r for r in local_records(tmp_path) if r.name == run.progress.path.name]
    assert (record.first_step, record.step) == (5, 10)

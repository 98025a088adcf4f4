"""Real multi-process jobs on CPU (gloo): DDP/FSDP training, kill -9 and SIGTERM resumes, two-host launch."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from statistics import mean

import pytest
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from training_helpers import (
    TINY_JOB,
    clean_env,
    free_port,
    kill_tree,
    launcher,
    make_opt_ml,
    run,
    run_until,
    step_losses,
    torchrun,
    val_losses,
)

from contract.layout import MANIFEST
from contract.metrics import METRIC_DEFINITIONS, parse_metrics
from training.checkpoint import committed_steps
from training.launcher import EXIT_FAILED
from training.sagemaker_contract import Paths

pytestmark = pytest.mark.slow
MAX_STEPS = int(TINY_JOB["max_steps"])


def _assert_ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def ddp_reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, str]:
    """The uninterrupted 2-process DDP run every resume is compared with."""
    root = tmp_path_factory.mktemp("ddp")
    paths = make_opt_ml(root, TINY_JOB, corpus=corpus)
    return paths, _assert_ok(run(torchrun(2), clean_env(root)))


def test_ddp_two_processes_learn_and_report_every_metric(ddp_reference: tuple[Paths, str]) -> None:
    paths, log = ddp_reference
    losses = step_losses(log)
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))
    assert mean(losses[s] for s in range(51, 61)) < mean(losses[s] for s in range(1, 11)) - 1.5
    assert val_losses(log)[MAX_STEPS] < 3.3
    # SageMaker's regexes, applied to the real log, see every step and every metric.
    metrics = parse_metrics(log)
    assert {d["Name"] for d in METRIC_DEFINITIONS} == set(metrics)
    assert metrics["train:loss"] == [losses[s] for s in range(1, MAX_STEPS + 1)]
    assert metrics["validation:loss"] == [val_losses(log)[30], val_losses(log)[MAX_STEPS]]
    assert len(metrics["train:mfu"]) == MAX_STEPS and all(v > 0 for v in metrics["train:mfu"])
    assert "2 data-parallel processes x 4 sequences" in log
    weights = load_file(str(paths.model / "model.safetensors"))
    assert weights["wte.weight"].shape == (320, 64)
    assert json.loads((paths.model / "config.json").read_text())["metrics"]["validation:loss"] == val_losses(log)[60]
    assert committed_steps(paths.checkpoints) == [60, 50, 40]
    assert not paths.failure.exists()


def test_kill_9_then_resume_logs_exactly_the_uninterrupted_losses(
    ddp_reference: tuple[Paths, str], corpus: Path, tmp_path: Path
) -> None:
    paths = make_opt_ml(tmp_path, TINY_JOB, corpus=corpus)
    status, killed_log = run_until(torchrun(2), clean_env(tmp_path), r"\bstep=25 loss=", lambda p: kill_tree(p.pid))
    assert status == -signal.SIGKILL
    last_before = max(step_losses(killed_log))
    assert 25 <= last_before < MAX_STEPS
    assert not paths.model.exists()
    time.sleep(0.5)  # let the killed workers' file handles go

    log = _assert_ok(run(torchrun(2), clean_env(tmp_path)))
    resumed = step_losses(log)
    first = min(resumed)
    assert 21 <= first <= last_before + 1, "resumed from the newest complete checkpoint"
    assert f"resumed from checkpoint step-{first - 1}" in log
    reference = step_losses(ddp_reference[1])
    assert resumed == {s: v for s, v in reference.items() if s >= first}
    assert step_losses(killed_log) == {s: reference[s] for s in step_losses(killed_log)}
    assert val_losses(log)[MAX_STEPS] == val_losses(ddp_reference[1])[MAX_STEPS]


def test_sigterm_to_the_launcher_checkpoints_exits_0_and_resumes_exactly(
    ddp_reference: tuple[Paths, str], corpus: Path, tmp_path: Path
) -> None:
    paths = make_opt_ml(tmp_path, TINY_JOB, corpus=corpus)
    env = clean_env(
        tmp_path, TRAINING_NPROC_PER_NODE="2", TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=str(free_port())
    )
    status, log = run_until(launcher(), env, r"\bstep=25 loss=", lambda p: p.send_signal(signal.SIGTERM))
    assert status == 0, log[-3000:]
    stopped_at = max(step_losses(log))
    assert f"stopped by signal at step {stopped_at}: checkpoint step-{stopped_at} is committed" in log
    assert "workers checkpointed and exited after SIGTERM" in log
    assert (paths.checkpoints / f"step-{stopped_at}" / MANIFEST).exists()
    assert not paths.failure.exists() and not paths.model.exists()

    env["TRAINING_MASTER_PORT"] = str(free_port())
    log = _assert_ok(run(launcher(), env))
    reference = step_losses(ddp_reference[1])
    assert step_losses(log) == {s: v for s, v in reference.items() if s > stopped_at}
    assert (paths.model / "model.safetensors").exists()


@pytest.fixture(scope="module")
def fsdp_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, str]:
    root = tmp_path_factory.mktemp("fsdp")
    job = {**TINY_JOB, "distribution": "fsdp", "max_steps": "40", "train.global_batch_size": "8"}
    paths = make_opt_ml(root, job, corpus=corpus)
    return paths, _assert_ok(run(torchrun(2), clean_env(root)))


def test_fsdp_two_processes_learn_and_shard_the_checkpoint(fsdp_run: tuple[Paths, str]) -> None:
    paths, log = fsdp_run
    losses = step_losses(log)
    assert sorted(losses) == list(range(1, 41))
    assert mean(losses[s] for s in range(31, 41)) < mean(losses[s] for s in range(1, 11)) - 1.0
    assert val_losses(log)[40] < 3.5
    # Each rank wrote its own shard of parameters and optimizer state, in several files (one per writer thread).
    files = sorted((paths.checkpoints / "step-40").glob("*.distcp"))
    per_rank = {rank: [p for p in files if p.name.startswith(f"__{rank}_")] for rank in (0, 1)}
    assert len(files) == sum(len(mine) for mine in per_rank.values())
    assert all(len(mine) >= 2 and sum(p.stat().st_size for p in mine) > 100_000 for mine in per_rank.values())
    full = load_file(str(paths.model / "model.safetensors"))
    assert full["wte.weight"].shape == (320, 64)
    saved = FileSystemReader(str(paths.checkpoints / "step-40")).read_metadata().state_dict_metadata
    assert "model.wte.weight" in saved and "model.lm_head.weight" not in saved  # a tied weight's shards, once


def test_two_to_one_process_resume_after_a_corrupt_newest_checkpoint(
    fsdp_run: tuple[Paths, str], tmp_path: Path
) -> None:
    reference_paths, reference_log = fsdp_run
    root = tmp_path / "ml"
    shutil.copytree(reference_paths.root, root)
    shutil.rmtree(root / "model")
    paths = Paths(root)
    shard = paths.checkpoints / "step-40" / "__1_0.distcp"
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    log = _assert_ok(run(torchrun(1), clean_env(root)))
    assert "skipping checkpoint step-40: rank 0: step-40: __1_0.distcp is truncated" in log
    assert "checkpoint step-30 was written by 2 processes, resuming on 1" in log
    assert "1 data-parallel processes x 4 sequences x 2 accumulation" in log
    reference = step_losses(reference_log)
    resumed = step_losses(log)
    assert sorted(resumed) == list(range(31, 41))
    for step, loss in resumed.items():  # another reduction order: equal up to float rounding
        assert loss == pytest.approx(reference[step], rel=1e-5)
    assert val_losses(log)[40] == pytest.approx(val_losses(reference_log)[40], rel=1e-5)


def test_two_hosts_on_localhost_form_one_job_that_trains_and_writes_the_model(corpus: Path, tmp_path: Path) -> None:
    job = {**TINY_JOB, "max_steps": "20", "eval.interval_steps": "0"}
    hosts = ("algo-1", "algo-2")
    port = str(free_port())
    trees = {host: make_opt_ml(tmp_path / host, job, corpus=corpus, hosts=hosts, current_host=host) for host in hosts}
    procs = {
        host: subprocess.Popen(
            launcher(),
            env=clean_env(paths.root, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host, paths in trees.items()
    }
    try:
        logs = {host: proc.communicate(timeout=150)[0] for host, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    assert {host: proc.returncode for host, proc in procs.items()} == {"algo-1": 0, "algo-2": 0}, logs
    assert "host algo-2 is node 1 of 2" in logs["algo-2"]
    assert "rank 0/2" in logs["algo-1"]
    # Rank 0 (on the first host) logs metrics and writes the model; both hosts hold checkpoint shards.
    metrics = parse_metrics(logs["algo-1"])
    assert len(metrics["train:loss"]) == 20 and metrics["train:loss"][-1] < metrics["train:loss"][0] - 1.0
    assert len(metrics["validation:loss"]) == 1
    assert parse_metrics(logs["algo-2"]) == {}
    model = trees["algo-1"].model
    assert set(load_file(str(model / "model.safetensors"))) >= {"wte.weight", "wpe.weight", "ln_f.weight"}
    assert json.loads((model / "config.json").read_text())["model_args"]["arch"] == "gpt2"
    assert not trees["algo-2"].model.exists()
    assert (trees["algo-1"].checkpoints / "step-20" / MANIFEST).exists()
    assert (trees["algo-2"].checkpoints / "step-20" / "__1_0.distcp").exists()
    assert not any(paths.failure.exists() for paths in trees.values())


def test_worker_failure_reason_reaches_the_failure_file(corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {**TINY_JOB, "model.vocab_size": "100"}, corpus=corpus)
    env = clean_env(tmp_path, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=str(free_port()))
    result = run(launcher(), env)
    assert result.returncode == EXIT_FAILED
    lines = paths.failure.read_text().splitlines()
    assert lines[0].startswith("DataRangeError: token id ")
    assert "does not fit model.vocab_size=100" in lines[0]
    assert 1 < len(lines) <= 18, "a short traceback tail, not the whole log"

"""The benchmark commands run the real code paths and report their rows (figures go to BENCHMARKS.md)."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist
from training_helpers import free_port

from training.bench import bench_loader, bench_preflight, bench_train


def test_loader_row() -> None:
    row = bench_loader(seq_len=128, batch=8, tokens=400_000, batches=20, world_size=2)
    assert row["batch"] == 8 and row["seq"] == 128
    assert row["tokens_per_sec"] > 0


@pytest.mark.slow
def test_train_row_uses_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        row = bench_train({"model": "tiny", "seq_len": "64", "batch_size": "4"}, warmup=2, steps=3, tokens=100_000)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
            os.environ.pop(key, None)
    assert (row["model"], row["batch"], row["seq"]) == ("tiny", 4, 64)
    assert row["tokens_per_sec"] > 0 and row["step_ms"] > 0
    assert row["mfu"] == "n/a"  # no peak is known for a CPU


@pytest.mark.slow
def test_preflight_row_times_the_launchers_check_on_two_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("TRAINING_EXPECTED_GPUS", "TRAINING_MIN_BUSBW_GBPS", "TRAINING_EFA"):
        monkeypatch.delenv(key, raising=False)
    row = bench_preflight(hosts=2, nproc=1, repeats=1)
    assert (row["check"], row["hosts"], row["procs_per_host"]) == ("preflight", 2, 1)
    # The workers report their own time, which the launcher's wait includes.
    assert 0 < row["in_workers_s"] < row["wall_s"]

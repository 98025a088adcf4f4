"""The benchmark commands run the real code paths and report their rows (figures go to BENCHMARKS.md)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from training_helpers import free_port

from contract.config import from_hyperparameters
from training import bench, bench_peer, checkpoint
from training.bench import (
    SINGLE_PROCESS_ENV,
    _bracketed,
    _DiskProbe,
    bench_checkpoint,
    bench_loader,
    bench_startup,
    bench_stragglers,
    bench_train,
)
from training.data import read_shard
from training.direct_io import CHUNK


@contextmanager
def _alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment of a process that is its own world: `bench_train` and `bench_checkpoint` start one."""
    for key in SINGLE_PROCESS_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    for key in SINGLE_PROCESS_ENV:
        os.environ.pop(key, None)


@pytest.fixture
def lone_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with _alone(monkeypatch):
        yield


def test_loader_row() -> None:
    row = bench_loader(seq_len=128, batch=8, tokens=400_000, batches=20, world_size=2)
    assert row["batch"] == 8 and row["seq"] == 128
    assert row["tokens_per_sec"] > 0


def test_direct_io_probe_measures_both_ways_and_leaves_nothing(tmp_path: Path) -> None:
    probe = _DiskProbe(tmp_path, 1 << 20)
    try:
        assert probe.write() > 0 and probe.read() > 0 and probe.write() > 0 and probe.read() > 0
        assert probe.method in {"O_DIRECT", "buffered+fsync"}
    finally:
        probe.close()
    assert list(tmp_path.iterdir()) == []


def test_the_read_into_new_memory_reads_every_byte_of_the_probe_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = _DiskProbe(tmp_path, 1 << 20)
    spans: list[tuple[int, int, int]] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        got = real(fd, buffers, offset)
        spans.append((offset, sum(len(b) for b in buffers), got))
        return got

    try:
        probe.write()
        monkeypatch.setattr(os, "preadv", preadv)
        assert probe.read_into_new_memory() > 0
    finally:
        monkeypatch.undo()
        probe.close()
    size = probe.blocks * bench._DIRECT_BLOCK
    assert sorted(offset for offset, _, _ in spans) == list(range(0, size, CHUNK))
    assert all(asked == got == CHUNK for _, asked, got in spans)


def test_a_bracketed_rate_is_the_probes_bytes_over_their_summed_times() -> None:
    assert _bracketed(1.0, 3.0) == pytest.approx(1.5)  # 1 GiB in 1 s and 1 GiB in 1/3 s: 2 GiB in 4/3 s
    assert _bracketed(2.0, 2.0) == pytest.approx(2.0)


@pytest.mark.slow
@pytest.mark.usefixtures("lone_process")
def test_train_row_uses_the_trainer() -> None:
    row = bench_train({"model": "tiny", "seq_len": "64", "batch_size": "4"}, warmup=2, steps=3, tokens=100_000)
    assert (row["model"], row["batch"], row["seq"]) == ("tiny", 4, 64)
    assert row["tokens_per_sec"] > 0 and row["step_ms"] > 0
    assert row["mfu"] == "n/a"  # no peak is known for a CPU


@pytest.mark.slow
@pytest.mark.parametrize("async_save", ["false", "true"])
def test_checkpoint_row_pairs_every_save_and_load_with_probes_of_the_disk(
    async_save: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The row's async staging is the staging of async saves, and is there only when saves are async; its resume
    figures are there when a resume was timed. Blocking saves: the recorded run's row (2 repeats and a resume);
    async ones: a run of 3 repeats and no resume."""
    if async_save == "false":
        _, row, left = request.getfixturevalue("blocking_saves_recorded")
        repeats, resumes = 2, 1
    else:
        hyperparameters = {"model": "tiny", "seq_len": "32", "batch_size": "2", "checkpoint.async_save": async_save}
        repeats, resumes = 3, 0
        with _alone(monkeypatch):
            row = bench_checkpoint(hyperparameters, repeats=repeats, resumes=resumes, parent=tmp_path)
        left = list(tmp_path.iterdir())
    assert len(row["direct_write_gibps"]) == len(row["direct_read_gibps"]) == repeats
    ratios = ["save_over_direct_write", "load_over_direct_read"]
    if resumes:
        assert len(row["resume_direct_read_gibps"]) == 1 and row["resume_load_s"] > 0
        ratios.append("resume_load_over_direct_read")
    else:
        assert not any(name.startswith("resume") for name in row)
    for ratio in ratios:
        low, high = row[f"{ratio}_range"]
        assert 0 <= low <= row[ratio] <= high  # a tiny model's ratios may round to 0
    assert ("async_staging_s" in row) == (async_save == "true")
    for cpu in ("save_cpu_user_s", "save_cpu_sys_s", "load_cpu_user_s", "load_cpu_sys_s"):
        assert row[cpu] >= 0, cpu
    assert left == []


def _recorded(async_save: str, parent: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, Any]]:
    """`bench_checkpoint` of 2 repeats and a resume, each probe, sync, save and load recorded as it starts (a probe
    with what else was still under way then): (the events, the row). A deletion of an old checkpoint finishes only
    once the benchmark waits for it, so one the benchmark did not wait for is seen."""
    events: list[str] = []
    managers: list[checkpoint.CheckpointManager] = []
    waited = threading.Event()

    def recorded(name: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if name == "sync":
                events.append(name)
            elif name in {"write", "read"}:
                manager = managers[0]
                busy = sorted(d.name for d, deletion in manager._deletions.items() if not deletion.done())
                busy += ["a background save"] if manager.pending is not None else []
                events.append(f"{name} beside {busy}" if busy else name)
            else:
                managers[:] = managers or [args[0]]
                events.append(name)
            return call(*args, **kwargs)

        return run

    def remove_old(directory: Path) -> None:
        if not waited.wait(timeout=60):
            raise AssertionError(f"nothing waited for the deletion of {directory.name}")
        remove_old_now(directory)

    def wait_for_deletions(manager: checkpoint.CheckpointManager) -> None:
        waited.set()
        try:
            wait_for_deletions_now(manager)
        finally:
            waited.clear()

    remove_old_now, manager = checkpoint.storage._remove_old, checkpoint.CheckpointManager
    wait_for_deletions_now = manager.wait_for_deletions
    monkeypatch.setattr(checkpoint.manager, "_remove_old", remove_old)
    monkeypatch.setattr(os, "sync", recorded("sync", os.sync))
    monkeypatch.setattr(manager, "wait_for_deletions", wait_for_deletions)
    monkeypatch.setattr(_DiskProbe, "write", recorded("write", _DiskProbe.write))
    monkeypatch.setattr(_DiskProbe, "read", recorded("read", _DiskProbe.read))
    monkeypatch.setattr(manager, "save", recorded("save", manager.save))
    monkeypatch.setattr(manager, "load_latest", recorded("load", manager.load_latest))
    monkeypatch.setattr(bench, "_resume_in_new_process", recorded("resume", bench._resume_in_new_process))
    hyperparameters = {"model": "tiny", "seq_len": "32", "batch_size": "2", "checkpoint.async_save": async_save}
    with _alone(monkeypatch):
        row = bench_checkpoint(hyperparameters, repeats=2, resumes=1, parent=parent)
    return events, row


@pytest.fixture(scope="module")
def blocking_saves_recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any], list[Path]]:
    """One recorded run with blocking saves (`_recorded`), shared by the tests of its order and of its row: (the
    events, the row, what it left in its directory)."""
    parent = tmp_path_factory.mktemp("bench-checkpoint")
    with pytest.MonkeyPatch.context() as monkeypatch:
        events, row = _recorded("false", parent, monkeypatch)
    return events, row, list(parent.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("async_save", ["false", "true"])
def test_every_timed_save_and_load_lies_between_two_probes_and_no_probe_shares_the_disk_with_other_work(
    async_save: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Each probe finds no deletion of an old checkpoint unfinished and no background save unwritten, and follows
    a sync of the file system, as does each timed save and load."""
    if async_save == "false":
        events, row, _ = request.getfixturevalue("blocking_saves_recorded")
    else:
        events, row = _recorded(async_save, tmp_path, monkeypatch)
    # The Trainer looks for a checkpoint to resume when it is built, and the first save only sizes the probes.
    # Each timed save lies between two writes, each timed load between two reads; a write probe syncs what
    # deleting its old file freed. Then a new process resumes between two reads.
    each = ["sync", "write", "sync", "save", "sync", "write", "sync", "save", "sync", "read", "load", "sync", "read"]
    assert events == ["load", "save"] + 2 * each + ["sync", "read", "resume", "sync", "read"]
    pairs = row["direct_write_gibps"] + row["direct_read_gibps"] + row["resume_direct_read_gibps"]
    assert [len(pair) for pair in pairs] == [2, 2, 2, 2, 2]


@pytest.mark.slow
def test_startup_row_times_two_hosts_to_their_first_step_with_and_without_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("TRAINING_EXPECTED_GPUS", "TRAINING_MIN_BUSBW_GBPS", "TRAINING_EFA"):
        monkeypatch.delenv(key, raising=False)
    row = bench_startup(hosts=2, nproc=1, repeats=1)
    assert (row["check"], row["hosts"], row["procs_per_host"]) == ("startup", 2, 1)
    assert row["first_step_s_preflight"] > 0 and row["first_step_s_no_preflight"] > 0
    # The workers report the check's own time, which the wait for the first step includes.
    assert 0 <= row["preflight_in_workers_s"] < row["first_step_s_preflight"]


def test_peer_bench_splits_and_encodes_the_text_as_nanogpt_does(tmp_path: Path) -> None:
    text = tmp_path / "input.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    paths, chars = bench_peer.prepare_ours(text, tmp_path / "ours")
    data = text.read_text()
    # nanoGPT's data/shakespeare_char/prepare.py: sorted alphabet, first 90% train, last 10% val.
    stoi = {c: i for i, c in enumerate(sorted(set(data)))}
    cut = int(len(data) * 0.9)
    val = [read_shard(p).tolist() for p in sorted(paths.channel("train").glob("val_*.bin"))]
    train = [read_shard(p).tolist() for p in sorted(paths.channel("train").glob("train_*.bin"))]
    assert val == [[stoi[c] for c in data[cut:]]]
    assert train == [[chars.eot, *(stoi[c] for c in data[:cut])]]
    # Our settings are the README run's, and valid.
    cfg = from_hyperparameters(bench_peer.our_hyperparameters(chars.vocab_size, 2000))
    assert (cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads, cfg.seq_len) == (128, 4, 4, 64)
    assert (cfg.train.micro_batch_size, cfg.optim.lr, cfg.optim.beta2, cfg.model.dropout) == (12, 1e-3, 0.99, 0.0)
    assert (cfg.eval.interval_steps, cfg.eval.max_batches, cfg.checkpoint.interval_steps) == (250, 20, 250)
    command = " ".join(bench_peer.nanogpt_command(tmp_path, 2000))
    assert "--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000" in command


def test_peer_bench_reads_both_trainers_step_times() -> None:
    nano = "iter 0: loss 4.2, time 900.00ms, mfu -100.00%\niter 1: loss 4.1, time 60.00ms, mfu 0.02%\n"
    nano += "iter 250: loss 2.1, time 800.00ms, mfu 0.02%\niter 251: loss 2.0, time 62.00ms, mfu 0.02%\n"
    assert bench_peer.nanogpt_step_seconds(nano, steps=2000) == [0.06, 0.062]
    ours = (
        "x INFO [rank0] training.trainer: step=1 loss=4.2 lr=0.1 grad_norm=1.0 tokens_per_sec=100.0\n"
        "x INFO [rank0] training.trainer: step=2 loss=4.1 lr=0.1 grad_norm=1.0 tokens_per_sec=768.0\n"
        "x INFO [rank0] training.trainer: step=250 loss=2.1 lr=0.1 grad_norm=1.0 tokens_per_sec=10.0\n"
        "x INFO [rank0] training.trainer: step=2000 val_loss=1.9\n"
    )
    assert bench_peer.our_step_seconds_and_val(ours, steps=2000) == ([1.0], 1.9)


@pytest.mark.slow
def test_straggler_row_times_the_checks_own_calls_in_a_world_of_two() -> None:
    row = bench_stragglers(world=2, steps=60, work=32)
    assert (row["check"], row["processes"], row["steps"], row["interval_steps"]) == ("stragglers", 2, 60, 50)
    assert row["step_ms"] > 0 and row["check_us_per_step"] > 0

"""Checkpoint commit, verification, retention and exact resume, with a Trainer running in this process."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint.state_dict as dcp_state_dict
import torch.distributed.checkpoint.utils as dcp_utils
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from training_helpers import CHECKPOINTED_JOB, make_opt_ml, run_in_process, step_losses, val_losses

import training.checkpoint.manager
import training.checkpoint.state
import training.checkpoint.storage
from contract import goodput
from contract.config import ConfigError
from contract.layout import MANIFEST
from contract.mesh import Layout
from contract.metrics import PHASE_WALL, PHASES, metric_series, parse_line, phase_metric
from training import trainer as trainer_module
from training.checkpoint import CheckpointError, committed_steps, io_threads, verify, write_manifest
from training.parallelize import Options, parallelize
from training.sagemaker_contract import Paths
from training.signals import StopRequest
from training.trainer import DataRangeError


def _resume_copy(reference: tuple[Path, str], tmp_path: Path) -> Paths:
    root = tmp_path / "ml"
    shutil.copytree(reference[0], root)
    shutil.rmtree(root / "model")
    return Paths(root)


def _resumed_at_step_8(reference: tuple[Path, str], tmp_path: Path) -> None:
    """Run the reference job again from a copy of its checkpoints without the last: it resumes from step 8 and
    logs the reference's losses after it, bit for bit."""
    paths = _resume_copy(reference, tmp_path)
    shutil.rmtree(paths.checkpoints / "step-12")
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed and "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _shard(directory: Path) -> Path:
    return next(directory.glob("__0_*.distcp"))


def test_reference_commits_checkpoints_with_manifests(reference: tuple[Path, str]) -> None:
    root, log = reference
    assert committed_steps(root / "checkpoints") == [12, 8, 4]
    manifest = json.loads((root / "checkpoints" / "step-12" / MANIFEST).read_text())
    assert manifest["step"] == 12 and manifest["world_size"] == 1
    assert manifest["tokens_consumed"] == 12 * 4 * 32
    # One data file per writer thread (at least 2), all of them hashed in the manifest.
    assert set(manifest["files"]) == {".metadata", *(f"__0_{i}.distcp" for i in range(io_threads()))}
    assert io_threads() >= 2
    assert all(verify(root / "checkpoints" / f"step-{s}") is None for s in (4, 8, 12))
    assert sorted(step_losses(log)) == list(range(1, 13))
    assert list(val_losses(log)) == [12]


def _phases(log: str) -> list[dict[str, float]]:
    """Every phases line of a log, in order: phase -> seconds, and "wall"."""
    found = []
    for line in log.splitlines():
        _, values = parse_line(line) or (0, {})
        if PHASE_WALL in values:
            found.append({"wall": values[PHASE_WALL]} | {p: values[phase_metric(p)] for p in PHASES})
    return found


def test_every_checkpoint_and_the_end_report_where_the_time_went(reference: tuple[Path, str]) -> None:
    lines = _phases(reference[1])
    assert sorted(metric_series(reference[1])[PHASE_WALL]) == [4, 8, 12]
    assert len(lines) == 4  # after the checkpoints at steps 4, 8 and 12, and at the end
    for earlier, later in itertools.pairwise(lines):
        assert all(later[key] >= earlier[key] for key in earlier)  # cumulative
    final = lines[-1]
    assert sum(final[p] for p in PHASES) == pytest.approx(final["wall"], rel=0.01)
    assert min(final["startup"], final["train"], final["checkpoint"], final["eval"], final["export"]) > 0
    assert final["preflight"] == 0  # run in this process: no launcher, no check
    assert final["rework"] == 0  # no earlier start of this run
    # Rank 0's progress record of this start: where it began, where it got to, the same phases and the
    # moments after the last line (the record's last word is written as the trainer closes).
    (record,) = goodput.local_records(reference[0] / "checkpoints")
    assert (record.job, record.first_step, record.step) == ("local", 0, 12)
    assert all(record.phases[p] >= final[p] - 0.002 for p in PHASES)
    rounding = 0.0005 * (len(PHASES) + 1)  # the record's phases and the line's wall are each to the millisecond
    assert -rounding <= sum(record.phases.values()) - final["wall"] < 10


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(reference: tuple[Path, str], tmp_path: Path) -> None:
    paths = _resume_copy(reference, tmp_path)
    for step in (8, 12):
        shutil.rmtree(paths.checkpoints / f"step-{step}")
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert "resumed from checkpoint step-4" in log
    assert _phases(log)[-1]["checkpoint_load"] > 0
    # The first start's record reached step 12: steps 5-12 are taken again, and their time is rework.
    assert "steps 5-12 were taken before: counted as rework" in log
    assert _phases(log)[-1]["rework"] > 0 and _phases(log)[-1]["train"] == 0
    expected = {s: v for s, v in step_losses(reference[1]).items() if s > 4}
    assert step_losses(log) == expected
    assert val_losses(log) == val_losses(reference[1])
    original = load_file(str(reference[0] / "model" / "model.safetensors"))
    resumed = load_file(str(paths.model / "model.safetensors"))
    assert original.keys() == resumed.keys()
    assert all(original[k].equal(resumed[k]) for k in original)


def _saved_keys(directory: Path) -> set[str]:
    return set(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def test_a_tied_weight_is_saved_once(reference: tuple[Path, str]) -> None:
    """The tiny model's head is its token embedding: a checkpoint holds those bytes once."""
    keys = _saved_keys(reference[0] / "checkpoints" / "step-12")
    assert "model.wte.weight" in keys and "optim.state.wte.weight.exp_avg" in keys
    assert "model.lm_head.weight" not in keys


def test_a_checkpoint_holding_a_tied_weight_twice_resumes_bit_for_bit(
    reference: tuple[Path, str], corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints saved before tied weights were saved once hold the head under its own name too."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    with monkeypatch.context() as saving_both:
        saving_both.setattr(training.checkpoint.state, "_untied", lambda model_sd: (model_sd, {}))
        completed, _ = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed and "model.lm_head.weight" in _saved_keys(paths.checkpoints / "step-4")
    for step in (8, 12):
        shutil.rmtree(paths.checkpoints / f"step-{step}")
    shutil.rmtree(paths.model)
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed and "resumed from checkpoint step-4" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 4}
    original = load_file(str(reference[0] / "model" / "model.safetensors"))
    resumed = load_file(str(paths.model / "model.safetensors"))
    assert original.keys() == resumed.keys() and all(original[k].equal(resumed[k]) for k in original)


def test_a_resume_makes_the_optimizer_state_it_loads_without_dcp_s_step(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP makes an optimizer's missing state with a step on zero gradients, which writes every byte of it and
    of the gradients before the load overwrites them; a resume gives it that state unwritten first, and resumes
    bit for bit."""
    had_state: list[bool] = []
    init = dcp_state_dict._init_optim_state
    monkeypatch.setattr(
        dcp_state_dict, "_init_optim_state", lambda optim: (had_state.append(bool(optim.state)), init(optim))[1]
    )
    _resumed_at_step_8(reference, tmp_path)
    assert had_state and all(had_state)


def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    paths = _resume_copy(reference, tmp_path)
    shard = _shard(paths.checkpoints / "step-12")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12: rank 0: step-12: __0_0.distcp is truncated" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}
    assert verify(paths.checkpoints / "step-12") is None  # rewritten by the resumed run


def test_unreadable_checkpoint_of_the_right_size_is_skipped(reference: tuple[Path, str], tmp_path: Path) -> None:
    paths = _resume_copy(reference, tmp_path)
    metadata = paths.checkpoints / "step-12" / ".metadata"
    metadata.write_bytes(b"\0" * metadata.stat().st_size)  # passes the size check, fails to load
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_checkpoint_without_manifest_is_never_loaded(reference: tuple[Path, str], tmp_path: Path) -> None:
    paths = _resume_copy(reference, tmp_path)
    (paths.checkpoints / "step-12" / MANIFEST).unlink()
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert "ignoring incomplete checkpoint step-12 (no manifest.json)" in log
    assert "resumed from checkpoint step-8" in log


def test_no_loadable_checkpoint_stops_instead_of_silently_restarting(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    paths = _resume_copy(reference, tmp_path)
    for step in (4, 8, 12):
        (paths.checkpoints / f"step-{step}" / ".metadata").unlink()
    with pytest.raises(CheckpointError, match=r"none of the 3 checkpoints .* set checkpoint\.resume=false"):
        run_in_process(paths.root, CHECKPOINTED_JOB)
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.resume": "false"})
    assert completed and step_losses(log) == step_losses(reference[1])


def test_resume_after_completion_only_exports_the_model(reference: tuple[Path, str], tmp_path: Path) -> None:
    paths = _resume_copy(reference, tmp_path)
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert step_losses(log) == {}
    assert val_losses(log) == val_losses(reference[1])
    config = json.loads((paths.model / "config.json").read_text())
    assert config["step"] == 12 and config["metrics"]["validation:loss"] == val_losses(log)[12]
    assert config["tied_weights"] == {"lm_head.weight": "wte.weight"}


def test_retention_keeps_the_newest_and_never_touches_newer_debris(corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    for debris in ("step-2", "step-999"):
        (paths.checkpoints / debris).mkdir(parents=True)
        (paths.checkpoints / debris / "__0_0.distcp").write_bytes(b"partial")
    completed, _ = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.keep_last": "2"})
    assert completed
    # Retention prunes checkpoints only: the progress records stay.
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["progress", "step-12", "step-8", "step-999"]


def test_training_goes_on_while_an_old_checkpoint_is_deleted(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting an old checkpoint can take as long as writing one (a disk mounted with `discard` trims each
    freed block): the run trains on, and saves the next checkpoint, while it is deleted; it ends once the
    deletion has."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    remove = training.checkpoint.remove_checkpoint
    trained_on: list[bool] = []

    def slow_remove(directory: Path) -> None:
        if directory.name == "step-4":  # until the run has gone on to save step 12
            deadline = time.monotonic() + 60
            while not (paths.checkpoints / "step-12").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            trained_on.append((paths.checkpoints / "step-12").exists())
        remove(directory)

    monkeypatch.setattr(training.checkpoint.storage, "remove_checkpoint", slow_remove)
    monkeypatch.setattr(training.checkpoint.manager, "remove_checkpoint", slow_remove)
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.keep_last": "1"})
    assert completed
    assert trained_on == [True]
    assert "removed old checkpoint step-4" in log and "removed old checkpoint step-8" in log
    assert committed_steps(paths.checkpoints) == [12]


@pytest.mark.parametrize("what", ["manifest", "data"])
def test_an_old_checkpoint_that_cannot_be_deleted_is_reported_and_the_run_goes_on(
    what: str, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its manifest (the deletion stops there, and the checkpoint stays whole), or the rest of its files
    (`shutil.rmtree` ignores each error, so what is left is named)."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    if what == "manifest":
        unlink = Path.unlink

        def refused(self: Path, missing_ok: bool = False) -> None:
            if self.parent.name == "step-4" and self.name == MANIFEST:
                raise PermissionError(13, "Permission denied", str(self))
            unlink(self, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", refused)
    else:
        rmtree = shutil.rmtree
        monkeypatch.setattr(
            training.checkpoint.storage.shutil,
            "rmtree",
            lambda path, **kw: None if Path(path).name == "step-4" else rmtree(path, **kw),
        )
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.keep_last": "1"})
    assert completed
    if what == "manifest":
        assert "could not remove old checkpoint step-4: PermissionError: [Errno 13] Permission denied" in log
        assert committed_steps(paths.checkpoints) == [12, 4]
    else:
        assert "could not remove old checkpoint step-4: OSError: .metadata, __0_0.distcp" in log
        assert "removed old checkpoint step-4" not in log
        assert committed_steps(paths.checkpoints) == [12]


def test_a_failing_run_still_waits_for_its_deletions(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing run closes without committing a pending save; the old checkpoints it was deleting are gone
    (or logged) before it exits, not half deleted by a thread the interpreter's exit joins."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    remove, removed = training.checkpoint.remove_checkpoint, []

    def slow_remove(directory: Path) -> None:
        time.sleep(0.5)
        remove(directory)
        removed.append(directory.name)

    monkeypatch.setattr(training.checkpoint.storage, "remove_checkpoint", slow_remove)
    monkeypatch.setattr(training.checkpoint.manager, "remove_checkpoint", slow_remove)
    train_step, steps = trainer_module.Trainer._train_step, []

    def fails_after_step_9(self: trainer_module.Trainer) -> Any:
        steps.append(1)
        if len(steps) > 9:
            raise RuntimeError("the step failed")
        return train_step(self)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", fails_after_step_9)
    monkeypatch.setattr(trainer_module.Trainer, "close", _closes_as_a_failing_run(trainer_module.Trainer.close))
    with pytest.raises(RuntimeError, match="the step failed"):
        run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.keep_last": "1"})
    assert removed == ["step-4"]
    assert committed_steps(paths.checkpoints) == [8]


def _closes_as_a_failing_run(close: Any) -> Any:
    def closing(self: trainer_module.Trainer, *, commit_pending: bool = True) -> None:
        close(self, commit_pending=False)

    return closing


class _StopAt(StopRequest):
    """Behaves as if SIGTERM arrived during step ``at``."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.polls = at, 0

    @property
    def requested(self) -> bool:
        self.polls += 1
        if self.polls >= self.at:
            self.signum = signal.SIGTERM
        return self.signum is not None


def test_stop_request_checkpoints_the_current_step_and_resumes_exactly(
    reference: tuple[Path, str], corpus: Path, tmp_path: Path
) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB, stop=_StopAt(6))
    assert not completed
    assert "stopped by signal at step 6: checkpoint step-6 is committed" in log
    assert committed_steps(paths.checkpoints) == [6, 4]
    assert not paths.model.exists()
    completed, log = run_in_process(paths.root, CHECKPOINTED_JOB)
    assert completed
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 6}


def test_async_save_commits_the_same_checkpoints(reference: tuple[Path, str], corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.async_save": "true"})
    assert completed
    assert step_losses(log) == step_losses(reference[1])
    assert committed_steps(paths.checkpoints) == [12, 8, 4]
    assert all(verify(paths.checkpoints / f"step-{s}") is None for s in (4, 8, 12))
    shutil.rmtree(paths.checkpoints / "step-12")
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "checkpoint.async_save": "true"})
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_activation_checkpointing_changes_memory_not_results(
    reference: tuple[Path, str], corpus: Path, tmp_path: Path
) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "parallel.activation_checkpointing": "true"})
    assert completed
    assert step_losses(log) == step_losses(reference[1])
    # Checkpoints stay interchangeable: the wrapper's name prefix is not in the saved keys.
    assert (
        load_file(str(paths.model / "model.safetensors")).keys()
        == load_file(str(reference[0] / "model" / "model.safetensors")).keys()
    )


def test_gradient_accumulation_matches_a_larger_micro_batch(corpus: Path, tmp_path: Path) -> None:
    big = make_opt_ml(tmp_path / "big", {}, corpus=corpus)
    small = make_opt_ml(tmp_path / "small", {}, corpus=corpus)
    job = {**CHECKPOINTED_JOB, "max_steps": "4", "checkpoint.interval_steps": "0"}
    _, log_big = run_in_process(big.root, {**job, "batch_size": "4"})
    _, log_small = run_in_process(small.root, {**job, "batch_size": "2", "train.global_batch_size": "4"})
    assert "2 accumulation = 4 sequences" in log_small
    for step, loss in step_losses(log_big).items():
        assert step_losses(log_small)[step] == pytest.approx(loss, rel=1e-5)


def test_profiler_trace_is_written_under_output(corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    job = {**CHECKPOINTED_JOB, "max_steps": "4", "metrics.profile": "true", "metrics.profile_start_step": "2"}
    run_in_process(paths.root, {**job, "metrics.profile_steps": "1"})
    traces = list((paths.output / "data" / "profile").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_tensorboard_writes_events_or_names_the_missing_package(corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    job = {**CHECKPOINTED_JOB, "max_steps": "2", "metrics.tensorboard": "true"}
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match=r"metrics\.tensorboard=true .*no 'tensorboard' package"):
            run_in_process(paths.root, job)
    else:
        run_in_process(paths.root, job)
        assert list((paths.output / "tensorboard").glob("events.out.tfevents.*"))


def test_token_ids_beyond_the_vocabulary_fail_with_the_fix(corpus: Path, tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    with pytest.raises(DataRangeError, match=r"token id \d+ does not fit model\.vocab_size=100: set model\.vocab"):
        run_in_process(paths.root, {**CHECKPOINTED_JOB, "model.vocab_size": "100"})
    # The failed start still leaves its progress record: where its time went before it failed.
    (record,) = goodput.local_records(paths.checkpoints)
    assert record.step == 0 and record.phases["startup"] > 0 and record.phases["train"] >= 0


def test_manifest_commit_is_atomic(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"format": 1, "step": 1, "files": {}})
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST]
    assert verify(tmp_path) == f"{tmp_path.name}: manifest has an unknown format"


def test_periodic_evals_score_the_sample_and_the_final_one_the_whole_set(corpus: Path, tmp_path: Path) -> None:
    job = {**CHECKPOINTED_JOB, "max_steps": "4", "checkpoint.interval_steps": "0", "eval.interval_steps": "2"}
    whole = make_opt_ml(tmp_path / "whole", {}, corpus=corpus)
    sampled = make_opt_ml(tmp_path / "sampled", {}, corpus=corpus)
    _, log_whole = run_in_process(whole.root, job)
    _, log_sampled = run_in_process(sampled.root, {**job, "eval.max_batches": "1"})
    assert step_losses(log_sampled) == step_losses(log_whole)  # evaluation does not touch training
    assert val_losses(log_sampled)[2] != val_losses(log_whole)[2]
    assert val_losses(log_sampled)[4] == val_losses(log_whole)[4]


DDP_OPTIONS = Options(
    fsdp=False, param_dtype=torch.float32, activation_checkpointing=False, compile=False, reshard_after_forward=True
)


def test_one_process_trains_the_model_without_a_ddp_wrapper() -> None:
    model = torch.nn.Linear(2, 2)
    bare = parallelize(lambda: model, arch=None, layout=Layout(), opts=DDP_OPTIONS, device=torch.device("cpu"))
    assert bare.module is model and bare.parts == [model]


def test_ddp_broadcasts_no_buffers_before_each_forward() -> None:
    """A buffer broadcast would hold every rank in its forward until the slowest arrives, which the
    straggler check would time as the fast ranks' own compute."""
    import torch.distributed as dist
    from torch.distributed import HashStore  # type: ignore[attr-defined]
    from torch.nn.parallel import DistributedDataParallel

    from contract.model_args import PRESETS
    from training.models.llama import Llama

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        model = Llama(PRESETS["llama-1b"].replace(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64))
        assert dict(model.named_buffers())  # the rope tables
        ddp = parallelize(
            lambda: model, arch=None, layout=Layout(dp_replicate=2), opts=DDP_OPTIONS, device=torch.device("cpu")
        ).module
        assert isinstance(ddp, DistributedDataParallel) and not ddp.broadcast_buffers
    finally:
        dist.destroy_process_group()


def test_a_world_of_one_trains_without_collectives(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(trainer_module.dist, "all_reduce", lambda *a, **k: calls.append("all_reduce"))
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    completed, log = run_in_process(paths.root, {**CHECKPOINTED_JOB, "max_steps": "3", "eval.interval_steps": "2"})
    assert completed and sorted(step_losses(log)) == [1, 2, 3] and sorted(val_losses(log)) == [2, 3]
    assert calls == []


def test_a_world_of_one_saves_and_loads_checkpoints_without_dcp_s_collectives(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP's collectives pickle every plan and result; a process that is the whole world would send them to itself.
    It saves and resumes bit for bit without them, and without DCP's warning of it."""
    used: list[bool] = []
    wrapper = dcp_utils._DistWrapper.__init__
    monkeypatch.setattr(
        dcp_utils._DistWrapper,
        "__init__",
        lambda self, group, use_dist, *a: (used.append(use_dist), wrapper(self, group, use_dist, *a))[1],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _resumed_at_step_8(reference, tmp_path)
    assert len(used) >= 2 and not any(used)  # the load, and the save at step 12
    assert not [w for w in caught if training.checkpoint.manager._NO_DIST_WARNING in str(w.message)]


def test_what_the_trainer_built_is_out_of_the_garbage_collectors_sight_until_it_closes(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full collection walks every object not frozen; a checkpoint save's allocations trigger them."""
    import gc

    frozen: list[int] = []
    train = trainer_module.Trainer.train

    def counted(self: trainer_module.Trainer) -> bool:
        frozen.append(gc.get_freeze_count())
        return train(self)

    monkeypatch.setattr(trainer_module.Trainer, "train", counted)
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    completed, _ = run_in_process(paths.root, {**CHECKPOINTED_JOB, "max_steps": "2"})
    assert completed
    assert frozen[0] > 10_000  # the model's modules, torch's and the trainer's own objects
    assert gc.get_freeze_count() == 0

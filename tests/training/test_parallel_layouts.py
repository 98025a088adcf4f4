"""Tensor and pipeline parallelism on CPU (gloo), 2 and 4 processes: every layout trains as one process does.

Each layout runs the same 20 steps as the single-process reference, from the same initial weights (rank 0 draws
them for every layout), on the same sequences (each data-parallel process reads its share of the same global
batch), and must log each step's loss within 1e-4 of the reference's (fp32; the layouts sum in other orders).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hf_fixtures import llama_folder
from safetensors.torch import load_file
from training_helpers import clean_env, make_opt_ml, run, run_in_process, step_losses, torchrun, val_losses

from contract.layout import step_dir
from training.checkpoint import committed_steps

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess4]

STEPS = 20
# llama-tiny with 4 blocks (so 2 processes can run 2 pipeline stages each): 4 heads, 2 KV heads, width 64. 4
# sequences per step in every layout.
JOB = {
    "model": "llama-tiny",
    "model.n_layers": "4",
    "distribution": "fsdp",
    "seq_len": "32",
    "max_steps": str(STEPS),
    "train.global_batch_size": "4",
    "optim.lr": "0.003",
    "optim.warmup_steps": "4",
    "metrics.log_interval": "1",
    "checkpoint.interval_steps": "10",
    "checkpoint.keep_last": "2",
    "eval.max_sequences": "16",
    "train.deterministic": "true",
}
# Every schedule, and activation checkpointing with each kind of parallelism, each layout run once.
LAYOUTS = {
    "tp2": (2, {"parallel.tp": "2", "batch_size": "4"}),
    "pp2": (2, {"parallel.pp": "2", "parallel.pp_schedule": "interleaved1f1b", "batch_size": "4"}),
    "tp2xdp2": (4, {"parallel.tp": "2", "batch_size": "2", "parallel.activation_checkpointing": "true"}),
    "pp2xdp2": (4, {"parallel.pp": "2", "batch_size": "2", "parallel.activation_checkpointing": "true"}),
    "tp2xpp2": (4, {"parallel.tp": "2", "parallel.pp": "2", "batch_size": "4"}),
    "tp2xpp2-gpipe": (4, {"parallel.tp": "2", "parallel.pp": "2", "parallel.pp_schedule": "gpipe", "batch_size": "4"}),
}
TOLERANCE = 1e-4


def _train(root: Path, corpus: Path, processes: int, hyperparameters: dict[str, str], timeout: float = 600) -> str:
    make_opt_ml(root, hyperparameters, corpus=corpus)
    result = run(torchrun(processes), clean_env(root), timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def _assert_same_losses(log: str, reference: dict[int, float], steps: range) -> None:
    losses = step_losses(log)
    assert sorted(losses) == list(steps)
    worst = max(abs(losses[s] - reference[s]) / reference[s] for s in steps)
    assert worst <= TOLERANCE, {s: (losses[s], reference[s]) for s in steps}


def _one_process(root: Path, corpus: Path, hyperparameters: dict[str, str]) -> str:
    make_opt_ml(root, {}, corpus=corpus)
    completed, log = run_in_process(root, hyperparameters)
    assert completed
    return log


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, float], str]:
    """One process, no parallelism: the losses every layout must log."""
    log = _one_process(tmp_path_factory.mktemp("one-process"), corpus, {**JOB, "batch_size": "4"})
    return step_losses(log), log


@pytest.fixture(scope="module")
def tp2xdp2(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """tp=2 x dp_shard=2 on 4 processes: its checkpoints (steps 10 and 20) and its log."""
    root = tmp_path_factory.mktemp("tp2xdp2")
    processes, layout = LAYOUTS["tp2xdp2"]
    return root, _train(root, corpus, processes, {**JOB, **layout})


def _assert_like_reference(log: str, reference: tuple[dict[int, float], str]) -> None:
    _assert_same_losses(log, reference[0], range(1, STEPS + 1))
    val, expected = val_losses(log)[STEPS], val_losses(reference[1])[STEPS]
    assert abs(val - expected) <= TOLERANCE * expected


def test_tensor_and_data_parallel_log_the_single_process_losses(
    tp2xdp2: tuple[Path, str], reference: tuple[dict[int, float], str]
) -> None:
    _, log = tp2xdp2
    _assert_like_reference(log, reference)
    assert "layout dp_shard=2 x tp=2" in log


@pytest.mark.parametrize("name", ["tp2", "pp2", "pp2xdp2", "tp2xpp2", "tp2xpp2-gpipe"])
def test_each_layout_logs_the_single_process_losses(
    name: str, reference: tuple[dict[int, float], str], corpus: Path, tmp_path: Path
) -> None:
    processes, layout = LAYOUTS[name]
    log = _train(tmp_path, corpus, processes, {**JOB, **layout})
    _assert_like_reference(log, reference)
    if name == "pp2":
        assert "interleaved1f1b x 4 micro-batches x 2 stages per process" in log


def test_a_tp2_x_dp2_checkpoint_resumes_under_dp4_with_the_uninterrupted_losses(
    tp2xdp2: tuple[Path, str], corpus: Path, tmp_path: Path
) -> None:
    saved, uninterrupted = tp2xdp2
    assert committed_steps(saved / "checkpoints") == [20, 10]
    root = tmp_path / "dp4"
    make_opt_ml(root, {}, corpus=None)
    shutil.copytree(saved / "checkpoints", root / "checkpoints")
    shutil.rmtree(root / "checkpoints" / step_dir(20))  # the run resumes from step 10's, saved under tp2 x dp2
    log = _train(root, corpus, 4, {**JOB, "batch_size": "1"})
    assert "resumed from checkpoint step-10" in log and "layout dp_shard=4" in log
    _assert_same_losses(log, step_losses(uninterrupted), range(11, STEPS + 1))


def test_a_pipeline_of_gpt2_keeps_its_tied_embedding_in_both_end_stages(
    corpus: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # GPT-2's head is its token embedding: the first and last stages each hold it, their gradients summed.
    gpt2 = {**JOB, "model": "tiny", "model.n_layers": "2", "batch_size": "4"}
    one = tmp_path_factory.mktemp("gpt2-one")
    reference = _one_process(one, corpus, gpt2)
    log = _train(tmp_path, corpus, 4, {**gpt2, "parallel.tp": "2", "parallel.pp": "2"})
    _assert_same_losses(log, step_losses(reference), range(1, STEPS + 1))
    exported, expected = (
        load_file(str(tmp_path / "model" / "model.safetensors")),
        load_file(str(one / "model" / "model.safetensors")),
    )
    assert exported.keys() == expected.keys() and "lm_head.weight" not in exported  # stored once, as in one process
    assert (tmp_path / "model" / "config.json").read_text().count('"lm_head.weight": "wte.weight"') == 1


def _from_folder(root: Path, corpus: Path, folder: Path, processes: int, layout: dict[str, str]) -> str:
    """A fine-tuning run of the model folder on the corpus (one process in this one if `processes` is 1)."""
    job = {k: v for k, v in JOB.items() if not k.startswith("model")} | {"model.init_from": "base_model", **layout}
    make_opt_ml(root, job, corpus=corpus)
    shutil.copytree(folder, root / "input" / "data" / "base_model")
    if processes == 1:
        completed, log = run_in_process(root, job)
        assert completed, log[-4000:]
        return log
    result = run(torchrun(processes), clean_env(root), timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def test_a_model_folder_fine_tuned_in_tp2_x_pp2_logs_the_single_process_losses(
    corpus: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A published Llama's folder (a tied head, so both end stages and the tensor-parallel head hold the embedding):
    # every process loads its shard of each weight it holds straight from the files.
    folder = llama_folder(tmp_path_factory.mktemp("folder"), tokenizer=False, tie_word_embeddings=True)
    one = _from_folder(tmp_path_factory.mktemp("folder-one"), corpus, folder, 1, {"batch_size": "4"})
    split = {"parallel.tp": "2", "parallel.pp": "2", "batch_size": "4"}
    log = _from_folder(tmp_path, corpus, folder, 4, split)
    assert "layout pp=2 x tp=2" in log
    _assert_same_losses(log, step_losses(one), range(1, STEPS + 1))
    exported = load_file(str(tmp_path / "model" / "hf" / "model-00001-of-00001.safetensors"))
    assert exported.keys() == load_file(str(folder / "model.safetensors")).keys()


def test_compiled_tensor_parallel_blocks_log_the_single_process_losses(
    reference: tuple[dict[int, float], str], corpus: Path, tmp_path: Path
) -> None:
    # One layout (compiling on CPU takes minutes): tensor parallelism, whose DTensor blocks are the ones compile
    # got wrong before (training/parallel/tensor.py), with activation checkpointing.
    processes, layout = LAYOUTS["tp2"]
    compiled = {"parallel.compile": "true", "parallel.activation_checkpointing": "true"}
    log = _train(tmp_path, corpus, processes, {**JOB, **layout, **compiled}, timeout=1200)
    _assert_same_losses(log, reference[0], range(1, STEPS + 1))


def test_the_trainer_refuses_a_layout_its_processes_cannot_hold(corpus: Path, tmp_path: Path) -> None:
    # Started without the launcher (which refuses it first: tests/training/test_launcher_contract.py). GPT-2 tiny's
    # sizes split in 4, but 2 processes on one host cannot.
    paths = make_opt_ml(tmp_path, {**JOB, "model": "tiny", "batch_size": "2", "parallel.tp": "4"}, corpus=corpus)
    result: subprocess.CompletedProcess[str] = run(torchrun(2), clean_env(tmp_path), timeout=300)
    assert result.returncode != 0
    assert "2 processes cannot be tp=4: tp must divide 2, the GPUs per host" in paths.failure.read_text()

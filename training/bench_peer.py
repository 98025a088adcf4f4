"""The peer benchmark: this package's trainer and nanoGPT's on tiny Shakespeare, side by side.

    python -m training.bench peer [--steps 2000] [--lr 1e-3] [--repeats 2] [--hp model.bias=true ...]

nanoGPT (karpathy/nanoGPT) is cloned into ``.bench/nanoGPT`` (ignored, never committed) and run as its
README's CPU example: shakespeare-char, 4 layers, 4 heads, width 128, context 64, batch 12, lr 1e-3
decaying to 1e-4 over the run (``--lr`` sets both trainers' peak, the minimum a tenth of it), beta2
0.99, no dropout, an estimate of the losses on 20 batches every 250 iterations; it saves a checkpoint
at every evaluation (``always_save_checkpoint``) so that its last model can be scored. Ours trains the
same model shape on the same text, split 90/10 the same way and tokenized to the same character ids
(``training.prepare --chars --val-fraction 0.1``), with the same schedule, evaluation cadence (20
sampled batches, the whole held-out 10% at the end) and checkpoint cadence, through
``python -m training.train`` as one process. Where nanoGPT draws every window at a random offset, ours
moves its window grid by a seeded offset every epoch (``data.shift_windows``).

The two run alternately, each in its own process with the same thread count. Reported: each one's
median tokens/s over its steps (the first step and evaluation steps left out of both),
the whole process's wall time, and the validation loss of both final models over the same windows
(every non-overlapping 64-token window of the held-out 10%).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.config import from_hyperparameters
from contract.layout import OPT_ML_ROOT_ENV
from contract.metrics import TOKENS_PER_SEC, VALIDATION_LOSS, parse_line
from training.data import TokenSamples
from training.prepare import prepare
from training.sagemaker_contract import Paths
from training.tokenizer import CharTokenizer

NANOGPT_SOURCE = "https://github.com/karpathy/nanoGPT"
REPOSITORY = Path(__file__).resolve().parents[1]
NANOGPT_DIR = REPOSITORY / ".bench" / "nanoGPT"
TEXT = REPOSITORY.parent / "shared" / "data" / "tinyshakespeare.txt"

# nanoGPT's README CPU run, and the same job in this package's hyperparameters.
CONTEXT, BATCH, LAYERS, HEADS, WIDTH = 64, 12, 4, 4, 128
EVAL_INTERVAL, EVAL_BATCHES, WARMUP, LR = 250, 20, 100, 1e-3


def nanogpt_command(out_dir: Path, steps: int, lr: float = LR) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        "--device=cpu",
        "--compile=False",
        f"--eval_iters={EVAL_BATCHES}",
        "--log_interval=1",
        f"--block_size={CONTEXT}",
        f"--batch_size={BATCH}",
        f"--n_layer={LAYERS}",
        f"--n_head={HEADS}",
        f"--n_embd={WIDTH}",
        f"--max_iters={steps}",
        f"--lr_decay_iters={steps}",
        "--dropout=0.0",
        f"--learning_rate={lr}",
        f"--min_lr={lr / 10}",
        f"--out_dir={out_dir}",
        "--always_save_checkpoint=True",
        f"--eval_interval={eval_interval(steps)}",
    ]


def eval_interval(steps: int) -> int:
    """Every 250 steps, as nanoGPT's config; shorter runs evaluate (and checkpoint) once, at their end."""
    return min(EVAL_INTERVAL, steps)


def our_hyperparameters(vocab_size: int, steps: int, lr: float = LR) -> dict[str, str]:
    return {
        "model": "tiny",
        "model.vocab_size": str(vocab_size),
        "model.dim": str(WIDTH),
        "model.n_layers": str(LAYERS),
        "model.n_heads": str(HEADS),
        "model.max_seq_len": str(CONTEXT),
        "model.bias": "false",
        "model.gelu": "exact",
        "data.seq_len": str(CONTEXT),
        "data.shift_windows": "true",  # nanoGPT samples windows at random offsets
        "train.micro_batch_size": str(BATCH),
        "train.max_steps": str(steps),
        "train.seed": "1337",
        "optim.lr": str(lr),
        "optim.min_lr_ratio": "0.1",
        "optim.warmup_steps": str(min(WARMUP, steps)),
        "optim.beta2": "0.99",
        "optim.weight_decay": "0.1",
        "eval.interval_steps": str(eval_interval(steps)),
        "eval.max_batches": str(EVAL_BATCHES),
        "eval.max_sequences": str(2**31 - 1),
        "checkpoint.interval_steps": str(eval_interval(steps)),
        "checkpoint.interval_minutes": "0",
        "checkpoint.keep_last": "1",
        "metrics.log_interval": "1",
    }


@dataclass
class Run:
    name: str
    wall_s: float
    step_s: list[float]  # per optimizer step, as the trainer measured it
    tokens_per_step: int
    val_loss: float | None

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_per_step / statistics.median(self.step_s)


def ensure_nanogpt(folder: Path, source: str, text: Path) -> str:
    """nanoGPT checked out in ``folder`` with its shakespeare_char data prepared from ``text``; its commit."""
    if not (folder / "train.py").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", source, str(folder)], check=True)
    data = folder / "data" / "shakespeare_char"
    link = data / "input.txt"
    if not link.exists():
        link.symlink_to(text.resolve())  # its prepare.py reads input.txt before it would download one
    if not (data / "val.bin").is_file():
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, stdout=subprocess.DEVNULL)
    return subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def prepare_ours(text: Path, root: Path) -> tuple[Paths, CharTokenizer]:
    """A SageMaker-style tree under ``root`` with the text's character shards in its train channel."""
    paths = Paths(root)
    corpus = root / "text"
    corpus.mkdir(parents=True)
    (corpus / text.name).symlink_to(text.resolve())
    tokenizer = CharTokenizer.from_texts([text.read_text(encoding="utf-8")])
    prepare(corpus, paths.channel("train"), tokenizer, val_fraction=0.1)
    return paths, tokenizer


def _thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _timed(command: list[str], *, cwd: Path | None, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{command[:3]} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return wall, done.stdout + done.stderr


_NANO_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.MULTILINE)


def nanogpt_step_seconds(output: str, *, steps: int) -> list[float]:
    """Seconds per iteration from nanoGPT's log; iteration 0 holds start-up, an evaluation iteration the
    evaluation, so neither counts."""
    return [float(ms) / 1000 for it, ms in _NANO_ITER.findall(output) if int(it) % eval_interval(steps)]


def our_step_seconds_and_val(output: str, *, steps: int) -> tuple[list[float], float | None]:
    """Seconds per step from our metrics lines (the first and evaluation steps left out, as nanoGPT's),
    and the last validation loss."""
    step_s, val = [], None
    for line in output.splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        step, values = parsed
        if TOKENS_PER_SEC in values and step % eval_interval(steps) and step > 1:
            step_s.append(BATCH * CONTEXT / values[TOKENS_PER_SEC])
        if VALIDATION_LOSS in values:
            val = values[VALIDATION_LOSS]
    return step_s, val


def run_nanogpt(folder: Path, out_dir: Path, steps: int, lr: float, threads: int) -> Run:
    wall, output = _timed(nanogpt_command(out_dir, steps, lr), cwd=folder, env=_thread_env(threads))
    return Run("nanoGPT", wall, nanogpt_step_seconds(output, steps=steps), BATCH * CONTEXT, None)


def run_ours(paths: Paths, hyperparameters: dict[str, str], steps: int, threads: int, port: int) -> Run:
    paths.hyperparameters.parent.mkdir(parents=True, exist_ok=True)
    paths.hyperparameters.write_text(json.dumps(hyperparameters))
    for stale in (paths.checkpoints, paths.model):
        shutil.rmtree(stale, ignore_errors=True)
    env = {
        **_thread_env(threads),
        OPT_ML_ROOT_ENV: str(paths.root),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    wall, output = _timed([sys.executable, "-m", "training.train"], cwd=None, env=env)
    step_s, val = our_step_seconds_and_val(output, steps=steps)
    return Run("ours", wall, step_s, BATCH * CONTEXT, val)


def score_nanogpt(folder: Path, out_dir: Path, val_shards: list[Path]) -> float:
    """nanoGPT's final model's mean loss over every non-overlapping window of the held-out text."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    sys.path.insert(0, str(folder))
    try:
        from model import GPT, GPTConfig  # type: ignore[import-not-found]  # noqa: PLC0415  (nanoGPT's)
    finally:
        sys.path.remove(str(folder))
    checkpoint = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()})
    model.eval()
    samples = TokenSamples(val_shards, CONTEXT)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, samples.n_samples, 64):
            batch = torch.from_numpy(samples.gather(np.arange(start, min(start + 64, samples.n_samples))))
            targets = batch[:, 1:].contiguous()
            logits, _ = model(batch[:, :-1].contiguous(), targets)
            total += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
            count += targets.numel()
    return total / count


def bench_peer(
    *,
    steps: int,
    lr: float,
    repeats: int,
    threads: int,
    overrides: dict[str, str],
    nanogpt: Path,
    source: str,
    text: Path,
    port: int,
) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    commit = ensure_nanogpt(nanogpt, source, text)
    runs: dict[str, list[Run]] = {"nanoGPT": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        paths, tokenizer = prepare_ours(text, Path(tmp) / "ours")
        hyperparameters = {**our_hyperparameters(tokenizer.vocab_size, steps, lr), **overrides}
        out_dir = Path(tmp) / "nanogpt-out"
        for repeat in range(repeats):
            order = ("nanoGPT", "ours") if repeat % 2 == 0 else ("ours", "nanoGPT")
            for name in order:
                run = (
                    run_nanogpt(nanogpt, out_dir, steps, lr, threads)
                    if name == "nanoGPT"
                    else run_ours(paths, hyperparameters, steps, threads, port)
                )
                runs[name].append(run)
        nano_val = score_nanogpt(nanogpt, out_dir, sorted(paths.channel("train").glob("val_*.bin")))
    ours, nano = runs["ours"], runs["nanoGPT"]
    ours_tps = statistics.median(r.tokens_per_sec for r in ours)
    nano_tps = statistics.median(r.tokens_per_sec for r in nano)
    ours_wall = statistics.median(r.wall_s for r in ours)
    nano_wall = statistics.median(r.wall_s for r in nano)
    ours_val = ours[-1].val_loss
    return {
        "bench": "peer",
        "steps": steps,
        "nanogpt_lr": lr,
        "ours_lr": from_hyperparameters(hyperparameters).optim.lr,  # `overrides` may set it apart
        "repeats": repeats,
        "threads": threads,
        "ours_tokens_per_sec": round(ours_tps),
        "nanogpt_tokens_per_sec": round(nano_tps),
        "tokens_per_sec_ratio": round(ours_tps / nano_tps, 3),
        "ours_wall_s": round(ours_wall, 1),
        "nanogpt_wall_s": round(nano_wall, 1),
        "wall_ratio": round(ours_wall / nano_wall, 3),
        "ours_val_loss": round(ours_val, 4) if ours_val is not None and math.isfinite(ours_val) else None,
        "nanogpt_val_loss": round(nano_val, 4),
        "overrides": overrides or "none",
        "nanogpt_commit": commit,
        "torch": torch.__version__,
    }

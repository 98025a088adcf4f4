"""Nested, validated job configuration and its mapping from SageMaker hyperparameters.

Torch-free: the launcher validates hyperparameters before starting any worker, and the platform's
Validate Lambda rejects unknown keys from :func:`hyperparameter_names` before a job is created.
Hyperparameter keys are dotted field paths (``optim.lr``); a few aliases (:data:`ALIASES`) are
shorter spellings of the most used ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import typing
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from contract.distributions import DISTRIBUTIONS, NAMES
from contract.model_args import PRESETS, ModelArgs

# Keys the SageMaker SDK's framework estimators inject, and the objective metric SageMaker adds to a
# tuning job's trials (`_tuning_objective_metric`); they mean nothing to this image.
IGNORED_PREFIXES = ("sagemaker_", "_tuning_")


@dataclass(frozen=True)
class ConfigProblem:
    """One invalid hyperparameter: its key (as given, or the field's dotted name for a field's own rule) and the
    sentence that says what is wrong and how to fix it."""

    key: str
    message: str


class ConfigError(ValueError):
    """Hyperparameters or config values are invalid; the message says which and how to fix each.

    `problems` lists them one by one (the message joins them), for callers that report each under its key.
    """

    def __init__(self, message: str | Sequence[ConfigProblem], key: str = "") -> None:
        self.problems = [ConfigProblem(key, message)] if isinstance(message, str) else list(message)
        super().__init__("; ".join(p.message for p in self.problems))


# While `from_hyperparameters` builds a config, each rule's problem is collected here instead of raised at once, so
# that one call names every problem; outside it, a rule raises as it finds one.
_COLLECTED: ContextVar[list[ConfigProblem] | None] = ContextVar("config_problems", default=None)


def _f(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    # Every field carries its help text and allowed values: both feed errors and the reference table.
    return field(default=default, metadata={"help": help, "choices": choices})


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if ok:
        return
    problem = ConfigProblem(key, f"hyperparameter {key}={value!r} is invalid: {allowed}")
    collected = _COLLECTED.get()
    if collected is None:
        raise ConfigError([problem])
    collected.append(problem)


@dataclass
class ModelConfig:
    name: str = _f("tiny", "Model preset.", tuple(PRESETS))
    factory: str = _f(
        "",
        "Your own model: 'package.module:function' taking ModelArgs and returning an nn.Module "
        "(see 'Custom models'). Overrides the preset's architecture, keeps its sizes.",
    )
    vocab_size: int = _f(0, "Vocabulary size; 0 keeps the preset's. Must exceed every token id.")
    dim: int = _f(0, "Model width; 0 keeps the preset's.")
    n_layers: int = _f(0, "Number of transformer blocks; 0 keeps the preset's.")
    n_heads: int = _f(0, "Attention heads; 0 keeps the preset's.")
    max_seq_len: int = _f(0, "Longest sequence the model supports; 0 keeps the preset's.")
    dropout: float = _f(0.0, "Dropout probability (0 for pretraining).")
    bias: bool = _f(True, "GPT-2 architecture: biases in the linear layers and LayerNorms (false: none, as nanoGPT's).")
    gelu: str = _f(
        "tanh", "GPT-2 architecture: the MLP's GELU, tanh-approximated (GPT-2's) or exact.", ("tanh", "exact")
    )
    init_from: str = _f(
        "",
        "A model folder to fine-tune (Hugging Face layout: config.json, safetensors, tokenizer): an input channel's "
        "name (the pipeline names the run's `init_from` channel 'base_model') or an absolute path. Its config.json "
        "sets the architecture and sizes: no preset or size override applies. Needs data.seq_len.",
    )

    def __post_init__(self) -> None:
        _require(
            self.name in PRESETS,
            "model.name",
            self.name,
            f"choose one of {', '.join(PRESETS)}" + _did_you_mean(self.name, PRESETS),
        )
        if self.init_from:
            for key in ("factory", "vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
                value = getattr(self, key)
                _require(not value, f"model.{key}", value, "the model folder of model.init_from sets it: drop it")
        if self.name in PRESETS and PRESETS[self.name].arch != "gpt2" and not self.factory:
            for key, default in (("bias", True), ("gelu", "tanh")):
                value = getattr(self, key)
                _require(
                    value == default,
                    f"model.{key}",
                    value,
                    f"it applies to the gpt2 architecture; preset {self.name!r} is {PRESETS[self.name].arch}: drop it",
                )
        _require(
            not self.factory or (":" in self.factory and all(self.factory.split(":", 1))),
            "model.factory",
            self.factory,
            "write it as 'package.module:function'",
        )
        for key in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            value = getattr(self, key)
            _require(value >= 0, f"model.{key}", value, "use a positive number, or 0 for the preset's")
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "use a value in [0, 1)")


def model_args(cfg: ModelConfig) -> ModelArgs:
    """The preset's arguments with the config's non-zero overrides applied; ConfigError if unbuildable."""
    overrides = {
        key: getattr(cfg, key)
        for key in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len")
        if getattr(cfg, key)
    }
    args = PRESETS[cfg.name].replace(**overrides, dropout=cfg.dropout, bias=cfg.bias, gelu=cfg.gelu)
    if "n_heads" in overrides and args.n_kv_heads and args.n_heads % args.n_kv_heads:
        args = args.replace(n_kv_heads=0)
    try:
        args.validate()
    except ValueError as exc:
        raise ConfigError(f"model overrides of preset {cfg.name!r} are invalid: {exc}") from exc
    return args


@dataclass
class LoraConfig:
    rank: int = _f(
        0,
        "LoRA adapters' rank: > 0 freezes the model folder's weights and trains low-rank updates of the target "
        "modules only (saved as a peft adapter beside the merged model); 0 fine-tunes every weight.",
    )
    alpha: float = _f(16.0, "LoRA's alpha: the update is scaled by alpha / rank.")
    dropout: float = _f(0.0, "Dropout on the adapters' input.")
    target_modules: str = _f(
        "",
        "Comma-separated module names as the model folder names them (peft's target_modules), e.g. "
        "q_proj,k_proj,v_proj,o_proj for Llama or c_attn,c_proj for GPT-2; empty: the attention's query and value "
        "projections (q_proj,v_proj; c_attn).",
    )

    def __post_init__(self) -> None:
        _require(self.rank >= 0, "lora.rank", self.rank, "use 0 (no adapters) or a positive rank such as 8")
        _require(self.alpha > 0, "lora.alpha", self.alpha, "use > 0, e.g. 16")
        _require(0.0 <= self.dropout < 1.0, "lora.dropout", self.dropout, "use a value in [0, 1)")


@dataclass
class DataConfig:
    seq_len: int = _f(0, "Tokens per training sequence; 0 uses the model's max_seq_len.")
    shuffle: bool = _f(True, "Visit training sequences in a seeded random order, reshuffled every epoch.")
    shift_windows: bool = _f(
        False,
        "Every epoch, start the training sequences a seeded random number of tokens (under seq_len) into each "
        "shard, so repeated epochs see the text at new alignments.",
    )

    def __post_init__(self) -> None:
        _require(self.seq_len >= 0, "data.seq_len", self.seq_len, "use a positive length, or 0")


@dataclass
class TrainConfig:
    max_steps: int = _f(1000, "Optimizer steps to train for.")
    micro_batch_size: int = _f(8, "Sequences per process per forward/backward.")
    global_batch_size: int = _f(
        0,
        "Sequences per optimizer step across all processes; a multiple of micro_batch_size x processes "
        "(the quotient is the gradient-accumulation count). 0: micro_batch_size x processes. Keep it fixed "
        "to resume on a different number of processes with the same optimisation.",
    )
    seed: int = _f(1337, "Seed for initialisation, data order and dropout.")
    deterministic: bool = _f(
        False,
        "Bit-identical reruns and resumes: deterministic kernels on GPUs, one thread per process on CPU.",
    )
    dtype: str = _f("auto", "Compute dtype; auto is bf16 on GPUs and fp32 on CPU.", ("auto", "bf16", "fp32"))
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm to this; 0 disables clipping.")

    def __post_init__(self) -> None:
        _require(self.max_steps >= 1, "train.max_steps", self.max_steps, "use at least 1")
        _require(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, "use >= 1")
        _require(
            # A micro-batch size refused above has no multiples to judge against.
            self.micro_batch_size < 1
            or self.global_batch_size == 0
            or self.global_batch_size % self.micro_batch_size == 0,
            "train.global_batch_size",
            self.global_batch_size,
            f"use 0 or a multiple of train.micro_batch_size={self.micro_batch_size}",
        )
        _require(self.global_batch_size >= 0, "train.global_batch_size", self.global_batch_size, "use >= 0")
        _require(self.seed >= 0, "train.seed", self.seed, "use a non-negative integer")
        _require(self.max_grad_norm >= 0, "train.max_grad_norm", self.max_grad_norm, "use >= 0")

    def global_batch(self, dp: int) -> int:
        """Sequences per optimizer step on `dp` data-parallel processes: global_batch_size, or micro_batch_size x
        them."""
        return self.global_batch_size or self.micro_batch_size * dp

    def grad_accum_steps(self, dp: int) -> int:
        """Micro-batches per optimizer step on each of `dp` data-parallel processes; ConfigError if the batch does
        not divide."""
        if self.global_batch_size == 0:
            return 1
        per_step = self.micro_batch_size * dp
        _require(
            self.global_batch_size % per_step == 0,
            "train.global_batch_size",
            self.global_batch_size,
            f"with {dp} data-parallel processes x micro_batch_size {self.micro_batch_size} use a multiple of "
            f"{per_step}",
        )
        return self.global_batch_size // per_step


@dataclass
class ParallelConfig:
    compile: bool = _f(False, "torch.compile each transformer block.")
    activation_checkpointing: bool = _f(False, "Recompute each block's activations in backward.")
    reshard_after_forward: bool = _f(
        True, "FSDP: free gathered parameters after forward (ZeRO-3); false keeps them (ZeRO-2)."
    )
    timeout_minutes: float = _f(10.0, "Collective timeout: how long a rank waits for a dead peer.")
    dp_replicate: int = _f(
        0,
        "Data-parallel replicas of the model: HSDP's replicate dimension under distribution=fsdp, every data-parallel "
        "process under ddp, smddp and mpi. 0: derived (1 under fsdp unless parallel.dp_shard is set).",
    )
    dp_shard: int = _f(
        0,
        "Processes each replica's parameters, gradients and optimizer states are sharded over (FSDP2; "
        "distribution=fsdp only). 0: derived, the processes tp, pp and dp_replicate leave.",
    )
    tp: int = _f(
        1,
        "Tensor-parallel degree: each block's weights split over this many processes of one host, with sequence "
        "parallelism and a loss computed on the vocabulary shards (distribution=fsdp; built-in models).",
    )
    pp: int = _f(
        1,
        "Pipeline-parallel degree: the blocks split into stages on this many processes (distribution=fsdp; "
        "built-in models).",
    )
    pp_schedule: str = _f("1f1b", "Pipeline schedule.", ("1f1b", "interleaved1f1b", "gpipe"))
    pp_stages_per_process: int = _f(
        0, "Pipeline stages each process runs; 0: 2 for interleaved1f1b, else 1 (the only value they take)."
    )
    pp_microbatches: int = _f(
        0,
        "Pipeline micro-batches each train.micro_batch_size sequences are cut into (it must divide them); 0: the "
        "number of stages (pp x stages per process).",
    )

    def __post_init__(self) -> None:
        _require(self.timeout_minutes > 0, "parallel.timeout_minutes", self.timeout_minutes, "use > 0")
        for key in ("dp_replicate", "dp_shard", "pp_stages_per_process", "pp_microbatches"):
            value = getattr(self, key)
            _require(value >= 0, f"parallel.{key}", value, "use a positive number, or 0 to derive it")
        for key in ("tp", "pp"):
            value = getattr(self, key)
            _require(value >= 1, f"parallel.{key}", value, "use 1 (off) or more")
        interleaved = self.pp_schedule == "interleaved1f1b"
        _require(
            self.pp_stages_per_process in (0, 1) or interleaved,
            "parallel.pp_stages_per_process",
            self.pp_stages_per_process,
            f"schedule {self.pp_schedule} runs one stage per process: use 1, or parallel.pp_schedule=interleaved1f1b",
        )
        _require(
            self.pp_stages_per_process != 1 or not interleaved,
            "parallel.pp_stages_per_process",
            self.pp_stages_per_process,
            "interleaved1f1b runs at least 2 stages per process: use 2 or more, or parallel.pp_schedule=1f1b",
        )

    @property
    def stages_per_process(self) -> int:
        """Pipeline stages on each process: the setting, or its default for the schedule."""
        return self.pp_stages_per_process or (2 if self.pp_schedule == "interleaved1f1b" else 1)

    @property
    def model_parallel(self) -> int:
        """Processes one copy of the model's data-parallel share spans: tp x pp."""
        return self.tp * self.pp


@dataclass
class OptimConfig:
    lr: float = _f(6e-4, "Peak learning rate of AdamW.")
    min_lr_ratio: float = _f(0.1, "Cosine decay ends at lr x min_lr_ratio.")
    warmup_steps: int = _f(100, "Linear warmup steps; must not exceed train.max_steps.")
    weight_decay: float = _f(0.1, "AdamW weight decay on matrices (not on norms, biases).")
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.95, "AdamW beta2.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    fused: bool = _f(True, "Use the fused AdamW kernel.")
    decay_steps: int = _f(
        0,
        "Step at which the cosine decay reaches lr x min_lr_ratio, counted from step 0 like the warmup; the lr "
        "stays there afterwards. 0: train.max_steps.",
    )

    def __post_init__(self) -> None:
        _require(0 < self.lr < 1, "optim.lr", self.lr, "use a value in (0, 1), e.g. 3e-4")
        _require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "use [0, 1]")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "use >= 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "use >= 0")
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            _require(0 <= value < 1, f"optim.{key}", value, "use a value in [0, 1)")
        _require(self.eps > 0, "optim.eps", self.eps, "use > 0, e.g. 1e-8")
        _require(
            self.decay_steps == 0 or self.decay_steps >= self.warmup_steps,
            "optim.decay_steps",
            self.decay_steps,
            f"use 0 or at least optim.warmup_steps={self.warmup_steps}",
        )


@dataclass
class CheckpointConfig:
    interval_steps: int = _f(500, "Save every N steps; 0 disables step-based saves.")
    interval_minutes: float = _f(30.0, "Save when this many minutes passed since the last save; 0 disables.")
    keep_last: int = _f(3, "Complete checkpoints to keep; older ones are deleted after a newer one commits.")
    async_save: bool = _f(False, "Write checkpoints in the background while training continues.")
    resume: bool = _f(True, "Resume from the newest complete checkpoint in /opt/ml/checkpoints.")

    def __post_init__(self) -> None:
        _require(self.interval_steps >= 0, "checkpoint.interval_steps", self.interval_steps, "use >= 0")
        _require(self.interval_minutes >= 0, "checkpoint.interval_minutes", self.interval_minutes, "use >= 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last, "keep at least 1")


@dataclass
class EvalConfig:
    interval_steps: int = _f(0, "Report validation loss every N steps; 0: only at the end.")
    max_sequences: int = _f(
        1024, "Validation sequences per eval: the first N of the validation set, whatever the process count."
    )
    max_batches: int = _f(
        0,
        "Periodic evaluations (every eval.interval_steps) score this many global batches of those sequences, "
        "drawn once at random with train.seed and reused, so successive evals compare; the final one scores "
        "all. 0: every eval scores all.",
    )

    def __post_init__(self) -> None:
        _require(self.interval_steps >= 0, "eval.interval_steps", self.interval_steps, "use >= 0")
        _require(self.max_sequences >= 1, "eval.max_sequences", self.max_sequences, "use >= 1")
        _require(self.max_batches >= 0, "eval.max_batches", self.max_batches, "use >= 0")


@dataclass
class MetricsConfig:
    log_interval: int = _f(10, "Log a metrics line every N steps (and at the first step and every checkpoint).")
    peak_tflops: float = _f(
        0.0, "Peak TFLOP/s per device for MFU; 0 looks the GPU up in the table. MFU is omitted when unknown."
    )
    tensorboard: bool = _f(False, "Write TensorBoard scalars under /opt/ml/output/tensorboard.")
    profile: bool = _f(False, "Record a torch.profiler trace under /opt/ml/output/data/profile.")
    profile_start_step: int = _f(10, "First profiled step.")
    profile_steps: int = _f(3, "Number of profiled steps.")

    def __post_init__(self) -> None:
        _require(self.log_interval >= 1, "metrics.log_interval", self.log_interval, "use >= 1")
        _require(self.peak_tflops >= 0, "metrics.peak_tflops", self.peak_tflops, "use >= 0")
        _require(self.profile_start_step >= 1, "metrics.profile_start_step", self.profile_start_step, "use >= 1")
        _require(self.profile_steps >= 1, "metrics.profile_steps", self.profile_steps, "use >= 1")


@dataclass
class StragglerConfig:
    action: str = _f(
        "warn",
        "A host whose ranks compute their steps slower than the other hosts' for `steps` consecutive steps is "
        "named in the log and the metrics (warn), or also stops training after a checkpoint with "
        "'StragglerDetected: ...', which the pipeline retries on fresh instances (replace); off: not checked.",
        ("warn", "replace", "off"),
    )
    threshold: float = _f(
        0.15, "How much slower than the other hosts' median rank a host's slowest rank must be (0.15: 15%)."
    )
    steps: int = _f(50, "Consecutive slow steps that make a host a straggler.")
    interval_steps: int = _f(50, "Steps between two shares of the ranks' step times (one small all-gather).")

    def __post_init__(self) -> None:
        _require(0 < self.threshold < 10, "stragglers.threshold", self.threshold, "use a fraction such as 0.15")
        _require(self.steps >= 1, "stragglers.steps", self.steps, "use >= 1")
        _require(self.interval_steps >= 1, "stragglers.interval_steps", self.interval_steps, "use >= 1")


@dataclass
class HangConfig:
    action: str = _f(
        "replace",
        "When no training worker of a host finishes a step for the hang limit, the launcher kills its workers and "
        "the job fails with 'HangDetected: ...', which the pipeline retries on fresh instances from the newest "
        "complete checkpoint (replace); off: not watched.",
        ("replace", "off"),
    )
    minutes: float = _f(
        0.0,
        "The hang limit in minutes; 0 derives it: hang.factor times the longest interval between two finished "
        "steps so far (checkpoint saves and evaluations included), at least hang.floor_minutes.",
    )
    floor_minutes: float = _f(
        10.0,
        "The derived hang limit's floor in minutes, and so the first step's limit (nothing is observed before it); "
        "raise it above your slowest first step (torch.compile), checkpoint save or evaluation.",
    )
    factor: float = _f(5.0, "The derived hang limit as a multiple of the longest interval between two finished steps.")

    def __post_init__(self) -> None:
        _require(self.minutes >= 0, "hang.minutes", self.minutes, "use > 0 for a fixed limit, or 0 to derive it")
        _require(self.floor_minutes > 0, "hang.floor_minutes", self.floor_minutes, "use > 0, e.g. 10")
        _require(self.factor >= 1, "hang.factor", self.factor, "use >= 1, e.g. 5")


@dataclass
class JobConfig:
    """The whole job: one section per component, plus the launcher's ``distribution`` and ``preflight``."""

    distribution: str = _f("ddp", ", ".join(f"{d.name} ({d.summary})" for d in DISTRIBUTIONS.values()) + ".", NAMES)
    preflight: bool = _f(
        True,
        "Before training (and any checkpoint load), check the cluster: every host sees its GPUs; on GPUs, NCCL "
        "uses EFA where the run does and, across hosts, all-reduce reaches the instance type's bandwidth floor. "
        "A failure ends the job with 'PreflightFailed: ...', which the pipeline retries on fresh nodes.",
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    hang: HangConfig = field(default_factory=HangConfig)

    def __post_init__(self) -> None:
        _require(
            self.distribution in DISTRIBUTIONS,
            "distribution",
            self.distribution,
            f"choose one of {', '.join(NAMES)}",
        )
        _require(
            self.optim.warmup_steps <= self.train.max_steps,
            "optim.warmup_steps",
            self.optim.warmup_steps,
            f"use at most train.max_steps={self.train.max_steps}",
        )
        if self.model.init_from:
            # The model folder's limit (config.json) is checked by Validate and by the trainer, which read it.
            _require(
                self.data.seq_len > 0, "data.seq_len", self.data.seq_len, "set it when fine-tuning model.init_from"
            )
        _require(
            not self.lora.rank or bool(self.model.init_from),
            "lora.rank",
            self.lora.rank,
            "adapters fine-tune a model folder: set model.init_from, or use 0",
        )
        if self.model.name not in PRESETS:
            return  # refused by the model's own rule; its length is unknown
        max_seq_len = self.model.max_seq_len or PRESETS[self.model.name].max_seq_len
        _require(
            self.model.init_from != "" or self.data.seq_len <= max_seq_len,
            "data.seq_len",
            self.data.seq_len,
            f"use at most the model's max_seq_len={max_seq_len} (or raise model.max_seq_len)",
        )
        problems = self.layout_problems()
        if problems:
            raise ConfigError("; ".join(problems))

    def layout_problems(self) -> list[str]:
        """What the parallel layout cannot do with this distribution, model and batch, whatever the cluster."""
        par, problems = self.parallel, list[str]()
        if self.distribution not in DISTRIBUTIONS:
            return problems  # the distribution's own rule names it
        mesh = DISTRIBUTIONS[self.distribution].shards_parameters
        split = [f"parallel.{key}={getattr(par, key)}" for key in ("tp", "pp") if getattr(par, key) > 1]
        if par.dp_shard > 1:
            split.append(f"parallel.dp_shard={par.dp_shard}")
        if split and not mesh:
            problems.append(
                f"{' and '.join(split)} need distribution=fsdp (FSDP2 on a device mesh); distribution="
                f"{self.distribution} keeps a whole replica on every process (set parallel.dp_shard=1 under fsdp to "
                "replicate rather than shard)"
            )
        if par.model_parallel == 1:
            return problems
        if self.model.factory:
            problems.append(
                f"parallel.tp={par.tp} and parallel.pp={par.pp} split the built-in architectures only; "
                f"model.factory={self.model.factory!r} is your own: use parallel.tp=1 and parallel.pp=1 (FSDP shards "
                "it)"
            )
            return problems
        if self.model.init_from:
            if self.lora.rank:
                # The tensor-parallel plans split whole nn.Linear layers, and make each split weight trainable: an
                # adapter's frozen base and low-rank factors would need plans of their own.
                problems.append(
                    f"parallel.tp={par.tp} and parallel.pp={par.pp} split a model folder's own weights, not LoRA "
                    f"adapters (lora.rank={self.lora.rank}): use parallel.tp=1 and parallel.pp=1 (FSDP shards the "
                    "frozen weights), or lora.rank=0"
                )
            return problems  # the folder's sizes are judged once it is read: split_problems
        return problems + self.split_problems(model_args(self.model))

    def split_problems(self, args: ModelArgs) -> list[str]:
        """What tensor and pipeline parallelism need of the model's sizes (`args`: a preset's or a model folder's)
        and of the batch."""
        return _tensor_parallel_problems(args, self.parallel.tp, self.seq_len) + _pipeline_problems(
            args, self.parallel, self.train.micro_batch_size
        )

    @property
    def seq_len(self) -> int:
        return self.data.seq_len or self.model.max_seq_len or PRESETS[self.model.name].max_seq_len

    def data_parallel(self, processes: int) -> int:
        """The data-parallel processes of `processes`: those tp x pp leave (contract/mesh.py checks they divide)."""
        return max(1, processes // self.parallel.model_parallel)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def packed_rows_problem(pp: int) -> str | None:
    """Why fine-tuning examples (rows packed with their documents' ids) cannot run in `pp` pipeline stages."""
    if pp == 1:
        return None
    # A pipeline stage's input is the previous stage's output alone: the rows' document ids cannot follow.
    return (
        f"parallel.pp={pp}: fine-tuning examples are packed rows whose document ids a pipeline stage cannot pass on;"
        " use parallel.pp=1 (parallel.tp splits the model instead), or token windows"
    )


def _tensor_parallel_problems(args: ModelArgs, tp: int, seq_len: int) -> list[str]:
    """Sizes tensor parallelism splits into tp equal shards: heads, widths, the vocabulary and the sequence."""
    if tp == 1:
        return []
    sizes = {
        "model.n_heads": args.n_heads,
        "the model's KV heads": args.kv_heads,
        "model.dim": args.dim,
        "the feed-forward width": args.hidden_dim,
        "model.vocab_size": args.vocab_size,
        "data.seq_len (sequence parallelism)": seq_len,
    }
    uneven = [f"{name}={size}" for name, size in sizes.items() if size % tp]
    if not uneven:
        return []
    fits = [d for d in range(1, tp + 1) if all(size % d == 0 for size in sizes.values())]
    return [
        f"parallel.tp={tp} must divide {', '.join(uneven)} (tensor parallelism splits them in equal shards); "
        f"use parallel.tp={max(fits)} or a model whose sizes it divides"
    ]


def _pipeline_problems(args: ModelArgs, par: ParallelConfig, micro_batch_size: int) -> list[str]:
    """What the pipeline's stages and micro-batches need of the model and the batch."""
    if par.pp == 1:
        return []
    problems = []
    stages = par.pp * par.stages_per_process
    if stages > args.n_layers + 2:
        problems.append(
            f"parallel.pp={par.pp} x {par.stages_per_process} stages per process = {stages} stages exceed the "
            f"model's {args.n_layers} blocks plus its embedding and head; lower parallel.pp"
        )
    microbatches = par.pp_microbatches or stages
    if micro_batch_size % microbatches:
        problems.append(
            f"parallel.pp_microbatches={microbatches} must divide train.micro_batch_size={micro_batch_size} (the "
            "pipeline cuts each micro-batch into equal micro-batches); set train.micro_batch_size to a multiple of it"
        )
    if par.pp_schedule == "1f1b" and microbatches < par.pp:
        problems.append(
            f"parallel.pp_microbatches={microbatches}: schedule 1f1b needs at least one per stage ({par.pp}); "
            f"use parallel.pp_microbatches={par.pp} or more"
        )
    rounds = max(1, microbatches // par.pp)
    if par.pp_schedule == "interleaved1f1b" and microbatches % rounds:
        problems.append(
            f"parallel.pp_microbatches={microbatches}: schedule interleaved1f1b runs them in rounds of {par.pp}; "
            f"use a multiple of {par.pp} (or fewer than {par.pp})"
        )
    return problems


# Short spellings of the most used keys. Giving both an alias and its target is an error.
ALIASES: dict[str, str] = {
    "model": "model.name",
    "max_steps": "train.max_steps",
    "lr": "optim.lr",
    "seed": "train.seed",
    "seq_len": "data.seq_len",
    "batch_size": "train.micro_batch_size",
}


@dataclass(frozen=True)
class Hyperparameter:
    """One accepted key: where it lands, its type, default, allowed values and help text."""

    name: str
    section: str  # "" for top-level fields
    field_name: str
    type: type
    default: object
    choices: tuple[str, ...]
    help: str


def _hyperparameters() -> Iterator[Hyperparameter]:
    hints = typing.get_type_hints(JobConfig)
    for top in dataclasses.fields(JobConfig):
        kind = hints[top.name]
        if dataclasses.is_dataclass(kind):
            section_hints = typing.get_type_hints(kind)
            for sub in dataclasses.fields(kind):
                yield Hyperparameter(
                    name=f"{top.name}.{sub.name}",
                    section=top.name,
                    field_name=sub.name,
                    type=section_hints[sub.name],
                    default=sub.default,
                    choices=sub.metadata["choices"],
                    help=sub.metadata["help"],
                )
        else:
            yield Hyperparameter(
                name=top.name,
                section="",
                field_name=top.name,
                type=kind,
                default=top.default,
                choices=top.metadata["choices"],
                help=top.metadata["help"],
            )


HYPERPARAMETERS: dict[str, Hyperparameter] = {hp.name: hp for hp in _hyperparameters()}
_SECTION_TYPES: dict[str, Any] = typing.get_type_hints(JobConfig)  # resolved once: most of a parse's time otherwise


def hyperparameter_names() -> list[str]:
    """Every key :func:`from_hyperparameters` accepts: dotted names, ``distribution`` and the aliases."""
    return sorted([*HYPERPARAMETERS, *ALIASES])


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _coerce(key: str, raw: object, spec: Hyperparameter) -> object:
    value = raw
    if isinstance(value, str):
        value = value.strip()
        # The SageMaker SDK JSON-encodes string hyperparameters ('"fsdp"'): unwrap one level.
        if len(value) >= 2 and value[0] == value[-1] == '"':
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
    kind = spec.type
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).lower() in _TRUE | _FALSE:
            return str(value).lower() in _TRUE
        raise ConfigError(f"hyperparameter {key}={raw!r} is invalid: use true or false", key)
    if kind is int:
        number = _number(value)
        if number is None or isinstance(value, bool) or not float(number).is_integer():
            raise ConfigError(f"hyperparameter {key}={raw!r} is invalid: use an integer, e.g. {spec.default}", key)
        return int(number)
    if kind is float:
        number = _number(value)
        if number is None or isinstance(value, bool) or not math.isfinite(number):
            raise ConfigError(f"hyperparameter {key}={raw!r} is invalid: use a number, e.g. {spec.default}", key)
        return float(number)
    if not isinstance(value, str):
        raise ConfigError(f"hyperparameter {key}={raw!r} is invalid: use a string", key)
    if spec.choices and value not in spec.choices:
        raise ConfigError(
            f"hyperparameter {key}={raw!r} is invalid: choose one of {', '.join(spec.choices)}"
            + _did_you_mean(value, spec.choices),
            key,
        )
    return value


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _did_you_mean(word: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def from_hyperparameters(hyperparameters: Mapping[str, object]) -> JobConfig:
    """Build the config from SageMaker's hyperparameters.json (values usually strings); ConfigError naming every
    problem (unknown keys, values of the wrong type, each field's and cross-field rules) if any."""
    resolved, refused, problems = _resolve(hyperparameters)
    top: dict[str, object] = {}
    sections: dict[str, dict[str, object]] = {}
    for name, (_, value) in resolved.items():
        spec = HYPERPARAMETERS[name]
        if spec.section:
            sections.setdefault(spec.section, {})[spec.field_name] = value
        else:
            top[spec.field_name] = value
    ruled: list[ConfigProblem] = []
    token = _COLLECTED.set(ruled)
    try:
        for section, values in sections.items():
            top[section] = _SECTION_TYPES[section](**values)
        config = JobConfig(**top)  # type: ignore[arg-type]
    finally:
        _COLLECTED.reset(token)
    # A rule names the field's dotted name; the problem is the key as given (an alias, say). A rule of a refused
    # field, or one that judged another field against a refused one's default, would only repeat that problem.
    given = {name: key for name, (key, _) in resolved.items()}
    problems += [
        dataclasses.replace(p, key=given.get(p.key, p.key))
        for p in ruled
        if p.key not in refused and not any(name in p.message for name in refused)
    ]
    if problems:
        raise ConfigError(problems)
    return config


def _resolve(
    hyperparameters: Mapping[str, object],
) -> tuple[dict[str, tuple[str, object]], set[str], list[ConfigProblem]]:
    """Each field's (key as given, value), the fields whose values were refused, and the problems found so far."""
    problems: list[ConfigProblem] = []
    resolved: dict[str, tuple[str, object]] = {}
    refused: set[str] = set()
    for key, raw in hyperparameters.items():
        if key.startswith(IGNORED_PREFIXES):
            continue
        name = ALIASES.get(key, key)
        if name not in HYPERPARAMETERS:
            message = (
                f"unknown hyperparameter {key!r}"
                + _did_you_mean(key, hyperparameter_names())
                + "; the accepted names are listed in docs/reference/hyperparameters.md"
            )
            problems.append(ConfigProblem(key, message))
        elif name in resolved:
            message = f"hyperparameter {name} is given twice (as {resolved[name][0]!r} and {key!r}); keep one"
            problems.append(ConfigProblem(key, message))
        else:
            try:
                resolved[name] = (key, _coerce(key, raw, HYPERPARAMETERS[name]))
            except ConfigError as exc:
                problems.extend(exc.problems)
                refused.add(name)
                if isinstance(raw, str) and HYPERPARAMETERS[name].choices:
                    resolved[name] = (key, raw.strip())  # the rules that read it see that it is none of them
    return resolved, refused, problems


def parse_overrides(pairs: typing.Iterable[str]) -> dict[str, str]:
    """``["optim.lr=3e-4", ...]`` from the command line into a hyperparameters dict."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--hp {pair!r} is invalid: write KEY=VALUE, e.g. --hp optim.lr=3e-4")
        out[key.strip()] = value
    return out


def hyperparameters_markdown() -> str:
    """The hyperparameters reference page's table (docs/reference/hyperparameters.md), from the field declarations."""
    rows = ["| Hyperparameter | Default | Description |", "|---|---|---|"]
    for spec in HYPERPARAMETERS.values():
        default = json.dumps(spec.default) if not isinstance(spec.default, str) else spec.default or '""'
        text = spec.help + (f" One of: {', '.join(spec.choices)}." if spec.choices else "")
        rows.append(f"| `{spec.name}` | `{default}` | {text} |")
    rows.append("")
    rows.append("| Alias | Same as |")
    rows.append("|---|---|")
    rows.extend(f"| `{alias}` | `{target}` |" for alias, target in ALIASES.items())
    return "\n".join(rows)

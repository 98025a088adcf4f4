"""The memory plan: what each GPU of a job holds, by the layout, before anything is launched.

Torch-free, and the one memory model of the platform: Validate refuses a plan over the GPU's memory (a built-in
model's, or a fine-tuned model folder's) and names the cheapest layout that fits, Estimate and `tp estimate` show
it.

What a process holds, in bytes (its pipeline stages' share of the model, split by tensor parallelism, sharded
by FSDP2 over dp_shard):

- **parameters**: fp32 master weights (a model folder's frozen ones too). FSDP2 pads each rank's shard of a
  weight to the first rank's (its rows are cut in dp_shard equal chunks, the last ones shorter or empty), and
  allocates the padded shard;
- **gradients**: as the parameters (FSDP2 reduce-scatters into padded shards; DDP keeps one per parameter);
- **optimizer states**: AdamW's two moments, shaped like each rank's own (unpadded) shard, and its step (one
  fp32 scalar per parameter); with LoRA adapters, gradients and states are the adapters' alone (counted, not
  shaped: 4 and 8 bytes a trained parameter, sharded);
- **activations**: the tensors the forward keeps for the backward, per block and token, as the built-in
  blocks' operations save them (`_block_saves`), for the micro-batches a pipeline stage holds at once, and the
  head's logits and log-softmax; with activation checkpointing, each block's input and one block recomputed;
- **buffers**: FSDP2's gathered weights and unsharded gradients (in the compute dtype; the head and embedding
  stay gathered through the step, and under a pipeline every block's), DDP's gradient buckets and autocast's
  weight copies. An estimate: not measured exactly anywhere.

Parameters, gradients and optimizer states match the bytes measured on CPU exactly, activations the most bytes
autograd holds for the backward at once (every layout and pipeline schedule) within 20%
(tests/training/test_memory_plan.py; docs/BENCHMARKS.md has the figures).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from contract.catalog import INSTANCE_TYPES, InstanceType
from contract.config import HYPERPARAMETERS, ConfigError, JobConfig, from_hyperparameters, model_args
from contract.distributions import DISTRIBUTIONS
from contract.execution_state import TRAIN_ROLE, InstanceGroup
from contract.mesh import (
    Layout,
    layout_problems,
    microbatches_in_flight,
    resolve_layout,
    stage_blocks,
    stage_ids,
)
from contract.model_args import ModelArgs

GIB = 1 << 30
MARGIN = 0.10
"""The share of a GPU's memory a plan leaves free: the CUDA context, NCCL's buffers, the allocator's
fragmentation and what the trainer holds besides the model (data, checkpoint staging)."""
FP32 = 4
ACCELERATOR_MEMORY_GIB = {
    "T4": 16,
    "A10G": 24,
    "L4": 24,
    "L40S": 48,
    "V100": 16,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
}
"""Memory per GPU by the catalog's accelerator (NVIDIA's datasheets)."""
TYPE_MEMORY_GIB = {"ml.p3dn.24xlarge": 32}
"""Types whose GPUs have more memory than their accelerator's row says (p3dn's V100s have 32 GB)."""
NO_BF16 = {"T4", "V100"}
"""GPUs before compute capability 8.0: train.dtype=auto computes in fp32 there (torch.cuda.is_bf16_supported)."""


def gpu_memory_bytes(instance: InstanceType) -> int | None:
    """Memory of one of the type's CUDA GPUs, or None (no CUDA GPUs, or an accelerator not in the table)."""
    if not instance.cuda_gpus:
        return None
    gib_ = TYPE_MEMORY_GIB.get(instance.name, ACCELERATOR_MEMORY_GIB.get(instance.accelerator))
    return gib_ * GIB if gib_ is not None else None


# How tensor parallelism splits a weight: its rows (column-parallel, Shard(0)), its columns (row-parallel,
# Shard(1)), or not at all (replicated: norms, and the biases of row-parallel layers). training/parallel/tensor.py
# applies the plans; a test checks each split against the shards it makes.
ROWS, COLS, WHOLE = "rows", "cols", "whole"


@dataclass(frozen=True)
class Weight:
    name: str
    shape: tuple[int, ...]
    split: str
    """How tensor parallelism splits it: ROWS, COLS or WHOLE."""
    block: int | None = None
    """The block it belongs to; None for the embedding's and the head's weights."""
    head: bool = False
    """A weight of the head (after the blocks), not of the embedding."""
    tied: bool = False
    """The token embedding that is also the head's weight: the last pipeline stage holds it too."""


def _gpt2_block(args: ModelArgs, i: int) -> Iterator[Weight]:
    c, h, p = args.dim, args.hidden_dim, f"layers.{i}."
    norms = [(f"{p}ln_1", c), (f"{p}ln_2", c)]
    for name, size in norms:
        yield Weight(f"{name}.weight", (size,), WHOLE, i)
        if args.bias:
            yield Weight(f"{name}.bias", (size,), WHOLE, i)
    for name, out, into, split in (
        ("attn.c_attn", 3 * c, c, ROWS),
        ("attn.c_proj", c, c, COLS),
        ("mlp.c_fc", h, c, ROWS),
        ("mlp.c_proj", c, h, COLS),
    ):
        yield Weight(f"{p}{name}.weight", (out, into), split, i)
        if args.bias:
            yield Weight(f"{p}{name}.bias", (out,), ROWS if split == ROWS else WHOLE, i)


def _llama_block(args: ModelArgs, i: int) -> Iterator[Weight]:
    c, h, q, kv, p = (
        args.dim,
        args.hidden_dim,
        args.n_heads * args.head_dim,
        args.kv_heads * args.head_dim,
        f"layers.{i}.",
    )
    yield Weight(f"{p}attention_norm.weight", (c,), WHOLE, i)
    yield Weight(f"{p}attention.wq.weight", (q, c), ROWS, i)
    yield Weight(f"{p}attention.wk.weight", (kv, c), ROWS, i)
    yield Weight(f"{p}attention.wv.weight", (kv, c), ROWS, i)
    yield Weight(f"{p}attention.wo.weight", (c, q), COLS, i)
    yield Weight(f"{p}ffn_norm.weight", (c,), WHOLE, i)
    yield Weight(f"{p}feed_forward.w1.weight", (h, c), ROWS, i)
    yield Weight(f"{p}feed_forward.w2.weight", (c, h), COLS, i)
    yield Weight(f"{p}feed_forward.w3.weight", (h, c), ROWS, i)


@functools.cache
def weights(args: ModelArgs) -> tuple[Weight, ...]:
    """Every weight of a built-in model, under the model's names; a tied head is its embedding's weight."""
    c, v = args.dim, args.vocab_size
    if args.arch == "gpt2":
        edge = [
            Weight("wte.weight", (v, c), ROWS, tied=args.tie_embeddings),
            Weight("wpe.weight", (args.max_seq_len, c), ROWS),
        ]
        blocks = [w for i in range(args.n_layers) for w in _gpt2_block(args, i)]
        tail = [Weight("ln_f.weight", (c,), WHOLE, head=True)]
        if args.bias:
            tail.append(Weight("ln_f.bias", (c,), WHOLE, head=True))
        head = "lm_head.weight"
    else:
        edge = [Weight("tok_embeddings.weight", (v, c), ROWS, tied=args.tie_embeddings)]
        blocks = [w for i in range(args.n_layers) for w in _llama_block(args, i)]
        tail = [Weight("norm.weight", (c,), WHOLE, head=True)]
        head = "output.weight"
    if not args.tie_embeddings:
        tail.append(Weight(head, (v, c), ROWS, head=True))
    return (*edge, *blocks, *tail)


def _chunk(size: int, parts: int, index: int) -> int:
    """The length of part `index` when torch.chunk cuts `size` in `parts` (the last ones shorter or empty)."""
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


def _local_shape(w: Weight, tp: int, tp_rank: int) -> tuple[int, ...]:
    shape = list(w.shape)
    if w.split == ROWS:
        shape[0] = _chunk(shape[0], tp, tp_rank)
    elif w.split == COLS:
        shape[1] = _chunk(shape[1], tp, tp_rank)
    return tuple(shape)


@dataclass(frozen=True)
class Shard:
    """One weight as one process holds it: its own elements and those of its padded FSDP2 shard."""

    weight: Weight
    own: int
    padded: int


def shards(args: ModelArgs, layout: Layout, rank: int, *, fsdp: bool = True) -> list[Shard]:
    """The weights the process `rank` holds (its stages', split and sharded as the layout says)."""
    at = layout.coordinates(rank)
    blocks, first, last = _stage_contents(args, layout, at["pp"])
    out = []
    for w in weights(args):
        embedding = w.block is None and not w.head
        holds = (w.block in blocks) if w.block is not None else (embedding and first) or ((w.head or w.tied) and last)
        if not holds:
            continue
        shape = _local_shape(w, layout.tp, at["tp"])
        rest = math.prod(shape[1:])
        if fsdp:
            own = _chunk(shape[0], layout.dp_shard, at["dp_shard"]) * rest
            padded = -(-shape[0] // layout.dp_shard) * rest
        else:
            own = padded = math.prod(shape)
        out.append(Shard(w, own, padded))
    return out


def _stage_contents(args: ModelArgs, layout: Layout, pp_rank: int) -> tuple[set[int], bool, bool]:
    """The blocks of the stages at `pp_rank`, whether it runs the first stage (the embedding), the last (the head)."""
    plan = stage_blocks(args.n_layers, layout.stages)
    ids = stage_ids(layout, pp_rank) if layout.pp > 1 else [0]
    return {b for i in ids for b in plan[i]}, 0 in ids, layout.stages - 1 in ids


@dataclass(frozen=True)
class Training:
    """What the plan needs besides the model and the layout."""

    micro_batch_size: int
    seq_len: int
    compute_bytes: int = 2
    """2 for bf16 (GPUs that have it), 4 for fp32."""
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    fsdp: bool = True
    """False: DDP (every process a whole replica)."""
    trained: int | None = None
    """The parameters trained when not all are (LoRA adapters): only they have gradients and optimizer states."""
    fused_norms: bool = True
    """Llama's RMSNorm runs as one kernel (CUDA); False on the CPU, where it is a composite that keeps more."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes one process holds at its peak, by kind."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.buffers


def _block_saves(args: ModelArgs, tp: int, c: int, *, fused_norms: bool) -> float:
    """Bytes one block keeps per token for its backward, as its operations save them (on each process of a
    tensor-parallel group: sequence-split activations are 1/tp, the gathered inputs of the matmuls whole, GPT-2's
    attention whole, as every process computes all of its heads). `fused_norms`: RMSNorm runs as one kernel."""
    dim, hidden, heads = args.dim, args.hidden_dim, args.n_heads
    if args.arch == "llama":
        # Each norm's input and fp32 reciprocal RMS (2); the attention's rotated q, k and v repeated to every head
        # and its output, with its fp32 log-sum-exp per head; the output projection's input: 7 x dim / tp. The
        # matmuls' inputs, the norms' outputs (gathered under tensor parallelism): 2 x dim. SiLU's input and
        # output, w3's output and the product w2 multiplies: 4 x hidden / tp. An RMSNorm of plain tensors on the
        # CPU is a composite of operations, which also keeps the normalised input before its weight (2 x dim);
        # CUDA and DTensor (tensor parallelism) run the fused kernel.
        unfused = 0 if fused_norms or tp > 1 else 2 * dim
        return c * ((7 * dim + 4 * hidden) / tp + 2 * dim + unfused) + FP32 * (2 + heads) / tp
    # GPT-2: norm inputs (2) and the output projection's input: 3 x dim / tp; gathered normed inputs (2), q, k,
    # v and the attention output, all heads: 6 x dim; GELU's input and output: 2 x hidden / tp; fp32 means and
    # deviations of 2 norms (LayerNorm is one kernel everywhere), the log-sum-exp per head.
    return c * ((3 * dim + 2 * hidden) / tp + 6 * dim) + FP32 * (4 / tp + heads)


def _head_saves(args: ModelArgs, tp: int, c: int, *, fused_norms: bool) -> float:
    """Bytes the final norm, the head and the loss hold per token: the norm's input (split) and gathered output
    (and Llama's normalised input before the weight, unfused), the logits in the compute dtype, in fp32 and their
    log-softmax, each split over the vocabulary."""
    logits = args.vocab_size / tp * (c + FP32 + (FP32 if c != FP32 else 0))
    unfused = args.dim if args.arch == "llama" and not fused_norms and tp == 1 else 0
    return c * (args.dim / tp + args.dim + unfused) + FP32 / tp + logits


def plan(args: ModelArgs, layout: Layout, training: Training, rank: int) -> MemoryPlan:
    """The bytes process `rank` holds at its peak."""
    held = shards(args, layout, rank, fsdp=training.fsdp)
    parameters = gradients = sum(s.padded for s in held) * FP32
    optimizer = sum(2 * s.own * FP32 + FP32 for s in held)
    if training.trained is not None:
        share = layout.processes // layout.dp_replicate if training.fsdp else 1
        gradients, optimizer = -(-FP32 * training.trained // share), -(-2 * FP32 * training.trained // share)
    at = layout.coordinates(rank)
    blocks, _, last = _stage_contents(args, layout, at["pp"])
    return MemoryPlan(
        parameters=parameters,
        gradients=gradients,
        optimizer_states=optimizer,
        activations=_activations(args, layout, training, pp_rank=at["pp"], blocks=len(blocks), last=last),
        buffers=_buffers(held, layout, training),
    )


def _activations(args: ModelArgs, layout: Layout, training: Training, *, pp_rank: int, blocks: int, last: bool) -> int:
    c, tp, fused = training.compute_bytes, layout.tp, training.fused_norms
    tokens = training.micro_batch_size // layout.microbatches * training.seq_len
    block = _block_saves(args, tp, c, fused_norms=fused)
    head = _head_saves(args, tp, c, fused_norms=fused) if last else 0.0
    in_flight = microbatches_in_flight(layout, pp_rank)
    per_stage = blocks / layout.stages_per_process  # a chunk of an interleaved schedule holds its share
    if training.activation_checkpointing:
        kept = in_flight * per_stage * args.dim / tp * c
        return int(tokens * (kept + max(block, head)))
    heads_held = layout.microbatches if layout.pp_schedule == "gpipe" and layout.pp > 1 else 1
    return int(tokens * (in_flight * per_stage * block + heads_held * head))


def _buffers(held: list[Shard], layout: Layout, training: Training) -> int:
    c = training.compute_bytes
    if not training.fsdp:
        full = sum(s.own for s in held)
        # DDP's buckets hold a copy of the gradients; autocast keeps a compute-dtype copy of the weights.
        return full * FP32 + (full * c if c != FP32 else 0)
    gathered: dict[int | None, int] = {}
    for s in held:
        gathered[s.weight.block] = gathered.get(s.weight.block, 0) + s.padded * layout.dp_shard
    root = gathered.pop(None, 0)
    largest = max(gathered.values(), default=0)
    if layout.pp > 1 or not training.reshard_after_forward:
        # Every block stays gathered (and, under a pipeline, its gradient unsharded until the last micro-batch).
        kept = sum(gathered.values()) * (2 if layout.pp > 1 else 1)
        return (root + kept) * c + largest * FP32
    # The block running and the next one prefetched, and one block's gradients on their way to be reduced.
    return (root + 2 * largest) * c + largest * FP32


def worst(args: ModelArgs, layout: Layout, training: Training) -> tuple[int, MemoryPlan]:
    """The process that holds the most, and its plan. Only the first process of each pipeline stage is planned:
    the first of a data- or tensor-parallel group holds the largest chunk of every weight."""
    stage_size = layout.processes // layout.pp
    plans = {rank: plan(args, layout, training, rank) for rank in range(0, layout.processes, stage_size)}
    rank = max(plans, key=lambda r: plans[r].total)
    return rank, plans[rank]


def training_of(cfg: JobConfig, instance: InstanceType | None, trained: int | None = None) -> Training:
    """The plan's view of a job's config on hosts of `instance` (None: CPU, fp32)."""
    gpu_bf16 = instance is not None and instance.cuda and instance.accelerator not in NO_BF16
    bf16 = cfg.train.dtype == "bf16" or (cfg.train.dtype == "auto" and gpu_bf16)
    return Training(
        trained=trained,
        micro_batch_size=cfg.train.micro_batch_size,
        seq_len=cfg.seq_len,
        compute_bytes=2 if bf16 else FP32,
        activation_checkpointing=cfg.parallel.activation_checkpointing,
        reshard_after_forward=cfg.parallel.reshard_after_forward,
        fsdp=DISTRIBUTIONS[cfg.distribution].shards_parameters,
        fused_norms=instance is not None and instance.cuda,
    )


def usable_bytes(instance: InstanceType) -> int:
    """What one process may hold on a GPU of `instance`: its memory less MARGIN (0 without known GPU memory)."""
    return int((gpu_memory_bytes(instance) or 0) * (1 - MARGIN))


@dataclass(frozen=True)
class Fit:
    """A layout and its plan on a cluster."""

    hyperparameters: dict[str, str]
    """The hyperparameters that ask for it (besides the job's others)."""
    layout: Layout
    rank: int
    plan: MemoryPlan
    instances: int


def plan_job(
    hyperparameters: Mapping[str, str],
    instance: InstanceType,
    instances: int,
    *,
    args: ModelArgs | None = None,
    trained: int | None = None,
) -> Fit | None:
    """The plan of a job of these hyperparameters on `instances` hosts of `instance` (its worst process), or None
    when the config or its layout is refused there (those refusals have messages of their own). `args`: the
    model's shape when it is not the config's (a model folder's config.json); `trained`: its LoRA adapters'
    parameters."""
    try:
        cfg = from_hyperparameters(hyperparameters)
    except ConfigError:
        return None
    per_host = max(instance.cuda_gpus, 1)
    if layout_problems(cfg, instances * per_host, per_host):
        return None
    layout = resolve_layout(cfg, instances * per_host, per_host)
    rank, worst_plan = worst(args or model_args(cfg.model), layout, training_of(cfg, instance, trained))
    return Fit(dict(hyperparameters), layout, rank, worst_plan, instances)


def _candidates(hyperparameters: Mapping[str, str], processes: int, per_host: int) -> Iterator[dict[str, str]]:
    """Layouts to try, cheapest first: the least model parallelism (pipeline stages, then tensor-parallel
    processes), and at each, without activation checkpointing before with it."""
    cfg = from_hyperparameters(hyperparameters)
    micro = cfg.train.micro_batch_size
    for pp in (d for d in range(1, processes + 1) if processes % d == 0):
        for tp in (d for d in range(1, per_host + 1) if per_host % d == 0 and (processes // pp) % d == 0):
            for checkpointing in (False, True):
                changes = {
                    "distribution": "fsdp",
                    "parallel.tp": str(tp),
                    "parallel.pp": str(pp),
                    "parallel.dp_shard": "0",
                    "parallel.dp_replicate": "0",
                    "parallel.activation_checkpointing": str(checkpointing).lower(),
                }
                if pp > 1:
                    # One sequence per pipeline micro-batch: the fewest activations in flight.
                    changes.update({"parallel.pp_schedule": "1f1b", "parallel.pp_microbatches": str(micro)})
                yield changes


def cheapest_fit(
    hyperparameters: Mapping[str, str],
    instance: InstanceType,
    instances: int,
    *,
    args: ModelArgs | None = None,
    trained: int | None = None,
    more_hosts: int = 8,
) -> Fit | None:
    """The cheapest layout whose plan fits a GPU of `instance` on `instances` hosts, or on up to `more_hosts` times
    as many (doubling: more hosts are dearer than any layout); None when none does."""
    usable = usable_bytes(instance)
    count = instances
    while count <= instances * more_hosts:
        per_host = max(instance.cuda_gpus, 1)
        for changes in _candidates(hyperparameters, count * per_host, per_host):
            fit = plan_job({**hyperparameters, **changes}, instance, count, args=args, trained=trained)
            if fit is not None and fit.plan.total <= usable:
                return Fit(changes, fit.layout, fit.rank, fit.plan, count)
        count *= 2
    return None


def _values(cfg: JobConfig) -> dict[str, str]:
    """The config's values as hyperparameters spell them."""
    out = {}
    for name, spec in HYPERPARAMETERS.items():
        value = getattr(getattr(cfg, spec.section), spec.field_name) if spec.section else getattr(cfg, name)
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def describe_plan(plan_: MemoryPlan) -> str:
    parts = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
    return ", ".join(f"{name.replace('_', ' ')} {gib(getattr(plan_, name))}" for name in parts)


def training_cluster(groups: Iterable[InstanceGroup]) -> tuple[InstanceType, int] | None:
    """The training hosts' type and count, when they are one type whose GPU memory is known (else not planned)."""
    training = [group for group in groups if group.role == TRAIN_ROLE]
    types = {group.instance_type for group in training}
    if len(types) != 1:
        return None
    instance = INSTANCE_TYPES[types.pop()]
    return (instance, sum(group.instance_count for group in training)) if usable_bytes(instance) else None


def describe_fit(fit: Fit, instance: InstanceType) -> str:
    """A plan against the GPU, as Estimate and `tp estimate` show it."""
    gpu = gpu_memory_bytes(instance) or 0
    stage = f" of pipeline stage {fit.layout.coordinates(fit.rank)['pp']}" if fit.layout.pp > 1 else ""
    return (
        f"{gib(fit.plan.total)} on a process{stage} ({fit.layout.describe()}: {describe_plan(fit.plan)}) of the "
        f"{gib(usable_bytes(instance))} a process may use on {instance.name}'s {gpu // GIB} GiB {instance.accelerator}"
        f" ({MARGIN:.0%} kept free for CUDA, NCCL and fragmentation)"
    )


def memory_problem(
    hyperparameters: Mapping[str, str],
    groups: Iterable[InstanceGroup],
    *,
    args: ModelArgs | None = None,
    trained: int | None = None,
) -> str | None:
    """Why a job of these hyperparameters does not fit the GPUs of its training hosts, with the cheapest layout
    that does; None when it fits (or is not planned: no GPUs, hosts of several types, a refused config)."""
    cluster = training_cluster(groups)
    if cluster is None:
        return None
    instance, instances = cluster
    fit = plan_job(hyperparameters, instance, instances, args=args, trained=trained)
    if fit is None or fit.plan.total <= usable_bytes(instance):
        return None
    text = f"the memory plan holds {describe_fit(fit, instance).replace(' of the ', ', over the ', 1)}"
    cheaper = cheapest_fit(hyperparameters, instance, instances, args=args, trained=trained)
    if cheaper is None:
        return (
            text + "; no layout fits on up to 8 times as many instances: lower train.micro_batch_size or data.seq_len"
        )
    current = _values(from_hyperparameters(hyperparameters))
    changes = " ".join(f"{k}={v}" for k, v in cheaper.hyperparameters.items() if current[k] != v)
    on = "" if cheaper.instances == instances else f" on instance_count={cheaper.instances}"
    return f"{text}; the cheapest layout that fits{on}: {changes} ({gib(cheaper.plan.total)} a process)"


def job_memory(
    hyperparameters: Mapping[str, str],
    groups: Iterable[InstanceGroup],
    *,
    args: ModelArgs | None = None,
    trained: int | None = None,
) -> str | None:
    """The plan of a job's process that holds the most, described against its GPU; None when not planned."""
    cluster = training_cluster(groups)
    if cluster is None:
        return None
    fit = plan_job(hyperparameters, cluster[0], cluster[1], args=args, trained=trained)
    return describe_fit(fit, cluster[0]) if fit is not None else None


RECOMMENDED_MODELS = ("llama-3.1-8b", "llama-3.1-70b")
RECOMMENDED_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge")
RECOMMENDED_JOB = {"distribution": "fsdp", "data.seq_len": "8192", "train.micro_batch_size": "1"}
"""The job the recommendations are for: Llama 3's context, one sequence per process and step, bf16 on these GPUs."""


def recommended(model: str, instance: InstanceType, *, most_hosts: int = 64) -> Fit | None:
    """The fewest hosts of `instance` (1, 2, 4, ...) on which a layout of `model` fits, with the cheapest layout
    there (contract/memory.py's order)."""
    return cheapest_fit({**RECOMMENDED_JOB, "model.name": model}, instance, 1, more_hosts=most_hosts)


def recommendations_markdown() -> str:
    """The recommended layout of each preset per supported instance type: docs/reference/parallel-layouts.md's
    table (written by `python -m tools.docs --write`)."""
    rows = [
        "| Model | Instance type | Hosts | Layout | Hyperparameters | Per GPU | Of which activations |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model in RECOMMENDED_MODELS:
        for name in RECOMMENDED_TYPES:
            fit = recommended(model, INSTANCE_TYPES[name])
            if fit is None:
                rows.append(f"| `{model}` | `{name}` | - | none fits on 64 hosts | | | |")
                continue
            shown = {k: v for k, v in fit.hyperparameters.items() if v not in ("0", "1", "false", "fsdp")}
            settings = " ".join(f"`{k}={v}`" for k, v in shown.items()) or "(the defaults)"
            rows.append(
                f"| `{model}` | `{name}` | {fit.instances} | {fit.layout.describe()} | {settings} | "
                f"{gib(fit.plan.total)} of {gib(usable_bytes(INSTANCE_TYPES[name]))} | {gib(fit.plan.activations)} |"
            )
    return "\n".join(rows)

"""Tensor parallelism for the built-in architectures (torch.distributed.tensor.parallel), with sequence
parallelism between the blocks' matmuls and the loss computed on vocabulary shards (loss parallel), as
torchtitan does for Llama.

Between blocks the activations are split along the sequence (``Shard(1)``); each attention and feed-forward
gathers them, runs its column-split matmuls on its heads or hidden units, and reduce-scatters the row-split
output. Llama's attention runs this process's heads. GPT-2's attention projects q, k and v with one fused weight
whose rows are q's, then k's, then v's, so a column split does not give each process whole heads: its projection
is split (and its gradient) but gathered before attention, which every process of the group computes for all
heads. The MLP, the output projections and the head are split as Llama's are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from training.parallel.materialize import share_again, shared_parameters
from training.parallel.pipeline import EDGES, PassThrough, Zero, blocks_of


def _gathered(args: int = 1) -> PrepareModuleInput:
    # The block's input arrives split along the sequence; attention and the MLP need all of it.
    return PrepareModuleInput(
        input_layouts=(Shard(1), *([None] * (args - 1))), desired_input_layouts=(Replicate(), *([None] * (args - 1)))
    )


def _head() -> ColwiseParallel:
    # Logits stay split over the vocabulary for loss_parallel (a DTensor, not a local tensor).
    return ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)


PLANS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # (the model's own modules, each block's)
    "llama": (
        {
            "tok_embeddings": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel,
            "output": _head,
        },
        {
            "attention_norm": SequenceParallel,
            "attention": lambda: _gathered(4),  # x, the rope tables, the documents' mask (None)
            "attention.wq": ColwiseParallel,
            "attention.wk": ColwiseParallel,
            "attention.wv": ColwiseParallel,
            "attention.wo": lambda: RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel,
            "feed_forward": _gathered,
            "feed_forward.w1": ColwiseParallel,
            "feed_forward.w2": lambda: RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel,
        },
    ),
    "gpt2": (
        {
            "wte": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            # Positions (T, C) split along the sequence like the token embeddings they are added to.
            "wpe": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            "ln_f": SequenceParallel,
            "lm_head": _head,
        },
        {
            "ln_1": SequenceParallel,
            "attn": lambda: _gathered(2),  # x, the documents' mask (None)
            "attn.c_attn": lambda: ColwiseParallel(output_layouts=Replicate()),
            "attn.c_proj": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "ln_2": SequenceParallel,
            "mlp": _gathered,
            "mlp.c_fc": ColwiseParallel,
            "mlp.c_proj": lambda: RowwiseParallel(output_layouts=Shard(1)),
        },
    ),
}


def _runs(module: nn.Module) -> bool:
    return not isinstance(module, (PassThrough, Zero))


def _plan(root: nn.Module, entries: dict[str, Any]) -> dict[str, ParallelStyle]:
    """The plan's styles for the modules `root` runs (a pipeline stage stands in for some)."""
    return {name: make() for name, make in entries.items() if _runs(root.get_submodule(name))}


def apply_tensor_parallel(model: nn.Module, arch: str, mesh: DeviceMesh, *, compiled: bool) -> None:
    """Split `model` (a whole model or a pipeline stage of one) over the tensor-parallel `mesh`, in place.
    `compiled`: its blocks will be compiled."""
    tied = shared_parameters(model)
    own, per_block = PLANS[arch]
    parallelize_module(model, mesh, _plan(model, own))
    embedding = model.get_submodule(next(iter(EDGES[arch].inputs)))
    if compiled and _runs(embedding):
        # The embedding's output is the local tensor of a DTensor (to_local's alias). Given such an alias as its
        # input, a compiled block computed a wrong input gradient (torch 2.14.1: AOTAutograd, Llama's first block
        # on CPU): it gets a copy.
        embedding.register_forward_hook(_copy_output)
    for block in blocks_of(model):
        if not _runs(block):
            continue
        parallelize_module(block, mesh, _plan(block, per_block))
        if arch == "llama":
            # The attention's views use its head counts: this process runs its share of the heads.
            attention: Any = block.get_submodule("attention")
            attention.n_heads //= mesh.size()
            attention.n_kv_heads //= mesh.size()
    share_again(tied)


def _copy_output(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
    return output.clone()

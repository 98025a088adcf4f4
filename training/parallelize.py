"""Apply activation checkpointing, torch.compile and DDP or FSDP2 to a model, in torchtitan's order."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger(__name__)


def _blocks(model: nn.Module) -> nn.ModuleList | None:
    layers = getattr(model, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def parallelize(
    model: nn.Module,
    *,
    fsdp: bool,
    device: torch.device,
    world_size: int,
    param_dtype: torch.dtype,
    activation_checkpointing: bool,
    compile: bool,
    reshard_after_forward: bool,
) -> nn.Module:
    """Return the model ready to train; per block where the model exposes ``layers``. DDP wraps it only
    when there are several processes."""
    blocks = _blocks(model)
    if blocks is None and (activation_checkpointing or fsdp):
        log.warning("model has no 'layers' ModuleList: sharding and checkpointing it as a single unit")
    if activation_checkpointing:
        # checkpoint_wrapper's key prefix is stripped by torch.distributed.checkpoint.state_dict, so
        # checkpoints stay interchangeable with runs that do not checkpoint activations.
        if blocks is not None:
            for i, block in enumerate(blocks):
                blocks[i] = checkpoint_wrapper(block)
        else:
            model = checkpoint_wrapper(model)
    if compile:
        # In place (nn.Module.compile) rather than torch.compile(): parameter names stay the same.
        for block in blocks if blocks is not None else [model]:
            block.compile()
    if fsdp:
        mesh = init_device_mesh(device.type, (world_size,))
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for block in blocks if blocks is not None else []:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        # The root keeps the embeddings and head; it is not resharded because backward needs it at once.
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        return model
    if world_size == 1:
        # Nothing to synchronise: DDP's wrapper would only add its per-step bookkeeping. Checkpoints stay
        # interchangeable (torch.distributed.checkpoint.state_dict strips DDP's 'module.' prefix).
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    # No buffer broadcast before every forward: the models' buffers (Llama's rope tables) are computed
    # alike on every rank, and the broadcast would make each rank wait in its forward for the slowest,
    # which the straggler check times as the rank's own compute (training/stragglers.py).
    return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)

"""Give a model built on the meta device and parallelised its weights: rank 0 draws the whole model on the CPU
from the seed, as a single process would, and sends it one tensor at a time; every rank keeps its shard.

So the initial weights are the same, bit for bit, whatever the layout, and no process but rank 0 ever holds
the whole model (a 70B model's 280 GB in fp32 would not fit a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

Holders = list[tuple[nn.Module, str]]


def shared_parameters(model: nn.Module) -> list[Holders]:
    """Each parameter `model` holds under several names (a tied weight), as its (module, attribute) holders."""
    owners: dict[int, Holders] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append((module, name))
    return [holders for holders in owners.values() if len(holders) > 1]


def share_again(shared: list[Holders]) -> None:
    """Make each group of holders share one parameter again, after something replaced some of theirs (tensor
    parallelism replaces a module's parameters with split ones, `to_empty` from the meta device with new ones): the
    split one if a holder has it, else the first holder's."""
    for holders in shared:
        params: list[nn.Parameter] = [getattr(module, name) for module, name in holders]
        kept = next((p for p in params if isinstance(p, DTensor)), params[0])
        assert isinstance(kept, nn.Parameter)
        for module, name in holders:
            module.register_parameter(name, kept)


def _targets(parts: list[nn.Module]) -> dict[str, list[torch.Tensor]]:
    """Every parameter and buffer of the parts by the model's name for it (a tied one under each name)."""
    out: dict[str, list[torch.Tensor]] = {}
    for part in parts:
        for name, tensor in [*part.named_parameters(remove_duplicate=False), *part.named_buffers()]:
            # A block wrapped for activation checkpointing names its weights with the wrapper's prefix.
            out.setdefault(name.replace(_CHECKPOINT_PREFIX, ""), []).append(tensor)
    return out


def _local_slice(full: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if not isinstance(target, DTensor):
        return full
    shape, offset = compute_local_shape_and_global_offset(full.shape, target.device_mesh, target.placements)
    index = tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))
    return full[index]


@torch.no_grad()
def materialize(
    parts: list[nn.Module], build_full: Callable[[], nn.Module], *, device: torch.device, world_size: int
) -> None:
    """Allocate `parts` on `device` and fill them from the model `build_full()` returns on rank 0 (called there
    only, with the RNG seeded as for a single process)."""
    for part in parts:
        shared = shared_parameters(part)
        part.to_empty(device=device)
        share_again(shared)
    targets = _targets(parts)
    full = build_full() if dist.get_rank() == 0 else None
    names: list[object] = [None]
    if full is not None:
        tensors = dict([*full.named_parameters(remove_duplicate=False), *full.named_buffers()])
        names[0] = [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    if world_size > 1:
        dist.broadcast_object_list(names, src=0)
    listed = names[0]
    assert isinstance(listed, list)
    for name, shape, dtype in listed:
        value = tensors[name].to(device) if full is not None else torch.empty(shape, dtype=dtype, device=device)
        if world_size > 1:
            dist.broadcast(value, src=0)
        for target in targets.get(name, []):
            local = target.to_local() if isinstance(target, DTensor) else target
            local.copy_(_local_slice(value, target))

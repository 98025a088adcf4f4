"""Pipeline parallelism: a built-in model cut into stages, each a copy of the model that runs its own blocks
and hands every other module's input on, and the schedule that runs them (torch.distributed.pipelining).

A stage keeps the model's class, forward and parameter names (``layers.5.attention.wq.weight`` on whichever
stage holds block 5), so checkpoints and exports are the same whatever the layout. What a stage does not run
becomes a stand-in: the embedding of a later stage hands the previous stage's activations on, GPT-2's position
embedding adds nothing, and the head of an earlier stage hands its input on. A tied weight (GPT-2's head is its
token embedding) lives in the first stage and in the last; their gradients are summed between the two after
every backward (as Megatron-LM does), so both copies stay equal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.distributed.tensor import DTensor

from contract.mesh import Layout, stage_blocks, stage_ids

IGNORE_INDEX = -100
"""Targets of this value count in no loss (padding rows of an evaluation batch)."""


@dataclass(frozen=True)
class Edges:
    """The modules a built-in architecture runs before its blocks (and what they become on a later stage: ``pass``
    hands the input on, ``zero`` adds nothing) and after them (they hand the input on before the last stage)."""

    inputs: dict[str, str]
    outputs: tuple[str, ...]


EDGES: dict[str, Edges] = {
    "gpt2": Edges(inputs={"wte": "pass", "wpe": "zero", "drop": "pass"}, outputs=("ln_f", "lm_head")),
    "llama": Edges(inputs={"tok_embeddings": "pass"}, outputs=("norm", "output")),
}


class PassThrough(nn.Module):
    """Stands in for a module this stage does not run: returns its first input. It keeps the parameters the
    module shared with one the stage runs (a tied weight), under their names."""

    def forward(self, x: torch.Tensor, *_: Any) -> torch.Tensor:
        return x


class Zero(nn.Module):
    """Stands in for a module whose output this stage adds to its input (GPT-2's position embedding)."""

    def forward(self, x: torch.Tensor, *_: Any) -> torch.Tensor:
        return torch.zeros((), device=x.device)


def _stand_in(module: nn.Module, kind: str, kept: set[int]) -> nn.Module:
    stand_in = Zero() if kind == "zero" else PassThrough()
    for name, param in module.named_parameters(recurse=False):
        if id(param) in kept:
            stand_in.register_parameter(name, param)
    return stand_in


def split_stage(model: nn.Module, arch: str, blocks: range, *, first: bool, last: bool) -> nn.Module:
    """A copy of `model` (best on the meta device) that runs `blocks`, and the embedding if `first`, the head if
    `last`."""
    stage = copy.deepcopy(model)
    edges = EDGES[arch]
    layers = blocks_of(stage)
    for i in range(len(layers)):
        if i not in blocks:
            layers[i] = PassThrough()
    dropped = {} if first else dict(edges.inputs)
    if not last:
        dropped.update(dict.fromkeys(edges.outputs, "pass"))
    kept_modules = [m for name, m in stage.named_children() if name not in dropped]
    kept = {id(p) for m in kept_modules for p in m.parameters()}
    for name, kind in dropped.items():
        setattr(stage, name, _stand_in(getattr(stage, name), kind, kept))
    return stage


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """A built-in model's blocks."""
    layers = model.layers
    assert isinstance(layers, nn.ModuleList)
    return layers


def stage_block_ids(stage: nn.Module) -> list[int]:
    """The blocks a stage runs (not stood in for)."""
    return [i for i, block in enumerate(blocks_of(stage)) if not isinstance(block, PassThrough)]


def rank_module(stages: list[nn.Module]) -> nn.Module:
    """One module holding what this rank's stages run, under the model's names: what the optimizer, checkpoints
    and the export see. It is never run."""
    holder = nn.Module()
    first = stages[0]
    for name, child in first.named_children():
        if name == "layers":
            merged = nn.ModuleList(PassThrough() for _ in blocks_of(first))
            for stage in stages:
                for i in stage_block_ids(stage):
                    merged[i] = blocks_of(stage)[i]
            holder.add_module(name, merged)
            continue
        runs = [getattr(s, name) for s in stages if not isinstance(getattr(s, name), (PassThrough, Zero))]
        # A stand-in holding a tied weight (the last stage's embedding) is kept over one holding none.
        holds = [getattr(s, name) for s in stages if any(True for _ in getattr(s, name).parameters())]
        holder.add_module(name, (runs or holds or [child])[0])
    return holder


def tied_parameters(module: nn.Module) -> list[str]:
    """Names under which `module` holds a parameter it also holds under another name (the first name of each)."""
    seen: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        seen.setdefault(id(param), []).append(name)
    return [names[0] for names in seen.values() if len(names) > 1]


def _plain(value: torch.Tensor) -> torch.Tensor:
    # Loss parallel's loss is a replicated DTensor.
    return value.full_tensor() if isinstance(value, DTensor) else value


class PipelineLoss:
    """The schedule's loss of one micro-batch: the mean cross-entropy scaled by `scale` while training, the sum
    over the targets that are not IGNORE_INDEX while evaluating."""

    def __init__(self) -> None:
        self.scale = 1.0
        self.summed = False

    def __call__(self, logits_BTV: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        flat = logits_BTV.float().flatten(0, 1)
        if self.summed:
            return F.cross_entropy(flat, y_BT.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        return F.cross_entropy(flat, y_BT.flatten()) * self.scale


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    layout: Layout
    stages: list[_PipelineStageBase]
    schedule: _PipelineSchedule
    loss: PipelineLoss

    @property
    def has_first(self) -> bool:
        return any(stage.is_first for stage in self.stages)

    @property
    def has_last(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def step(self, x_BT: torch.Tensor, y_BT: torch.Tensor, scale: float) -> torch.Tensor | None:
        """Forward and backward of one batch in `layout.microbatches` micro-batches; the mean loss on the last
        stage, None elsewhere. Each micro-batch's loss is scaled by `scale` / micro-batches for backward."""
        self.loss.scale, self.loss.summed = scale / self.layout.microbatches, False
        losses: list[torch.Tensor] = []
        self.schedule.step(*self._inputs(x_BT), **self._targets(y_BT), losses=losses, return_outputs=False)
        if not self.has_last:
            return None
        return torch.stack([_plain(loss.detach()) for loss in losses]).sum() / scale

    def loss_sum(self, x_BT: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor | None:
        """Forward only: the summed loss of the targets that are not IGNORE_INDEX, on the last stage."""
        self.loss.summed = True
        losses: list[torch.Tensor] = []
        self.schedule.eval(*self._inputs(x_BT), **self._targets(y_BT), losses=losses)
        return torch.stack([_plain(loss) for loss in losses]).sum() if self.has_last else None

    def _inputs(self, x_BT: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x_BT,) if self.has_first else ()

    def _targets(self, y_BT: torch.Tensor) -> dict[str, Any]:
        return {"target": y_BT} if self.has_last else {}


def stage_plan(layout: Layout, n_layers: int, pp_rank: int) -> list[tuple[int, range]]:
    """(stage index, its blocks) for each stage the process at `pp_rank` runs."""
    blocks = stage_blocks(n_layers, layout.stages)
    return [(i, blocks[i]) for i in stage_ids(layout, pp_rank)]


def build_pipeline(
    layout: Layout,
    parts: list[nn.Module],
    indices: Iterable[int],
    *,
    device: torch.device,
    group: Any,
) -> Pipeline:
    """Stages of the parts (parallelised already) and the layout's schedule over them."""
    stages: list[_PipelineStageBase] = [
        PipelineStage(part, index, layout.stages, device, group=group)
        for part, index in zip(parts, indices, strict=True)
    ]
    loss = PipelineLoss()
    # The loss is scaled per micro-batch (PipelineLoss.scale), so the schedule leaves the gradients as they are.
    schedule: _PipelineSchedule
    if layout.pp_schedule == "interleaved1f1b":
        schedule = ScheduleInterleaved1F1B(list(stages), layout.microbatches, loss_fn=loss, scale_grads=False)
    else:
        single: Callable[..., _PipelineSchedule] = Schedule1F1B if layout.pp_schedule == "1f1b" else ScheduleGPipe
        schedule = single(stages[0], layout.microbatches, loss_fn=loss, scale_grads=False)
    return Pipeline(layout, stages, schedule, loss)

"""The model a rank trains, in its layout (contract/mesh.py): tensor parallelism, pipeline stages, activation
checkpointing, torch.compile and FSDP2 (HSDP) on one device mesh, or DDP, in torchtitan's order.

A built-in model is built on the meta device, cut and split, then given its weights by rank 0
(training/parallel/materialize.py). A model of your own (``model.factory``) is built on every process's device,
as its constructor may not run on the meta device, and takes DDP or FSDP2 only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from contract.mesh import MESH_DIMS, Layout
from training.parallel.materialize import materialize
from training.parallel.pipeline import (
    IGNORE_INDEX,
    Pipeline,
    blocks_of,
    build_pipeline,
    rank_module,
    split_stage,
    stage_block_ids,
    stage_plan,
    tied_parameters,
)
from training.parallel.tensor import apply_tensor_parallel

log = logging.getLogger(__name__)

Weights = Callable[[list[nn.Module]], None]
"""Fills the parts of a model built on meta (fine-tuning: from a model folder)."""


@dataclass(frozen=True)
class Options:
    """How to wrap the model: the config's parallel section and the compute dtype."""

    fsdp: bool
    param_dtype: torch.dtype
    activation_checkpointing: bool
    compile: bool
    reshard_after_forward: bool


def plain(value: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (loss parallel's is a replicated DTensor)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def mean_loss(logits_BTV: torch.Tensor, y_BT: torch.Tensor, *, packed: bool) -> torch.Tensor:
    """Mean cross-entropy over the targets that carry loss: all of them for token windows; for packed rows those
    not IGNORE_INDEX (a micro-batch without any counts 0)."""
    flat = logits_BTV.float().flatten(0, 1)
    if not packed:
        return F.cross_entropy(flat, y_BT.flatten())
    total = F.cross_entropy(flat, y_BT.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (y_BT != IGNORE_INDEX).sum().clamp(min=1)


def _blocks(model: nn.Module) -> nn.ModuleList | None:
    layers = getattr(model, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


@dataclass
class Parallelized:
    """What the trainer runs: this rank's model under the model's names (`module`, for the optimizer, checkpoints
    and export) and the way to run a step on it."""

    module: nn.Module
    layout: Layout
    parts: list[nn.Module]
    whole: nn.Module
    """The whole model (on the meta device where it was built there): its sizes, FLOPs and hooks."""
    mesh: DeviceMesh | None = None
    autocast: torch.dtype | None = None
    """DDP keeps fp32 weights and runs the forward in this dtype (FSDP casts the weights itself)."""
    pipeline: Pipeline | None = None
    tied: list[str] = field(default_factory=list)
    tied_group: Any = None

    @property
    def has_loss(self) -> bool:
        """Whether this rank computes the loss (the last pipeline stage's ranks; every rank without a pipeline)."""
        return self.pipeline is None or self.pipeline.has_last

    def _loss_context(self) -> contextlib.AbstractContextManager[Any]:
        # The logits of a tensor-parallel head are split over the vocabulary: the loss is computed on the shards.
        return loss_parallel() if self.layout.tp > 1 else contextlib.nullcontext()

    def _forward(self, x_BT: torch.Tensor, doc_BT: torch.Tensor | None) -> torch.Tensor:
        device = x_BT.device.type
        with torch.autocast(device, self.autocast) if self.autocast is not None else contextlib.nullcontext():
            logits_BTV: torch.Tensor = self.parts[0](x_BT) if doc_BT is None else self.parts[0](x_BT, doc_BT)
        return logits_BTV

    def forward_backward(
        self,
        x_BT: torch.Tensor,
        y_BT: torch.Tensor,
        scale: float,
        forward_done: Callable[[], None],
        doc_BT: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Forward, then backward of the loss x `scale`; the (unscaled) loss where this rank has it.
        `forward_done` is called between the two (after both, under a pipeline, whose schedule interleaves them).
        `doc_BT`: packed rows' document ids (no pipeline: the config refuses one for a model folder)."""
        with self._loss_context():
            if self.pipeline is not None:
                assert doc_BT is None
                loss = self.pipeline.step(x_BT, y_BT, scale)
                forward_done()
                return loss
            loss = mean_loss(self._forward(x_BT, doc_BT), y_BT, packed=doc_BT is not None)
            forward_done()
            torch.autograd.backward(loss * scale)
        return plain(loss.detach())

    @torch.no_grad()
    def loss_sum(
        self, x_BT: torch.Tensor, y_BT: torch.Tensor, doc_BT: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The summed loss of the targets that are not IGNORE_INDEX, where this rank has it."""
        with self._loss_context():
            if self.pipeline is not None:
                assert doc_BT is None
                return self.pipeline.loss_sum(x_BT, y_BT)
            flat = self._forward(x_BT, doc_BT).float().flatten(0, 1)
            return plain(F.cross_entropy(flat, y_BT.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"))

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Sum a tied weight's gradients between its stages, then clip every gradient to `max_norm` (inf: none)
        by their norm over the whole model, which is returned."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        duplicates = self._sync_tied()
        grads = [p.grad for p in params if id(p) not in duplicates]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)  # type: ignore[arg-type]
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if self.pipeline is not None and self.mesh is not None:
            squared = norm**2
            dist.all_reduce(squared, group=self.mesh["pp"].get_group())
            norm = squared.sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    def _sync_tied(self) -> set[int]:
        """Sum the tied weights' gradients between the first and the last stage; the ids of the parameters the
        whole model's norm must not count twice (the last stage's copies)."""
        if self.tied_group is None:
            return set()
        named = dict(self.module.named_parameters())
        tied = [named[name] for name in self.tied]
        for param in tied:
            grad = param.grad
            assert grad is not None
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.tied_group)
        assert self.pipeline is not None
        return {id(p) for p in tied} if self.pipeline.has_last else set()

    def train(self, mode: bool = True) -> None:
        for part in self.parts:
            part.train(mode)

    def full_state_dict(self, ctrl: Any) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0, on the CPU (every rank takes part; the others get {})."""
        if self.pipeline is None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return _tensors(get_model_state_dict(self.module, options=options))
        return self._stages_to_rank_0(ctrl)

    def _stages_to_rank_0(self, ctrl: Any) -> dict[str, torch.Tensor]:
        # Every rank gathers its stage's weights, one at a time (collectives within the stage's data- and
        # tensor-parallel ranks); the first rank of each stage keeps them on the CPU and sends them to rank 0.
        at = self.layout.coordinates(dist.get_rank())
        sender = all(at[name] == 0 for name in MESH_DIMS if name != "pp")
        own: dict[str, torch.Tensor] = {}
        for name, value in _tensors(get_model_state_dict(self.module)).items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if sender:
                own[name] = full.detach().cpu()
        shares: list[Any] = [None] * dist.get_world_size()
        dist.gather_object(own if sender else None, shares if dist.get_rank() == 0 else None, dst=0, group=ctrl)
        if dist.get_rank() != 0:
            return {}
        full_model: dict[str, torch.Tensor] = {}
        for share in shares:
            full_model.update(share or {})
        # A tied weight is one tensor under each of its names, as in the whole model (the export stores it once).
        first: dict[int, str] = {}
        for name, param in self.whole.named_parameters(remove_duplicate=False):
            full_model[name] = full_model[first.setdefault(id(param), name)]
        return full_model


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A model's state dict, whose values are all tensors."""
    assert all(isinstance(value, torch.Tensor) for value in state.values())
    return state


def build_mesh(layout: Layout, device: torch.device) -> DeviceMesh:
    return init_device_mesh(device.type, layout.shape, mesh_dim_names=MESH_DIMS)


def _dp_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    return mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]


def _wrap_blocks(part: nn.Module, blocks: list[int] | None, opts: Options) -> None:
    """Activation checkpointing then compilation, of each block (of the whole part without blocks)."""
    layers = _blocks(part)
    if layers is None or blocks is None:
        if blocks is None and (opts.activation_checkpointing or opts.fsdp):
            log.warning("model has no 'layers' ModuleList: sharding and checkpointing it as a single unit")
        return
    for i in blocks:
        if opts.activation_checkpointing:
            # checkpoint_wrapper's key prefix is stripped by torch.distributed.checkpoint.state_dict, so
            # checkpoints stay interchangeable with runs that do not checkpoint activations.
            layers[i] = checkpoint_wrapper(layers[i])
        if opts.compile:
            # In place (nn.Module.compile) rather than torch.compile(): parameter names stay the same.
            layers[i].compile()


def _shard(part: nn.Module, blocks: list[int] | None, dp_mesh: DeviceMesh, opts: Options, pipelined: bool) -> None:
    policy = MixedPrecisionPolicy(param_dtype=opts.param_dtype, reduce_dtype=torch.float32)
    layers = _blocks(part)
    # Under a pipeline every micro-batch's forward would gather a resharded block again: keep them (torchtitan).
    reshard = opts.reshard_after_forward and not pipelined
    for i in blocks or []:
        assert layers is not None
        fully_shard(layers[i], mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    # The root keeps the embeddings and head; it is not resharded because backward needs it at once.
    fully_shard(part, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)


def parallelize(
    build: Callable[[], nn.Module],
    *,
    arch: str | None,
    layout: Layout,
    opts: Options,
    device: torch.device,
    weights: Weights | None = None,
) -> Parallelized:
    """This rank's model in `layout`. `build()` makes the whole model on the current default device; `arch` names
    a built-in architecture (built on meta, then given rank 0's weights), None a model of your own. `weights`
    fills a model built on meta itself instead (fine-tuning: from a model folder, each process its part)."""
    if not opts.fsdp:
        return _data_parallel(build, arch=arch, layout=layout, opts=opts, device=device, weights=weights)
    mesh = build_mesh(layout, device)
    with torch.device("meta") if arch is not None else device:
        whole = build()
    plan: list[tuple[int, range]] = []
    parts = [whole]
    if layout.pp > 1:
        assert arch is not None  # the config refuses pipelines of models of your own
        plan = stage_plan(layout, len(blocks_of(whole)), layout.coordinates(dist.get_rank())["pp"])
        last = layout.stages - 1
        parts = [split_stage(whole, arch, blocks, first=i == 0, last=i == last) for i, blocks in plan]
    for part in parts:
        blocks = stage_block_ids(part) if _blocks(part) is not None else None
        if layout.tp > 1:
            assert arch is not None  # the config refuses tensor parallelism of models of your own
            apply_tensor_parallel(part, arch, mesh["tp"], compiled=opts.compile)
        _wrap_blocks(part, blocks, opts)
        _shard(part, blocks, _dp_mesh(mesh, layout), opts, pipelined=layout.pp > 1)
    if weights is not None:
        weights(parts)
    elif arch is not None:
        materialize(parts, lambda: _on_cpu(build), device=device, world_size=dist.get_world_size())
    if layout.pp == 1:
        return Parallelized(module=whole, layout=layout, parts=parts, whole=whole, mesh=mesh)
    pipeline = build_pipeline(layout, parts, [i for i, _ in plan], device=device, group=mesh["pp"].get_group())
    tied = tied_parameters(whole)
    return Parallelized(
        module=rank_module(parts),
        layout=layout,
        parts=parts,
        whole=whole,
        mesh=mesh,
        pipeline=pipeline,
        tied=tied,
        tied_group=_first_and_last_stage_group(layout) if tied else None,
    )


def _on_cpu(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("cpu"):
        return build()


def _first_and_last_stage_group(layout: Layout) -> Any:
    """The group of this rank and the rank at the same place of the other end of the pipeline (every rank creates
    every such group, in the same order, as torch.distributed asks)."""
    mine = None
    rank = dist.get_rank()
    per_stage = layout.processes // layout.pp
    last_rank = (layout.pp - 1) * per_stage
    for offset in range(per_stage):
        group = dist.new_group([offset, last_rank + offset])
        if rank in (offset, last_rank + offset):
            mine = group
    return mine


def _data_parallel(
    build: Callable[[], nn.Module],
    *,
    arch: str | None,
    layout: Layout,
    opts: Options,
    device: torch.device,
    weights: Weights | None,
) -> Parallelized:
    """DDP, or the model alone in a world of one."""
    world = layout.processes
    with torch.device("meta") if arch is not None else device:
        model = build()
    blocks = _blocks(model)
    _wrap_blocks(model, list(range(len(blocks))) if blocks is not None else None, opts)
    if weights is not None:
        weights([model])
    elif arch is not None:
        materialize([model], lambda: _on_cpu(build), device=device, world_size=world)
    autocast = None if opts.param_dtype == torch.float32 else opts.param_dtype
    if world == 1:
        # Nothing to synchronise: DDP's wrapper would only add its per-step bookkeeping. Checkpoints stay
        # interchangeable (torch.distributed.checkpoint.state_dict strips DDP's 'module.' prefix).
        return Parallelized(module=model, layout=layout, parts=[model], whole=model, autocast=autocast)
    device_ids = [device.index] if device.type == "cuda" else None
    # No buffer broadcast before every forward: the models' buffers (Llama's rope tables) are computed
    # alike on every rank, and the broadcast would make each rank wait in its forward for the slowest,
    # which the straggler check times as the rank's own compute (training/stragglers.py).
    ddp = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    return Parallelized(module=ddp, layout=layout, parts=[ddp], whole=model, autocast=autocast)

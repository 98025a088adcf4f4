"""The memory plan (contract/memory.py) against the bytes each process measures, layout by layout.

    torchrun --nproc-per-node 4 -m training.bench_memory --hp model=llama-tiny --hp seq_len=64 \\
        --layout parallel.tp=2 --layout parallel.pp=2,parallel.activation_checkpointing=true

Every process builds the model in each layout as the trainer does (training/parallelize.py), takes a step to
make the optimizer's states, then measures a second one: the storage bytes of its parameters, gradients and
optimizer states, the most bytes autograd held for the backward at once (`SavedPeak`, every layout), and torch's
MemTracker's peak (activations, and the rest by its categories; not under a pipeline, whose stages run once per
micro-batch, which MemTracker cannot follow). Rank 0 prints one JSON line per layout, every process's measurement
beside its plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from contract.config import JobConfig, from_hyperparameters, parse_overrides
from contract.distributions import distribution
from contract.memory import plan, training_of
from contract.mesh import Layout, resolve_layout
from training.models.build import model_builder
from training.optim import build_optimizer
from training.parallel.pipeline import EDGES, PassThrough
from training.parallelize import Options, Parallelized, parallelize


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages behind `tensors` (a DTensor's: its local shard's)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class SavedPeak:
    """The most bytes of tensors autograd held at once for the backward (parameters, gathered or not, left out):
    the activations, measured where MemTracker cannot be (a pipeline's stages run once per micro-batch)."""

    def __init__(self, parts: Sequence[torch.nn.Module], *, head: str) -> None:
        self.parts, self.head = parts, head
        self.held: dict[int, int] = {}  # a storage's address -> how many saved tensors hold it
        self.live = self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)

    def __enter__(self) -> SavedPeak:
        self._hooks.__enter__()
        # The head's logits are not saved (the log-softmax's output is) but live until the loss is computed, or
        # under a pipeline until the stage's backward: they are counted while their tensor lives.
        heads = [part.get_submodule(self.head) for part in self.parts]
        self._heads = [head.register_forward_hook(self._logits) for head in heads if not isinstance(head, PassThrough)]
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._heads:
            handle.remove()

    def _logits(self, _module: torch.nn.Module, _args: Any, logits: torch.Tensor) -> None:
        size = _local(logits).untyped_storage().nbytes()
        self._add(size)
        weakref.finalize(logits, self._add, -size)

    def _add(self, size: int) -> None:
        self.live += size
        self.peak = max(self.peak, self.live)

    def _parameters(self) -> set[int]:
        # FSDP2 swaps gathered parameters in for the forward: the set is taken at each save. Buffers (Llama's rope
        # tables) are the model's, not activations.
        held = [t for part in self.parts for t in (*part.parameters(), *part.buffers())]
        return {_local(t).untyped_storage().data_ptr() for t in held}

    def _pack(self, tensor: torch.Tensor) -> _Held:
        storage = _local(tensor).untyped_storage()
        address = storage.data_ptr()
        if address in self._parameters():
            return _Held(tensor, None)
        if address not in self.held:
            self._add(storage.nbytes())
        self.held[address] = self.held.get(address, 0) + 1
        return _Held(tensor, lambda: self._release(address, storage.nbytes()))

    def _release(self, address: int, size: int) -> None:
        self.held[address] -= 1
        if not self.held[address]:
            del self.held[address]
            self._add(-size)


class _Held:
    """A saved tensor; autograd drops it once the backward used it (or the graph is freed)."""

    def __init__(self, tensor: torch.Tensor, release: Callable[[], None] | None) -> None:
        self.tensor, self.release = tensor, release

    def __del__(self) -> None:
        if self.release is not None:
            self.release()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor that holds the memory of `tensor`: a DTensor's local tensor, a functional collective's result."""
    # Unwrapped, not to_local(): that would be an operation of its own, recorded by autograd.
    while is_traceable_wrapper_subclass(tensor):  # type: ignore[unreachable]
        inner, _ = tensor.__tensor_flatten__()  # type: ignore[unreachable]
        tensor = getattr(tensor, inner[0])
    return tensor


def _built(cfg: JobConfig, layout: Layout, device: torch.device) -> tuple[Parallelized, torch.optim.Optimizer]:
    build, args = model_builder(cfg.model)
    torch.manual_seed(cfg.train.seed)
    options = Options(
        fsdp=distribution(cfg.distribution).shards_parameters,
        param_dtype=torch.float32,
        activation_checkpointing=cfg.parallel.activation_checkpointing,
        compile=cfg.parallel.compile,
        reshard_after_forward=cfg.parallel.reshard_after_forward,
    )
    parallel = parallelize(build, arch=args.arch, layout=layout, opts=options, device=device)
    return parallel, build_optimizer(parallel.module, cfg.optim)


def measure(cfg: JobConfig, layout: Layout, device: torch.device) -> dict[str, Any]:
    """This process's bytes in `layout`, measured over its second step, and its plan."""
    parallel, optimizer = _built(cfg, layout, device)
    generator = torch.Generator().manual_seed(0)
    args = model_builder(cfg.model)[1]
    shape = (cfg.train.micro_batch_size, cfg.seq_len)
    x, y = (torch.randint(0, args.vocab_size, shape, generator=generator).to(device) for _ in range(2))
    parallel.forward_backward(x, y, 1.0, lambda: None)
    parallel.clip_grad_norm(1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    peak = None
    with SavedPeak(parallel.parts, head=EDGES[args.arch].outputs[-1]) as saved:
        if layout.pp == 1:
            tracker = MemTracker()
            tracker.track_external(parallel.module, optimizer)
            with tracker:
                parallel.forward_backward(x, y, 1.0, lambda: None)
                parallel.clip_grad_norm(1.0)
            peak = {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[device].items()}
        else:
            # MemTracker cannot follow a module run once per micro-batch: SavedPeak measures a pipeline.
            parallel.forward_backward(x, y, 1.0, lambda: None)
            parallel.clip_grad_norm(1.0)
    params = list(parallel.module.parameters())
    measured = {
        "parameters": storage_bytes(params),
        "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_states": storage_bytes(
            v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
        ),
        "peak": peak,
        "saved_peak": saved.peak,
    }
    planned = plan(args, layout, training_of(cfg, None), dist.get_rank())
    return {"rank": dist.get_rank(), "measured": measured, "planned": planned.__dict__}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="hyperparameters of all")
    parser.add_argument(
        "--layout", action="append", default=[], metavar="KEY=VALUE,...", help="one layout's hyperparameters"
    )
    parsed = parser.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    device = torch.device("cpu")
    world, per_host = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        for spec in parsed.layout or [""]:
            hyperparameters = {**parse_overrides(parsed.hp), **parse_overrides(p for p in spec.split(",") if p)}
            cfg = from_hyperparameters(hyperparameters)
            layout = resolve_layout(cfg, world, per_host)
            rows: list[Any] = [None] * world
            dist.all_gather_object(rows, measure(cfg, layout, device))
            if dist.get_rank() == 0:
                print(json.dumps({"layout": spec, "describe": layout.describe(), "ranks": rows}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

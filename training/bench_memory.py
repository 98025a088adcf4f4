"""The memory plan (contract/memory.py) against the bytes each process measures, layout by layout.

    torchrun --nproc-per-node 4 -m training.bench_memory --hp model=llama-tiny --hp seq_len=64 \\
        --layout parallel.tp=2 --layout parallel.pp=2,parallel.activation_checkpointing=true

Every process builds the model in each layout as the trainer does (training/parallelize.py), takes a step to
make the optimizer's states, then measures a second one: the storage bytes of its parameters, gradients and
optimizer states, and torch's MemTracker's peak (activations, and the rest by its categories; not under a pipeline,
whose stages run once per micro-batch, which MemTracker cannot follow). Rank 0 prints one JSON line per layout,
every process's measurement beside its plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor

from contract.config import JobConfig, from_hyperparameters, parse_overrides
from contract.distributions import distribution
from contract.memory import plan, training_of
from contract.mesh import Layout, resolve_layout
from training.models.build import model_builder
from training.optim import build_optimizer
from training.parallelize import Options, Parallelized, parallelize


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages behind `tensors` (a DTensor's: its local shard's)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


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
    if layout.pp == 1:
        tracker = MemTracker()
        tracker.track_external(parallel.module, optimizer)
        with tracker:
            parallel.forward_backward(x, y, 1.0, lambda: None)
            parallel.clip_grad_norm(1.0)
        peak = {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[device].items()}
    else:
        # MemTracker cannot follow a module run once per micro-batch: a pipeline's peak is not measured.
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

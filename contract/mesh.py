"""The device mesh: how a job's processes divide into pipeline stages, data-parallel replicas and shards, and
tensor-parallel groups.

Torch-free: Validate, the launcher and the trainer resolve a job's layout here from its hyperparameters and
its cluster, with the same checks and the same fix-its, and the memory plan (contract/memory.py) reads it.

Nomenclature (one word each, as the hyperparameters spell them):

- **dp_replicate**: copies of the model that all-reduce their gradients (DDP; HSDP's replicate dimension);
- **dp_shard**: processes one copy's parameters, gradients and optimizer states are sharded over (FSDP2);
- **tp**: processes one block's weights are split over (tensor parallelism, with sequence parallelism);
- **pp**: pipeline stages' processes; each runs ``stages_per_process`` consecutive-in-schedule stages;
- the **data-parallel** processes are dp_replicate x dp_shard: each reads its own share of the batch.

Ranks are laid out with ``tp`` innermost and ``pp`` outermost (torchtitan's order), so a tensor-parallel group
is consecutive ranks, which torchrun puts on one host when tp divides the processes per host.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from contract.config import ConfigError, ConfigProblem, JobConfig
from contract.distributions import DISTRIBUTIONS

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
"""The mesh's dimensions, outermost first."""


@dataclass(frozen=True)
class Layout:
    """A resolved layout: every degree known, their product the number of processes."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    stages_per_process: int = 1
    microbatches: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel processes: each reads its own share of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def processes(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def stages(self) -> int:
        """Pipeline stages in all: pp x stages per process."""
        return self.pp * self.stages_per_process

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh's shape in MESH_DIMS order."""
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where `rank` sits on each of the mesh's dimensions."""
        out: dict[str, int] = {}
        for name, size in reversed(list(zip(MESH_DIMS, self.shape, strict=True))):
            rank, out[name] = divmod(rank, size)
        return {name: out[name] for name in MESH_DIMS}

    def dp_rank(self, rank: int) -> int:
        """`rank`'s share of the batch among the data-parallel processes."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"]

    def describe(self) -> str:
        """The layout in one phrase, e.g. ``dp_shard=16 x tp=8``; the degrees of 1 are left out."""
        parts = [f"{name}={size}" for name, size in zip(MESH_DIMS, self.shape, strict=True) if size > 1]
        if self.pp > 1:
            parts.append(f"{self.pp_schedule} x {self.microbatches} micro-batches")
            if self.stages_per_process > 1:
                parts[-1] += f" x {self.stages_per_process} stages per process"
        return " x ".join(parts) or "one process"

    def hyperparameters(self) -> dict[str, str]:
        """The hyperparameters that ask for this layout."""
        values = {
            "parallel.dp_replicate": self.dp_replicate,
            "parallel.dp_shard": self.dp_shard,
            "parallel.tp": self.tp,
            "parallel.pp": self.pp,
        }
        if self.pp > 1:
            values.update(
                {
                    "parallel.pp_microbatches": self.microbatches,
                    "parallel.pp_stages_per_process": self.stages_per_process,
                }
            )
        out = {key: str(value) for key, value in values.items()}
        if self.pp > 1:
            out["parallel.pp_schedule"] = self.pp_schedule
        return out


def resolve_layout(cfg: JobConfig, processes: int, per_host: int) -> Layout:
    """The layout `cfg` asks for on `processes` processes, `per_host` on each host; ConfigError naming every
    problem with its fix."""
    problems = layout_problems(cfg, processes, per_host)
    if problems:
        raise ConfigError(problems)
    return _derived(cfg, processes)


def layout_problems(cfg: JobConfig, processes: int, per_host: int) -> list[ConfigProblem]:
    """Why the layout `cfg` asks for cannot run on `processes` processes with `per_host` on each host (none: it
    can), each under the key to change. `per_host` of a cluster of unlike hosts is their processes' greatest common
    divisor."""
    par = cfg.parallel
    problems: list[ConfigProblem] = []
    tp = par.tp
    if per_host % tp:
        tp = max(d for d in range(1, tp) if per_host % d == 0)
        _add(
            problems,
            "parallel.tp",
            f"{processes} processes cannot be tp={par.tp}: tp must divide {per_host}, the GPUs per host "
            f"(a tensor-parallel group stays on one host); use parallel.tp={tp}",
        )
    if processes % (tp * par.pp):
        # Judged with the tensor-parallel degree the problem above suggests, if any: this one is the pipeline's.
        _add(
            problems,
            "parallel.pp",
            f"{processes} processes cannot be tp={tp} x pp={par.pp}: tp x pp must divide the processes; use a "
            f"cluster of a multiple of {tp * par.pp} GPUs or lower parallel.pp",
        )
    if problems:
        return problems
    dp = processes // par.model_parallel
    given = [(key, getattr(par, key)) for key in ("dp_replicate", "dp_shard") if getattr(par, key)]
    product = math.prod(value for _, value in given)
    if len(given) == 2 and product != dp:
        _add(
            problems,
            "parallel.dp_shard",
            f"parallel.dp_replicate={par.dp_replicate} x parallel.dp_shard={par.dp_shard} = {product}, but "
            f"{processes} processes / (tp={par.tp} x pp={par.pp}) leave {dp} data-parallel processes; set one of "
            "them to 0 to derive it",
        )
    elif len(given) == 1 and dp % product:
        key, value = given[0]
        _add(
            problems,
            f"parallel.{key}",
            f"parallel.{key}={value} must divide the {dp} data-parallel processes {processes} processes / "
            f"(tp={par.tp} x pp={par.pp}) leave; use a divisor of {dp}, or 0 to derive it",
        )
    if not problems and not DISTRIBUTIONS[cfg.distribution].shards_parameters and _derived(cfg, processes).dp_shard > 1:
        _add(
            problems,
            "parallel.dp_shard",
            f"distribution={cfg.distribution} does not shard: set parallel.dp_shard to 0 or 1",
        )
    if not problems:
        try:
            cfg.train.grad_accum_steps(dp)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def _add(problems: list[ConfigProblem], key: str, message: str) -> None:
    problems.append(ConfigProblem(key, message))


def _derived(cfg: JobConfig, processes: int) -> Layout:
    par = cfg.parallel
    dp = processes // par.model_parallel
    if par.dp_replicate and par.dp_shard:
        replicate, shard = par.dp_replicate, par.dp_shard
    elif par.dp_replicate:
        replicate, shard = par.dp_replicate, dp // par.dp_replicate
    elif par.dp_shard:
        replicate, shard = dp // par.dp_shard, par.dp_shard
    elif DISTRIBUTIONS[cfg.distribution].shards_parameters:
        replicate, shard = 1, dp
    else:
        replicate, shard = dp, 1
    stages = par.pp * par.stages_per_process if par.pp > 1 else 1
    return Layout(
        dp_replicate=replicate,
        dp_shard=shard,
        tp=par.tp,
        pp=par.pp,
        pp_schedule=par.pp_schedule,
        stages_per_process=par.stages_per_process if par.pp > 1 else 1,
        microbatches=par.pp_microbatches or stages if par.pp > 1 else 1,
    )


def stage_blocks(n_layers: int, stages: int) -> list[range]:
    """The blocks of each pipeline stage: the embedding and the head each count as one block (torchtitan's
    balance), the first stages take one more where the total does not divide."""
    if stages == 1:
        return [range(n_layers)]
    units = n_layers + 2
    share, extra = divmod(units, stages)
    out, first = [], 0
    for stage in range(stages):
        count = share + (stage < extra) - (stage == 0) - (stage == stages - 1)
        out.append(range(first, first + max(count, 0)))
        first += max(count, 0)
    return out


def stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """The stages the process at `pp_rank` runs, in order (looped: pp_rank, pp_rank + pp, ...)."""
    return [pp_rank + s * layout.pp for s in range(layout.stages_per_process)]


def microbatches_in_flight(layout: Layout, pp_rank: int) -> int:
    """The most (micro-batch, stage) pairs whose activations the process at `pp_rank` holds at once: each local
    stage's count for 1f1b and gpipe; for interleaved1f1b, its stages' together in the order torch's schedule runs
    them (`_interleaved_order`), where the last stage keeps every micro-batch's until the step ends (measured:
    docs/BENCHMARKS.md)."""
    m = layout.microbatches
    if layout.pp == 1:
        return 1
    if layout.pp_schedule == "gpipe":
        return m
    if layout.pp_schedule == "1f1b":
        return min(m, layout.pp - pp_rank)
    held, most = [0] * layout.stages_per_process, 0
    keeps = layout.stages_per_process - 1 if pp_rank == layout.pp - 1 else None
    for forward, local in _interleaved_order(layout, pp_rank):
        if forward or local != keeps:
            held[local] += 1 if forward else -1
        most = max(most, sum(held))
    return most


def _interleaved_order(layout: Layout, pp_rank: int) -> Iterator[tuple[bool, int]]:
    """(forward?, local stage) of each of the process's operations, in the order of torch's ScheduleInterleaved1F1B
    (`_get_warmup_ops`, `_get_1f1b_rank_ops`): forwards to warm up, then one forward and one backward, then the
    remaining backwards, each local stage in turn for a round of micro-batches."""
    m, local_stages = layout.microbatches, layout.stages_per_process
    per_round = m // max(1, m // layout.pp)
    total = m * local_stages
    warmup = min((local_stages - 1) * per_round + 2 * (layout.pp - 1 - pp_rank), total)

    def backward_stage(step: int) -> int:
        return local_stages - 1 - ((step - warmup) // per_round) % local_stages

    for step in range(warmup):
        yield True, (step // per_round) % local_stages
    for step in range(warmup, total):
        yield True, (step // per_round) % local_stages
        yield False, backward_stage(step)
    for step in range(total, total + warmup):
        yield False, backward_stage(step)

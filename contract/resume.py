"""Which settings a run may change when it resumes another run's checkpoint (`resume_from`).

A checkpoint holds the model's and the optimizer's state, the data position and the RNG streams.
The trainer loads it onto any number of processes (DCP reshards; training/checkpoint/), so what
must not change is what gives the state its shape and its meaning:

- the model: every `model.*` setting but `model.dropout` (the parameters' names and shapes);
- the sequence length (the data position counts sequences);
- the global batch: a different number of data-parallel processes keeps the same optimisation only when
  `train.global_batch_size` is fixed (contract/config.py), so with it at 0 their count must match.

The parallel layout may change (tp, pp, dp_shard, dp_replicate): DCP reshards the model and optimizer state.

Torch-free: Validate checks these rules before anything starts, with the configs both runs were given.
"""

from __future__ import annotations

import dataclasses

from contract.config import JobConfig

FREE_MODEL_FIELDS = frozenset({"dropout"})
"""`model.*` settings that do not change the parameters."""


def resume_problems(old: JobConfig, old_processes: int, new: JobConfig, new_processes: int) -> list[str]:
    """Why a run of config `new` on `new_processes` processes cannot resume a checkpoint of `old` (none: it can)."""
    problems: list[str] = []
    for field in dataclasses.fields(old.model):
        before, after = getattr(old.model, field.name), getattr(new.model, field.name)
        if field.name not in FREE_MODEL_FIELDS and before != after:
            problems.append(
                f"hyperparameters model.{field.name}: {after!r} differs from the resumed run's {before!r}; "
                "a checkpoint loads only into the model that wrote it"
            )
    if old.seq_len != new.seq_len:
        problems.append(
            f"hyperparameters data.seq_len: {new.seq_len} differs from the resumed run's {old.seq_len}; "
            "its data position counts sequences of that length"
        )
    old_dp, new_dp = old.data_parallel(old_processes), new.data_parallel(new_processes)
    old_batch, new_batch = old.train.global_batch(old_dp), new.train.global_batch(new_dp)
    if old_batch != new_batch:
        problems.append(
            f"hyperparameters train.global_batch_size: this run's batch is {new_batch} sequences per step, the "
            f"continued run's {old_batch}; set train.global_batch_size={old_batch} (a multiple of "
            f"train.micro_batch_size x {new_dp} data-parallel processes) to resume with the same optimisation"
        )
    return problems

"""The SDK's checkpoints: a script's model, optimizer, schedule, own values and random streams, saved and loaded
by the built-in trainer's CheckpointManager (training/checkpoint/manager.py), so the platform records them in the run's
ledger and a script resumes only from one the ledger holds, every byte checked, exactly where it stopped."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from contract import goodput
from contract.config import CheckpointConfig
from contract.layout import LEDGER_CHANNEL, step_dir
from contract.ledger import delivered
from training.checkpoint import CheckpointManager, ModelState
from training.distributed import DistEnv
from training.sagemaker_contract import Paths
from training.sdk.run import checkpoint_dir, current

log = logging.getLogger("training.sdk")


@dataclass
class ScriptState(ModelState):
    """A script's state: a model's, the script's own values (`extra`, JSON), and Python's and NumPy's random
    streams besides torch's."""

    extra: dict[str, Any] = field(default_factory=dict)

    def _progress(self) -> dict[str, Any]:
        return {"extra": self.extra}

    def _restore(self, progress: dict[str, Any]) -> None:
        self.extra.clear()
        self.extra.update(progress.get("extra", {}))

    def _rng(self) -> dict[str, Any]:
        rng = super()._rng()
        streams: dict[str, Any] = {"python": random.getstate()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            kind, keys, position, has_gauss, gauss = numpy.random.get_state()
            streams["numpy"] = [kind, keys.tolist(), position, has_gauss, gauss]
        rng["streams"] = json.dumps(streams)
        return rng

    def _set_rng(self, rng: dict[str, Any]) -> None:
        super()._set_rng(rng)
        streams = json.loads(rng["streams"])
        version, state, gauss = streams["python"]
        random.setstate((version, tuple(state), gauss))
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy" in streams:
            kind, keys, position, has_gauss, gauss = streams["numpy"]
            numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), position, has_gauss, gauss))


def _process_group() -> None:
    """A script that never set up a process group runs alone: the checkpoints' collectives get a group of one."""
    if dist.is_initialized():
        return
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise RuntimeError("call torch.distributed.init_process_group() before sdk.Checkpointer(): WORLD_SIZE > 1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]


class Checkpointer:
    """Saves and resumes a script's training through the platform's checkpoints. Make it on every rank, after
    `init_process_group()` and after the model is built (and wrapped in DDP or FSDP)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: LRScheduler | None = None,
        *,
        extra: dict[str, Any] | None = None,
        keep_last: int = 3,
        directory: Path | None = None,
    ) -> None:
        """`optimizer`: None saves and loads the model alone; `extra`: the script's own values to save (JSON: epoch,
        data position, ...), restored in place by `resume`; `keep_last`: complete checkpoints kept; `directory`: the
        checkpoint folder the platform syncs."""
        _process_group()
        parameter = next(iter(model.parameters()), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        env = DistEnv(rank, world, local_rank, device, dist.new_group(backend="gloo"))  # type: ignore[arg-type]
        self.state = ScriptState(model, optimizer, scheduler, rank, seed=0, extra={} if extra is None else extra)
        ledger = delivered(Paths.from_env().channel(LEDGER_CHANNEL), job=goodput.job_name(os.environ))
        settings = CheckpointConfig(interval_steps=0, interval_minutes=0, keep_last=keep_last)
        self.manager = CheckpointManager(directory or checkpoint_dir(), env, settings, trusted=ledger)

    def resume(self) -> int:
        """Load the newest checkpoint the run's ledger recorded (every rank); the step it holds, 0 when none."""
        run = current()
        with run.clock.phase("checkpoint_load"):
            step = self.manager.load_latest(self.state) or 0
        run.resumed(step)
        if run.rank == 0:  # the script's logging is its own: say it where its output goes
            print(f"resumed from checkpoint {step_dir(step)}" if step else "no checkpoint to resume from", flush=True)
        return step

    def save(self, step: int) -> None:
        """Commit a checkpoint of `step` (every rank; blocking: done when it returns) and prune old ones."""
        run = current()
        self.state.step = step
        with run.clock.phase("checkpoint"):
            self.manager.save(self.state, blocking=True)
        run.step = max(run.step, step)
        run.phases_line()

    def close(self) -> None:
        """Finish deleting old checkpoints."""
        self.manager.close()

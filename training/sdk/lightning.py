"""The SDK for PyTorch Lightning's `Trainer`: one callback that reports, checkpoints, stops and resumes it.

    from training.sdk.lightning import PlatformCallback

    trainer = L.Trainer(max_steps=1000, enable_checkpointing=False, callbacks=[PlatformCallback(checkpoint_steps=100)])
    trainer.fit(model, datamodule)  # resumes from the newest checkpoint the run's ledger recorded, if there is one

The callback reports every optimizer step to the launcher's hang check, prints the platform's metrics line (loss,
learning rate) every `log_every_n_steps`, checkpoints through the platform (training/sdk/checkpoints.py) every
`checkpoint_steps` steps and at `max_steps`, and on a stop (SIGTERM, agreed by every rank) saves and ends the
process (exit 0) as the built-in trainer does. At the start of `fit` it resumes by itself: the model, the optimizer,
the schedule, every rank's random streams and the Trainer's loops (step, epoch, the position in the epoch's data),
from the newest checkpoint the run's ledger recorded, every byte checked; do not also pass `ckpt_path`. Set
`enable_checkpointing=False` so that Lightning does not also write its own. This module needs lightning;
`training.sdk` does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.types import STEP_OUTPUT

from training import sdk
from training.sdk.checkpoints import Checkpointer
from training.sdk.run import current
from training.signals import StopRequest

LOOPS = "lightning_loops"
"""The key of the Trainer's loops' state (JSON) among a checkpoint's `extra` values."""


def _one(values: list[Any], what: str) -> Any:
    if len(values) > 1:
        raise ValueError(f"the platform's checkpoints hold one {what}; this model configures {len(values)}")
    return values[0] if values else None


class PlatformCallback(pl.Callback):
    """Reports, checkpoints, stops and resumes a `lightning.Trainer` through the platform."""

    def __init__(self, *, checkpoint_steps: int = 0, keep_last: int = 3, resume: bool = True) -> None:
        """`checkpoint_steps`: save every that many optimizer steps (0: only at a stop and at `max_steps`);
        `keep_last`: complete checkpoints kept; `resume`: resume from the run's newest recorded checkpoint."""
        self.checkpoint_steps, self.keep_last, self.resume = checkpoint_steps, keep_last, resume
        self.checkpoints: Checkpointer | None = None
        self.extra: dict[str, Any] = {}
        self.step = 0
        """The last optimizer step reported: with gradients accumulated, several batches end at one step."""
        self.skip = 0
        """Batches of the resumed epoch already trained, which a loader without a state of its own must skip."""
        self.rng: dict[str, Any] | None = None
        """Every random stream as the resumed checkpoint held it, set again once the fit loop made its loader."""
        self.lr = 0.0
        self.log_every = 1

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the strategy's setup (optimizers made, model wrapped and placed), before Lightning's own restore and
        # before the fit loop starts: the loops' state loaded here is the one they start from.
        self.log_every = max(1, int(getattr(trainer, "log_every_n_steps", 1)))  # set on the Trainer, not declared
        optimizer = _one(trainer.optimizers, "optimizer")
        scheduler = _one([config.scheduler for config in trainer.lr_scheduler_configs], "learning-rate scheduler")
        self.checkpoints = Checkpointer(pl_module, optimizer, scheduler, extra=self.extra, keep_last=self.keep_last)
        self.step = trainer.global_step
        if not self.resume or not self.checkpoints.resume():
            return
        self.rng = self.checkpoints.state._rng()
        loop = trainer.fit_loop
        loop.load_state_dict(json.loads(self.extra[LOOPS]))
        self.step = trainer.global_step
        done = loop.epoch_loop.batch_progress.current.ready  # saved once the step's batch was processed
        self.skip = done if 0 < done < trainer.num_training_batches else 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning's SIGTERM handler, installed once the fit started, broadcasts from inside the handler and ends
        # a rank at its own step; the SDK's request is agreed by every rank at the same step instead.
        run = current()
        stop = StopRequest.install()
        stop.signum = run.stop.signum if run.stop is not None else None
        run.stop = stop
        if self.skip:
            self._skip_trained_batches(trainer)
        if self.rng is not None and self.checkpoints is not None:
            # Making the loader drew a seed, and skipping may draw more: an uninterrupted run drew them before.
            self.checkpoints.state._set_rng(self.rng)
            self.rng = None

    def _skip_trained_batches(self, trainer: pl.Trainer) -> None:
        """Resumed within an epoch: the loader starts the epoch again (a loader with `state_dict` is restored by the
        loops instead), so the batches already trained are drawn and dropped, in the epoch's own order."""
        loop = trainer.fit_loop
        loader, fetcher = loop._combined_loader, loop._data_fetcher  # Lightning has no public way to skip them
        assert loader is not None and fetcher is not None
        if all(hasattr(each, "state_dict") and hasattr(each, "load_state_dict") for each in loader.flattened):
            return
        for each in loader.flattened:
            _set_sampler_epoch(each, trainer.current_epoch)  # the fit loop sets it only after this hook
        for _ in range(self.skip):
            next(fetcher)
        fetcher.fetched -= self.skip  # the epoch loop counts the epoch's trained batches itself

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.optimizers:  # the rate this step trains with: a schedule stepped per step moves it before the end
            self.lr = float(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self.step:  # accumulating gradients: no optimizer step
            return
        self.step = step
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if step % self.log_every == 0 and isinstance(loss, torch.Tensor):
            sdk.report_step(step, loss=loss.item(), **({"lr": self.lr} if trainer.optimizers else {}))
        else:
            sdk.report_step(step)
        stop = sdk.should_stop()
        every = self.checkpoint_steps
        if stop or (every and step % every == 0) or step == trainer.max_steps:
            assert self.checkpoints is not None
            self.extra[LOOPS] = json.dumps(trainer.fit_loop.state_dict())
            self.checkpoints.save(step)
        if stop:
            raise SIGTERMException  # saved: the run resumes from here, and nothing after fit() runs on a stop

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.on_fit_end(trainer, pl_module)

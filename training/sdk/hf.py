"""The SDK for Hugging Face's `transformers.Trainer`: one callback, and where to resume from.

    from training.sdk.hf import PlatformCallback, resume_from

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[PlatformCallback()])
    trainer.train(resume_from_checkpoint=resume_from(trainer))

The callback reports every optimizer step to the launcher's hang check and every log (loss, learning rate, gradient
norm) as the platform's metrics line, checkpoints through the platform (training/sdk/checkpoints.py) every
`checkpoint_steps` steps (default: the arguments' `save_steps` when `save_strategy="steps"`; set `save_strategy="no"`
so that the Trainer does not also write its own), and on a stop (SIGTERM, agreed by every rank) saves and ends the
process (exit 0) as the built-in trainer does. `resume_from` loads the newest checkpoint the run's ledger recorded
(every byte checked) and hands the Trainer its own resume: the model's weights, its state (the step, from which it
skips the batches already trained) and every rank's random streams, in a folder of the Trainer's own files; the
callback loads the optimizer and the schedule into the Trainer's own at the start of training. This module needs
transformers; `training.sdk` does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from training import sdk
from training.sdk.checkpoints import Checkpointer

TRAINER_STATE = "trainer_state"
"""The key of the Trainer's state (TrainerState's JSON) among a checkpoint's `extra` values."""


def _unwrapped(value: Any, attribute: str) -> Any:
    """accelerate's AcceleratedOptimizer/AcceleratedScheduler hold the torch object the checkpoint saves."""
    return getattr(value, attribute, value)


class PlatformCallback(TrainerCallback):
    """Reports, checkpoints and stops a `transformers.Trainer` through the platform."""

    def __init__(self, *, checkpoint_steps: int | None = None, keep_last: int = 3) -> None:
        self.checkpoint_steps, self.keep_last = checkpoint_steps, keep_last
        self.checkpoints: Checkpointer | None = None
        self.resumed_step = 0
        """The step `resume_from` handed the Trainer (0: none): the callback loads its optimizer and schedule."""
        self.extra: dict[str, Any] = {}

    def _every(self, args: TrainingArguments) -> int:
        if self.checkpoint_steps is not None:
            return self.checkpoint_steps
        return int(args.save_steps) if str(args.save_strategy).endswith("steps") and args.save_steps >= 1 else 0

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        optimizer = _unwrapped(kwargs["optimizer"], "optimizer")
        scheduler = _unwrapped(kwargs.get("lr_scheduler"), "scheduler")
        self.checkpoints = Checkpointer(
            kwargs["model"], optimizer, scheduler, extra=self.extra, keep_last=self.keep_last
        )
        if self.resumed_step:
            step = self.checkpoints.resume()
            if step != self.resumed_step:
                raise RuntimeError(f"the newest checkpoint is step {step}, not the step {self.resumed_step} resumed")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        sdk.report_step(step)
        stop = sdk.should_stop()
        every = self._every(args)
        if stop or (every and step % every == 0) or step == state.max_steps:
            assert self.checkpoints is not None
            self.extra[TRAINER_STATE] = json.loads(json.dumps(dataclasses.asdict(state), default=str))
            self.checkpoints.save(step)
        if stop:
            raise SystemExit(0)  # saved: the run resumes from here, and nothing after train() runs on a stop

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = logs or {}
        values = {name: logs[key] for key, name in (("learning_rate", "lr"), ("grad_norm", "grad_norm")) if key in logs}
        if "loss" in logs:
            sdk.report_step(state.global_step, loss=logs["loss"], **values)
        if "eval_loss" in logs:
            sdk.report_validation(state.global_step, logs["eval_loss"])


def _folder(step: int) -> Path:
    """The same folder for every rank of a host (torchrun's agent's rendezvous names it), new for each resume."""
    where = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}"
    return Path(tempfile.gettempdir()) / f"platform-resume-{where}-step-{step}"


def resume_from(trainer: Trainer) -> str | None:
    """The folder `trainer.train(resume_from_checkpoint=...)` takes to resume from the newest checkpoint the run's
    ledger recorded; None when there is none. Call it on every rank."""
    model = trainer.model
    assert isinstance(model, nn.Module), "the Trainer has no model"
    extra: dict[str, Any] = {}
    step = Checkpointer(model, None, None, extra=extra).resume()  # the model, and the random streams
    if not step:
        return None
    folder = _folder(step)
    folder.mkdir(parents=True, exist_ok=True)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    streams = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        streams["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        streams["cuda"] = torch.cuda.random.get_rng_state()
    torch.save(streams, folder / (f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth"))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        model.save_pretrained(folder, safe_serialization=True)  # type: ignore[operator]
        (folder / "trainer_state.json").write_text(json.dumps(extra[TRAINER_STATE], indent=2, sort_keys=True))
    if dist.is_initialized():
        dist.barrier()
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, PlatformCallback):
            callback.resumed_step = step
    return str(folder)

"""The platform's SDK for a run's own script: a few calls that give it what the built-in trainer has.

    from training import sdk

    checkpoints = sdk.Checkpointer(model, optimizer, scheduler, extra=progress)  # after init_process_group()
    start = checkpoints.resume()                 # the newest checkpoint the run's ledger recorded, or 0
    for step in range(start + 1, max_steps + 1):
        loss = train_one_step()
        sdk.report_step(step, loss=loss.item(), lr=scheduler.get_last_lr()[0])
        stop = sdk.should_stop()                 # SIGTERM (a spot interruption), agreed by every rank
        if stop or step % 100 == 0:
            checkpoints.save(step)
        if stop:
            break

`report_step` feeds the launcher's exact hang check (a step report per rank, a few microseconds), prints the
metrics line SageMaker's MetricDefinitions and `tp watch` read (rank 0), and keeps the goodput progress record;
`phase` names where time goes (`eval`, `export`); `Checkpointer` saves and loads through the trainer's own
checkpoints (training/checkpoint/: DCP, atomic commit, the manifest the platform records in the run's ledger,
every byte checked on load, only ledger-recorded checkpoints loaded). Importing this module imports no torch:
`Checkpointer` and `should_stop` do, when called. `training.sdk.hf` and `training.sdk.lightning` hold the callbacks
for Hugging Face's and Lightning's Trainers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from contract import metrics
from training.sdk.run import checkpoint_dir, current, rank
from training.signals import StopRequest

__all__ = ["Checkpointer", "checkpoint_dir", "phase", "rank", "report_step", "report_validation", "should_stop"]


def report_step(step: int, *, loss: float | None = None, **values: float) -> None:
    """Step `step` is done: the launcher's hang check sees it; rank 0 prints `step=<step> loss=<loss> <name>=<value>
    ...` (SageMaker's metrics `train:loss`, `train:lr`, `train:grad_norm`, `train:tokens_per_sec`, `train:mfu` are
    read from it when `loss` is given) and keeps the goodput record. Call it on every rank."""
    run = current()
    run.report(step)
    if not run.stepping or step == run.rework_until + 1:
        run.clock.enter("rework" if step <= run.rework_until else "train")
        run.stepping = True
    run.step = step
    if run.rank != 0:
        return
    if loss is not None or values:
        parts = [f"step={step}"] + ([f"loss={float(loss)!r}"] if loss is not None else [])
        parts += [f"{name}={float(value)!r}" for name, value in values.items()]
        sys.stdout.write(" ".join(parts) + "\n")
        sys.stdout.flush()
    run.write_progress(due_only=True)


def report_validation(step: int, val_loss: float) -> None:
    """The validation loss at `step` (SageMaker's metric `validation:loss`); rank 0 prints it."""
    if current().rank == 0:
        print(metrics.format_validation_line(step=step, val_loss=val_loss), flush=True)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the block's time towards a goodput phase (`eval`, `export`, `checkpoint`; contract/metrics.PHASES)."""
    with current().clock.phase(name):
        yield


def should_stop() -> bool:
    """Whether the job was asked to stop (SIGTERM: a spot interruption, a stop), agreed by every rank: call it on
    every rank at the same step (one all-reduce of an int over gloo when there are several); save, then end. The
    first call makes SIGTERM a request, which the script then honours, within the launcher's grace period."""
    run = current()
    if run.stop is None:
        run.stop = StopRequest.install()
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return run.stop.requested
    if run.stop_group is None:
        run.stop_group = dist.new_group(backend="gloo")
    flag = torch.tensor([int(run.stop.requested)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=run.stop_group)
    return bool(flag.item())


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":  # torch is imported when it is used
        from training.sdk.checkpoints import Checkpointer  # noqa: PLC0415

        return Checkpointer
    raise AttributeError(f"module 'training.sdk' has no attribute {name!r}")

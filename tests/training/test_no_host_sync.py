"""The training loop reads no tensor back to the host on steps it does not log.

On a GPU every `.item()`, `float(t)` or `.tolist()` of a device tensor waits for the GPU to drain;
one per step costs a large share of a small model's step time. This runs the real loop and
records every host read of a tensor, with the code that made it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import TINY_JOB, run_in_process

from training.trainer import Trainer

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


def test_unlogged_steps_read_nothing_but_the_control_flags(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(corpus, tmp_path / "input" / "data" / "train")
    step = {"now": 0}
    reads: list[tuple[int, str, str]] = []

    original_step = Trainer._train_step

    def counted_step(self: Trainer) -> Any:
        step["now"] = self.state.step + 1
        return original_step(self)

    monkeypatch.setattr(Trainer, "_train_step", counted_step)
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            reads.append((step["now"], _name, f"{Path(caller.f_code.co_filename).name}:{caller.f_code.co_name}"))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    hyperparameters = {
        **TINY_JOB,
        "max_steps": "12",
        "metrics.log_interval": "5",
        "checkpoint.interval_steps": "0",
        "eval.interval_steps": "0",
    }
    completed, _ = run_in_process(tmp_path, hyperparameters)
    assert completed

    logged = {1, 5, 10, 12}  # the first step, every log_interval, the final (saving) step
    in_loop = [r for r in reads if 1 <= r[0] <= 12 and r[0] not in logged]
    assert in_loop, "the control-flag agreement should have been seen on every step"
    assert {where for _, _, where in in_loop} == {"trainer.py:_agree"}, in_loop
    assert {name for _, name, _ in in_loop} == {"tolist"}

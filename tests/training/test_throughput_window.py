"""The logged tokens/s covers every cost of the steps it averages: the wait for the device's work (on a GPU the
steps are only queued until the host reads a result) and the logging itself, as a peer's per-step time does."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import TINY_JOB, run_in_process

from contract.metrics import TOKENS_PER_SEC, parse_line
from training.trainer import Trainer

PAUSE_S = 0.25
TOKENS_PER_STEP = int(TINY_JOB["seq_len"]) * int(TINY_JOB["batch_size"])


@pytest.mark.parametrize("slow", ["device wait", "logging"])
def test_tokens_per_sec_counts_the_wait_for_the_step_and_the_logging(
    slow: str, tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(corpus, tmp_path / "input" / "data" / "train")
    if slow == "device wait":
        # The loop's first host read of a logged step waits for that step's device work; here it takes PAUSE_S.
        original_item = torch.Tensor.item

        def waiting_item(self: torch.Tensor) -> Any:
            time.sleep(PAUSE_S)
            return original_item(self)

        monkeypatch.setattr(torch.Tensor, "item", waiting_item)
    else:
        original_log = Trainer._log_step

        def slow_log(self: Trainer, *args: Any, **kwargs: Any) -> None:
            original_log(self, *args, **kwargs)
            time.sleep(PAUSE_S)

        monkeypatch.setattr(Trainer, "_log_step", slow_log)
    hyperparameters = {
        **TINY_JOB,
        "max_steps": "5",
        "metrics.log_interval": "1",
        "checkpoint.interval_steps": "0",
        "eval.interval_steps": "0",
    }
    completed, log = run_in_process(tmp_path, hyperparameters)
    assert completed
    rates = {}
    for line in log.splitlines():
        parsed = parse_line(line)
        if parsed is not None and TOKENS_PER_SEC in parsed[1]:
            rates[parsed[0]] = parsed[1][TOKENS_PER_SEC]
    # Steps 2-4: each window holds a logging of the step before and the wait for its own step (step 5 saves,
    # and step 1's window holds no logging).
    seconds_per_step = {step: TOKENS_PER_STEP / rates[step] for step in (2, 3, 4)}
    assert all(seconds >= PAUSE_S for seconds in seconds_per_step.values()), seconds_per_step

"""Trainer entry point, one process per GPU: config -> build -> train -> close, on every path.

    torchrun --nproc-per-node 2 -m training.train --hp model=tiny --hp train.max_steps=200

Hyperparameters come from ``$OPT_ML_ROOT/input/config/hyperparameters.json`` (or ``--hyperparameters``)
with ``--hp KEY=VALUE`` overrides; inputs and outputs live under ``$OPT_ML_ROOT`` (default /opt/ml).
Exit status 0 also when a SIGTERM stopped training after a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from contract import distributions, goodput
from contract.config import JobConfig, from_hyperparameters, parse_overrides
from contract.layout import STRAGGLER_DETECTED
from training.preflight import Preflight, PreflightError, failure_line
from training.sagemaker_contract import Paths, describe, read_hyperparameters, write_failure
from training.signals import StopRequest
from training.stragglers import StragglerError

log = logging.getLogger("training.train")


def load_config(argv: Sequence[str] | None, paths: Paths) -> JobConfig:
    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n")[0])
    parser.add_argument("--hyperparameters", type=Path, help="JSON file (default: the container's)")
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="override one key")
    args = parser.parse_args(argv)
    if args.hyperparameters is not None:
        hyperparameters = json.loads(args.hyperparameters.read_text())
    else:
        hyperparameters = read_hyperparameters(paths)
    return from_hyperparameters({**hyperparameters, **parse_overrides(args.hp)})


def configure_logging() -> None:
    rank = distributions.global_rank(os.environ)
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s %(levelname)s [rank{rank}] %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    # This start's phases count from the launcher's start on this host (contract/goodput.py).
    started = goodput.launched(os.environ, time.monotonic())
    stop = StopRequest.install()  # before the torch import below, which takes seconds
    configure_logging()
    paths = Paths.from_env()
    try:
        # Before torch, which starts NCCL: the check's NCCL settings must be in place when it reads them.
        preflight = Preflight.from_env(os.environ)
        cfg = load_config(argv, paths)
        from training.trainer import Trainer  # noqa: PLC0415  (torch loads after the handler is in place)

        trainer = Trainer(cfg, paths, stop, preflight, started=started)
        try:
            trainer.train()
        except BaseException:
            # A background save is not committed on failure: its collectives could wait on a dead rank.
            trainer.close(commit_pending=False)
            raise
        trainer.close()
    except PreflightError as exc:
        write_failure(paths, failure_line(str(exc)), exc=exc.__cause__)
        return 1
    except StragglerError as exc:
        log.error("%s: %s", STRAGGLER_DETECTED, exc)
        write_failure(paths, f"{STRAGGLER_DETECTED}: {exc}")
        return 1
    except Exception as exc:
        log.exception("training failed")
        write_failure(paths, describe(exc), exc=exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

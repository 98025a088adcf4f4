"""What the tests of a run's own code share: an /opt/ml tree holding packed code, and the launcher run on it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from training_helpers import REPO, clean_env, free_port, make_opt_ml

from contract.code_archive import pack
from contract.user_code import CODE_CHANNEL
from training.sagemaker_contract import Paths

EXAMPLES = REPO / "examples" / "own-code"
QUICK = {"hang.floor_minutes": "5"}
"""Launcher settings every test run takes (no test runs long enough to meet the floor)."""


def code_tree(
    root: Path,
    code: Path,
    hyperparameters: Mapping[str, str],
    *,
    entry_point: str = "train.py",
    channels: Mapping[str, Path] | None = None,
    **packing: object,
) -> Paths:
    """A SageMaker-shaped tree whose `code` channel holds `code` packed, with its `code.*` hyperparameters."""
    paths = make_opt_ml(root, {}, corpus=None)
    packed = pack(code, paths.channel(CODE_CHANNEL), **packing)  # type: ignore[arg-type]
    hps = {"code.entry_point": entry_point, "code.sha256": packed.sha256, **QUICK, **hyperparameters}
    paths.hyperparameters.write_text(json.dumps(hps))
    for name, source in (channels or {}).items():
        shutil.copytree(source, paths.channel(name))
    return paths


def launcher_env(root: Path, nproc: int = 2, **extra: str) -> dict[str, str]:
    return clean_env(
        root,
        TRAINING_MASTER_ADDR="127.0.0.1",
        TRAINING_MASTER_PORT=str(free_port()),
        TRAINING_NPROC_PER_NODE=str(nproc),
        **extra,
    )


def launch(root: Path, nproc: int = 2, timeout: float = 240, **extra: str) -> subprocess.CompletedProcess[str]:
    """The image's entrypoint on the tree; stdout and stderr together, as the job's log has them."""
    return subprocess.run(
        [sys.executable, "-m", "training.launcher", "train"],
        env=launcher_env(root, nproc, **extra),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def losses(log: str) -> dict[int, float]:
    """step -> loss from the metrics lines the SDK prints (the last line of a step wins)."""
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step=(\d+) loss=(\S+)", log, re.MULTILINE)}


def first_line(paths: Paths) -> str:
    return paths.failure.read_text().split("\n", 1)[0] if paths.failure.exists() else ""

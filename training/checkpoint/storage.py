"""A checkpoint's directory: the committed steps, the manifest committed last (atomically and durably), a
checkpoint removed manifest first; the data files DCP's metadata names and whose they are; and the threads each
process writes and reads a checkpoint with."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from contract.layout import MANIFEST, step_of
from training.sagemaker_contract import describe

log = logging.getLogger(__name__)


_MAX_IO_THREADS = 8


def committed_steps(root: Path) -> list[int]:
    """Steps that have a manifest, newest first (their files are verified separately)."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        step = step_of(entry.name)
        if step is not None and (entry / MANIFEST).is_file():
            steps.append(step)
    return sorted(steps, reverse=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Commit a checkpoint: the manifest appears atomically and durably, after everything else."""
    tmp = directory / (MANIFEST + ".tmp")
    with tmp.open("w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / MANIFEST)
    _fsync_dir(directory)


def remove_checkpoint(directory: Path) -> None:
    """Delete the manifest first so that a partly deleted checkpoint reads as incomplete."""
    (directory / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _remove_old(directory: Path) -> None:
    try:
        remove_checkpoint(directory)
        if directory.exists():
            left = sorted(path.name for path in directory.iterdir())
            raise OSError(f"{', '.join(left[:4]) or 'the directory'} could not be deleted")
    except OSError as exc:  # the checkpoint is committed and newer ones are kept: log it, and train on
        log.warning("could not remove old checkpoint %s: %s", directory.name, describe(exc))
    else:
        log.info("removed old checkpoint %s", directory.name)


def data_files(metadata: Metadata) -> list[str]:
    """The DCP data files a checkpoint's metadata refers to."""
    return sorted({info.relative_path for info in metadata.storage_data.values()})


def written_by(rank: int) -> str:
    """How the names of the data files the process of `rank` writes begin (DCP's file writer names them
    ``__<rank>_<i>.distcp``)."""
    return f"__{rank}_"


def io_threads() -> int:
    """Threads (and data files) each process writes a checkpoint with, and hashes one with: this host's
    cores shared among its processes, from 2 (one serialises and hashes while another waits on the disk)
    to 8."""
    return max(2, min(_MAX_IO_THREADS, (os.cpu_count() or 1) // _local_world_size()))


def _local_world_size() -> int:
    """The processes on this host (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

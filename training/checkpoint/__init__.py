"""Exact, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout (its names are contract/layout.py's): ``<root>/step-<N>/`` holds DCP's files (``__<rank>_<i>.distcp``
shards and ``.metadata``) and, written last by rank 0 via temp file + rename + directory fsync,
``manifest.json``. A directory without a manifest is never loaded. The manifest lists every file with
its size and the BLAKE3 digest of each of its segments (runs of whole items, from 16 MiB), so a checkpoint that was
truncated or changed (a partial S3 sync, a kill mid-write, a file replaced in S3) is detected and skipped for
the previous one. Each process writes its share in several threads, one data file each, hashing every
segment as it writes it. A load reads each file it needs once, front to back, a segment at a time into the
reader's own buffers (`direct_io.DirectReader`, which reads a few segments ahead), hashes each segment where
it was read and unpickles nothing from a window (a run of whole segments, one wherever no item straddles a
segment's end, as none of a save here does) until each of its segments matches; its tensors are then copied
from those bytes, so bytes changed after their check are never used, and a load holds a few segments of each
file in memory, not the file; a tensor is saved in pieces of at most 16 MiB (whole rows, one at least), so
that a segment is at most about 32 MiB where no row is larger. Loading never
unpickles arbitrary objects: DCP's ``.metadata`` is read by an unpickler that knows only DCP's metadata
types, a tensor item by one that knows only a plain tensor's (`tensor_archive`, which leaves any other to
torch's weights-only unpickler), and every other item with torch's weights-only unpickler, so a planted
``.metadata`` or item cannot run code.

A checkpoint holds the model and optimizer (resharded by DCP when the number of processes changes),
the LR schedule, the step, the data position and every rank's RNG state (restored only when the
number of processes is unchanged; the data position is world-size independent).

SageMaker uploads /opt/ml/checkpoints file by file, so old checkpoints are deleted only after a newer
one is committed, manifest first, so that a half-deleted checkpoint is never taken for a complete one.

The package, by concern: `integrity` (what a load checks: the manifest, each segment's digest, which errors may
pass), `storage` (the directory: committing, listing and removing checkpoints), `writer` (a save's threads, each
writing and hashing its own file), `planners` (DCP's save and load planners as used here), `reader` (a load's
reader and its metadata unpickler), `state` (what a checkpoint holds, as a DCP state dict) and `manager`
(`CheckpointManager`, which saves, commits, prunes and resumes).
"""

from training.checkpoint.integrity import (
    SAVED_HASH,
    TRANSIENT_ERRNOS,
    CheckpointError,
    manifest_of,
    segment_digest,
    transient,
    verify,
)
from training.checkpoint.manager import LOAD_RETRY_SECONDS, CheckpointManager
from training.checkpoint.state import ModelState, TrainingState
from training.checkpoint.storage import (
    committed_steps,
    data_files,
    io_threads,
    remove_checkpoint,
    write_manifest,
    written_by,
)
from training.checkpoint.writer import file_entries, segments_of

__all__ = [
    "LOAD_RETRY_SECONDS",
    "SAVED_HASH",
    "TRANSIENT_ERRNOS",
    "CheckpointError",
    "CheckpointManager",
    "ModelState",
    "TrainingState",
    "committed_steps",
    "data_files",
    "file_entries",
    "io_threads",
    "manifest_of",
    "remove_checkpoint",
    "segment_digest",
    "segments_of",
    "transient",
    "verify",
    "write_manifest",
    "written_by",
]

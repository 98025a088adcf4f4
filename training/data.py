"""Token shards in llm.c's ``.bin`` format and a deterministic, resumable distributed loader.

A shard is a 256 x int32 header (magic 20240520, version, token count) followed by the tokens:
uint16 for version 1 (llm.c's GPT-2 shards), uint32 for version 2 (its Llama-3 shards).

The loader cuts every shard into samples of ``seq_len + 1`` tokens (inputs and shifted targets;
consecutive samples overlap by one token, as in llm.c). All train samples form one index space; a
global micro-batch is the next ``world_size * micro_batch`` samples of a per-epoch seeded
permutation, and rank r takes its contiguous slice. With ``data.shift_windows`` every epoch also
moves the window grid by a seeded offset, so a second pass over the text sees it at new alignments.
The only position state is the number of samples consumed by all ranks together, so a resume on a
different number of processes continues with exactly the data that comes next.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
_DTYPES: dict[int, np.dtype[np.unsignedinteger[Any]]] = {1: np.dtype(np.uint16), 2: np.dtype(np.uint32)}


class ShardError(ValueError):
    """A token shard is malformed; the message names the file."""


def write_shard(path: Path, tokens: npt.ArrayLike) -> None:
    """Write tokens as a shard atomically (temp file + rename): uint16 if every id fits, else uint32."""
    array = np.asarray(tokens)
    if array.size and (array.min() < 0 or array.max() >= 2**32):
        raise ValueError(f"token ids must be in [0, 2**32), got [{array.min()}, {array.max()}]")
    version = 1 if not array.size or array.max() < 2**16 else 2
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (MAGIC, version, array.size)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as out:
        out.write(header.tobytes())
        out.write(array.astype(_DTYPES[version], copy=False).tobytes())
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def read_shard(path: Path) -> np.memmap[Any, np.dtype[np.unsignedinteger[Any]]]:
    """Memory-map a shard's tokens after checking its header against the file size."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes is shorter than the 1024-byte header")
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    if magic != MAGIC:
        raise ShardError(f"{path}: magic {magic} is not {MAGIC}; is this an llm.c token shard?")
    if version not in _DTYPES:
        raise ShardError(f"{path}: unsupported shard version {version} (expected 1 or 2)")
    dtype = _DTYPES[version]
    expected = HEADER_BYTES + count * dtype.itemsize
    if size != expected:
        raise ShardError(f"{path}: header says {count} tokens ({expected} bytes) but the file has {size}")
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


class Samples(Protocol):
    """What the loaders address: `n_samples` rows of `row_shape`, gathered by index (token windows here, packed
    fine-tuning rows in training/sft.py)."""

    seq_len: int
    n_samples: int
    shifted: bool
    row_shape: tuple[int, ...]

    def gather(self, indices: npt.NDArray[np.int64], shift: int = 0) -> npt.NDArray[np.int64]: ...


class TokenSamples:
    """Every ``seq_len + 1``-token window of a list of shards, addressable by one global index.

    With ``shifted``, a window grid can start ``shift`` tokens (0 <= shift < seq_len) into every shard
    (:meth:`gather`'s ``shift``); the last ``seq_len - 1`` tokens then start no window, so every shift
    has the same windows count.
    """

    def __init__(self, shards: Sequence[Path], seq_len: int, *, shifted: bool = False) -> None:
        self.shards = [read_shard(p) for p in shards]
        self.paths = list(shards)
        self.seq_len = seq_len
        reserve = seq_len - 1 if shifted else 0
        counts = [max(0, (len(s) - 1 - reserve) // seq_len) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n_samples = int(self.starts[-1])
        self.shifted = shifted
        self.row_shape: tuple[int, ...] = (seq_len + 1,)

    def gather(self, indices: npt.NDArray[np.int64], shift: int = 0) -> npt.NDArray[np.int64]:
        """Samples ``indices`` of the grid shifted by ``shift`` tokens as a (len(indices), seq_len + 1) array."""
        if shift and not (self.shifted and 0 < shift < self.seq_len):
            raise ValueError(f"shift {shift} needs shifted samples and 0 <= shift < seq_len={self.seq_len}")
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        shard_ids = np.searchsorted(self.starts, indices, side="right") - 1
        for row, (index, shard_id) in enumerate(zip(indices.tolist(), shard_ids.tolist(), strict=True)):
            offset = shift + (index - int(self.starts[shard_id])) * self.seq_len
            out[row] = self.shards[shard_id][offset : offset + self.seq_len + 1]
        return out


class DistributedTokenLoader:
    """This rank's micro-batches of (inputs, targets); position = samples consumed by all ranks."""

    def __init__(
        self,
        samples: Samples,
        *,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool,
    ) -> None:
        if samples.n_samples < micro_batch * world_size:
            raise ShardError(
                f"{samples.n_samples} training samples of {samples.seq_len + 1} tokens cannot fill one "
                f"batch of {micro_batch} x {world_size} processes; add data or lower data.seq_len / "
                "train.micro_batch_size"
            )
        self.samples = samples
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.consumed = 0
        self._epoch = -1
        self._order: npt.NDArray[np.int64] = np.arange(0, dtype=np.int64)

    def _order_for(self, epoch: int) -> npt.NDArray[np.int64]:
        if epoch != self._epoch:
            n = self.samples.n_samples
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64)
            else:
                self._order = np.arange(n, dtype=np.int64)
            self._epoch = epoch
        return self._order

    def shift_for(self, epoch: int) -> int:
        """Where the epoch's window grid starts in every shard: 0, or with shifted samples a seeded draw."""
        if not self.samples.shifted:
            return 0
        return int(np.random.default_rng([self.seed, epoch, 1]).integers(self.samples.seq_len))

    def next_batch(self) -> npt.NDArray[np.int64]:
        """The next (micro_batch, seq_len + 1) tokens for this rank; advances the global position."""
        n = self.samples.n_samples
        first = self.consumed + self.rank * self.micro_batch
        positions = np.arange(first, first + self.micro_batch, dtype=np.int64)
        out = np.empty((self.micro_batch, *self.samples.row_shape), dtype=np.int64)
        for epoch in np.unique(positions // n).tolist():
            mask = positions // n == epoch
            indices = self._order_for(int(epoch))[positions[mask] % n]
            out[mask] = self.samples.gather(indices, shift=self.shift_for(int(epoch)))
        self.consumed += self.micro_batch * self.world_size
        return out

    def state_dict(self) -> dict[str, int]:
        return {"samples_consumed": self.consumed, "seq_len": self.samples.seq_len}

    def load_state_dict(self, state: dict[str, int]) -> None:
        consumed = int(state["samples_consumed"])
        if int(state["seq_len"]) != self.samples.seq_len:
            # Sample boundaries moved: continue from the same number of tokens, not the same samples.
            consumed = consumed * int(state["seq_len"]) // self.samples.seq_len
        self.consumed = consumed


def validation_batches(
    samples: Samples,
    *,
    micro_batch: int,
    rank: int,
    world_size: int,
    max_sequences: int,
    sample_batches: int = 0,
    seed: int = 0,
) -> list[tuple[npt.NDArray[np.int64], int]]:
    """This rank's share of the fixed validation set as (tokens, valid rows) pairs.

    The set is the first ``max_sequences`` samples or, with ``sample_batches``, that many global
    batches of them drawn at random with ``seed`` (the same draw on every rank and every call; the
    draws for fewer processes are subsets of those for more).
    Samples are strided over ranks so each is evaluated exactly once; every rank gets the same
    number of batches (short ones padded, padding rows not counted) because FSDP forwards are
    collective.
    """
    total = min(samples.n_samples, max_sequences)
    chosen = np.arange(total, dtype=np.int64)
    if sample_batches and sample_batches * micro_batch * world_size < total:
        # The first ones of one seeded order: a draw of fewer sequences (another process count after a
        # resume) is part of a draw of more, so evaluations on either side of the resume share most samples.
        drawn = np.random.default_rng(seed).permutation(total)[: sample_batches * micro_batch * world_size]
        chosen = np.sort(drawn).astype(np.int64)
        total = len(chosen)
    mine = chosen[rank::world_size]
    per_rank = -(-total // world_size)
    n_batches = -(-per_rank // micro_batch)
    padded = np.zeros(n_batches * micro_batch, dtype=np.int64)
    padded[: len(mine)] = mine
    batches = []
    for b in range(n_batches):
        valid = int(np.clip(len(mine) - b * micro_batch, 0, micro_batch))
        batches.append((samples.gather(padded[b * micro_batch : (b + 1) * micro_batch]), valid))
    return batches

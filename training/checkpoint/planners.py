"""DCP's planners as a save and a load here use them: a tensor larger than `_MAX_ITEM` bytes saved as pieces, and
non-tensor items loaded with ``weights_only``."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import cast

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import ReadItem, SavePlan, TensorWriteData, WriteItem, WriteItemType

_MAX_ITEM = 16 << 20
"""A tensor of more bytes than this is saved as pieces of at most this many, runs of rows of its first dimension
(one row at least), each a DCP item of its own: a load holds a window of each file it reads, which is as large as
a segment and the item that ends it, so the largest item sets the memory a load maps (GPT-2's token embedding,
and each of its optimizer moments, is 154 MiB). A load takes the pieces as DCP takes any tensor saved in
chunks, whatever the world size that loads them."""


class _PieceSavePlanner(DefaultSavePlanner):
    """DCP's save planner, saving each tensor larger than `_MAX_ITEM` bytes as pieces of at most that many."""

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        self._pieces: dict[MetadataIndex, tuple[MetadataIndex, int, int]] = {}
        """A piece's index: its tensor's own item's index, and the piece's first row and rows in that item."""
        self.plan = dataclasses.replace(plan, items=[piece for item in plan.items for piece in self._split(item)])
        return self.plan

    def _split(self, item: WriteItem) -> list[WriteItem]:
        data = item.tensor_data
        if data is None or not data.chunk.sizes:
            return [item]
        rows, *row = data.chunk.sizes
        row_bytes = math.prod(row) * data.properties.dtype.itemsize
        if rows * row_bytes <= _MAX_ITEM:
            return [item]
        step = max(1, _MAX_ITEM // row_bytes)
        pieces = []
        for first in range(0, rows, step):
            count = min(step, rows - first)
            offsets = torch.Size((data.chunk.offsets[0] + first, *data.chunk.offsets[1:]))
            chunk = ChunkStorageMetadata(offsets=offsets, sizes=torch.Size((count, *row)))
            piece = WriteItem(
                index=MetadataIndex(item.index.fqn, offsets),
                type=WriteItemType.SHARD,  # DCP takes several items of one tensor only as shards
                tensor_data=TensorWriteData(chunk=chunk, properties=data.properties, size=data.size),
            )
            self._pieces[piece.index] = (item.index, first, count)
            pieces.append(piece)
        return pieces

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        if len(all_plans) == 1:
            return all_plans  # one process's items, which no other shares
        whole = {item.index: item for plan in all_plans for item in plan.items}
        deduped = super()._dedup_save_plans([_sized_by_chunk(plan) for plan in all_plans])
        return [dataclasses.replace(plan, items=[whole[item.index] for item in plan.items]) for plan in deduped]

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        piece = self._pieces.get(write_item.index)
        if piece is None:
            return super().resolve_data(write_item)
        whole, first, count = piece
        return _rows(self.lookup_object(whole), first, count)


def _rows(tensor: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """`count` rows of `tensor`'s first dimension from `first`. Of a contiguous tensor in CPU memory, a tensor
    whose storage is exactly those rows' bytes, not a copy: DCP's writer copies a tensor whose storage holds more
    than the tensor (``torch.save`` would write all of it), and these are most of a checkpoint's bytes."""
    rows = tensor.narrow(0, first, count)
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return rows  # DCP's writer copies it to the CPU, or into a storage of its own
    start = rows.storage_offset() * rows.element_size()
    storage = cast(torch.UntypedStorage, tensor.untyped_storage()[start : start + rows.nbytes])  # a view of it
    return torch.empty(0, dtype=tensor.dtype, device="cpu").set_(storage, 0, rows.size(), rows.stride())


def _sized_by_chunk(plan: SavePlan) -> SavePlan:
    """`plan` with each tensor item sized as its own chunk. DCP's dedup spreads the items every rank holds over
    the ranks by `tensor_data.size`, which is the whole tensor's size for a shard or a piece: each 16 MiB piece of
    a 154 MiB tensor would count 154 MiB, and the ranks that got one piece fewer would get all the rest. Only for
    that: the checkpoint's metadata takes the whole tensor's size from the same field. (A process's items are
    shared among its files by their own bytes: `_files_for`.)"""
    items = [
        item
        if item.tensor_data is None
        else dataclasses.replace(
            item, tensor_data=dataclasses.replace(item.tensor_data, size=item.tensor_data.chunk.sizes)
        )
        for item in plan.items
    ]
    return dataclasses.replace(plan, items=items)


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor items (optimizer settings, progress) with ``weights_only``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded

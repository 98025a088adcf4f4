"""A tensor larger than `_MAX_ITEM` bytes is saved as pieces (training/checkpoint/planners.py), and loads exactly."""

from __future__ import annotations

import io
import math
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.state_dict import _init_optim_state
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.utils.serialization import config as serialization_config
from training_helpers import (
    CHECKPOINTED_JOB,
    compare_unfilled_sharded_optimizer_state,
    free_port,
    make_opt_ml,
    run_in_process,
    save_rows_in_pieces,
    state_layouts,
    step_losses,
)

import training.checkpoint.planners
import training.checkpoint.state
import training.checkpoint.writer
import training.tensor_archive
from training.checkpoint.planners import _PieceSavePlanner, _rows

_ITEM = 4096


def _chunks(directory: Path) -> dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """(offsets, sizes) of each saved chunk of each tensor, from DCP's metadata."""
    metadata = pickle.loads((directory / ".metadata").read_bytes())
    assert isinstance(metadata, Metadata)
    return {
        name: [(tuple(chunk.offsets), tuple(chunk.sizes)) for chunk in stored.chunks]
        for name, stored in metadata.state_dict_metadata.items()
        if isinstance(stored, TensorStorageMetadata)
    }


def _bytes(sizes: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(sizes) * torch.empty(0, dtype=dtype).element_size()


def test_rows_of_a_contiguous_cpu_tensor_share_its_memory_and_hold_no_more(tmp_path: Path) -> None:
    whole = torch.arange(60, dtype=torch.bfloat16).reshape(10, 6)
    rows = _rows(whole, 3, 4)
    assert torch.equal(rows, whole[3:7])
    assert rows.data_ptr() == whole[3:7].data_ptr()  # no copy
    assert rows.untyped_storage().nbytes() == rows.nbytes  # so DCP's writer saves it without copying it either
    # Where the rows are not contiguous memory, a view that DCP's writer copies.
    columns = whole.t()
    assert torch.equal(_rows(columns, 1, 2), columns[1:3])


def test_large_tensors_are_saved_in_pieces_of_at_most_an_item_and_load_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training.checkpoint.planners, "_MAX_ITEM", _ITEM)
    torch.manual_seed(0)
    state = {
        "rows": torch.randn(100, 7),  # 28 bytes a row: 146 rows a piece, so 1 piece
        "large": torch.randn(300, 7),  # 8,400 bytes: 3 pieces
        "half": torch.randn(50, 64).to(torch.bfloat16),  # 6,400 bytes: 2 pieces
        "strided": torch.randn(40, 60).t(),  # not contiguous: 9,600 bytes, 3 pieces
        "vector": torch.randn(2500),  # 10,000 bytes: 3 pieces
        "wide": torch.randn(2, 1500),  # a row is larger than an item: a piece per row
        "step": torch.tensor(7.0),  # no dimension: whole
        "settings": {"lr": 0.1},
    }
    dcp_save(state, storage_writer=FileSystemWriter(tmp_path), planner=_PieceSavePlanner())
    chunks = _chunks(tmp_path)
    assert {name: len(found) for name, found in chunks.items()} == {
        "rows": 1,
        "large": 3,
        "half": 2,
        "strided": 3,
        "vector": 3,
        "wide": 2,
        "step": 1,
    }
    for name, found in chunks.items():
        tensor = state[name]
        assert isinstance(tensor, torch.Tensor)
        if name != "wide":
            assert all(_bytes(sizes, tensor.dtype) <= _ITEM for _, sizes in found), (name, found)
        # The pieces tile the tensor: consecutive runs of rows, from the first to the last.
        if tensor.dim():
            starts = [offsets[0] for offsets, _ in sorted(found)]
            ends = [offsets[0] + sizes[0] for offsets, sizes in sorted(found)]
            assert starts == [0, *ends[:-1]] and ends[-1] == tensor.shape[0], (name, found)
    loaded = {
        name: torch.zeros_like(value) if isinstance(value, torch.Tensor) else {"lr": 0.0}
        for name, value in state.items()
    }
    dcp_load(loaded, storage_reader=FileSystemReader(tmp_path))
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[name], value), name
    assert loaded["settings"] == {"lr": 0.1}


def test_the_shards_of_several_processes_are_saved_in_pieces_at_their_own_rows(tmp_path: Path) -> None:
    mp.spawn(save_rows_in_pieces, args=(2, free_port(), str(tmp_path), _ITEM), nprocs=2)  # type: ignore[attr-defined,no-untyped-call]
    # 100 rows (8,000 bytes) a rank, 80 bytes a row: pieces of 51 rows, from each shard's own first row.
    assert sorted(_chunks(tmp_path)["weight"]) == [
        ((0, 0), (51, 20)),
        ((51, 0), (49, 20)),
        ((100, 0), (51, 20)),
        ((151, 0), (49, 20)),
    ]
    torch.manual_seed(0)
    full = torch.randn(200, 20)
    loaded = {"weight": torch.zeros(200, 20)}
    dcp_load(loaded, storage_reader=FileSystemReader(tmp_path))
    assert torch.equal(loaded["weight"], full)


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_run_saved_in_pieces_trains_and_resumes_bit_for_bit(
    async_save: str, reference: tuple[Path, str], corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training.checkpoint.planners, "_MAX_ITEM", _ITEM)
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    job = {**CHECKPOINTED_JOB, "checkpoint.async_save": async_save}
    completed, log = run_in_process(paths.root, job)
    assert completed and step_losses(log) == step_losses(reference[1])
    chunks = _chunks(paths.checkpoints / "step-8")
    assert max(len(found) for found in chunks.values()) > 1
    shutil.rmtree(paths.checkpoints / "step-12")
    shutil.rmtree(paths.model)
    completed, log = run_in_process(paths.root, job)
    assert completed and "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _balanced_state() -> dict[str, torch.Tensor]:
    """Nine pieces of one tensor, and eight tensors of half a piece each."""
    torch.manual_seed(0)
    return {"large": torch.randn(9 * 64, 16), **{f"small{i}": torch.randn(32, 16) for i in range(8)}}


def _tensor_bytes(plan: SavePlan) -> int:
    return sum(
        math.prod(item.tensor_data.chunk.sizes) * item.tensor_data.properties.dtype.itemsize
        for item in plan.items
        if item.tensor_data is not None
    )


def test_ranks_that_hold_the_same_tensors_share_their_pieces_by_their_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DCP gives each item that several ranks hold (a DDP model's) to one of them, the one with the fewest bytes
    so far; a piece counts its own bytes, not its whole tensor's."""
    monkeypatch.setattr(training.checkpoint.planners, "_MAX_ITEM", _ITEM)
    planner = _PieceSavePlanner()
    planner.set_up_planner(_balanced_state(), is_coordinator=True)
    plan = planner.create_local_plan()
    assert len(plan.items) == 9 + 8
    first, second = planner._dedup_save_plans([plan, plan])
    assert len(first.items) + len(second.items) == len(plan.items)
    # 9 x 4 KiB and 8 x 2 KiB: 26 KiB each at best. Counting each piece as its whole tensor gave one rank five
    # pieces (20 KiB) and the other four and every small tensor (32 KiB).
    assert sorted([_tensor_bytes(first), _tensor_bytes(second)]) == [26 * 1024, 26 * 1024]
    assert {item.tensor_data.size for item in first.items + second.items if item.tensor_data} == {
        torch.Size((9 * 64, 16)),
        torch.Size((32, 16)),
    }  # the metadata's sizes are still the whole tensors'


def test_a_process_spreads_its_pieces_over_its_files_by_their_own_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training.checkpoint.planners, "_MAX_ITEM", _ITEM)
    monkeypatch.setattr(training.checkpoint.writer, "_SMALL_ITEM", 0)  # no item is small here: all are shared out
    monkeypatch.setattr(training.checkpoint.writer, "io_threads", lambda: 2)
    writer, _ = training.checkpoint.writer._writer(tmp_path)
    state = _balanced_state()
    dcp_save(state, storage_writer=writer, planner=_PieceSavePlanner())
    sizes = sorted(path.stat().st_size for path in tmp_path.glob("*.distcp"))
    assert len(sizes) == 2
    assert sizes[1] < 1.2 * sizes[0], sizes  # counted whole, the pieces left one file 20 KiB and the other 32
    loaded = {name: torch.zeros_like(value) for name, value in state.items()}
    dcp_load(loaded, storage_reader=FileSystemReader(tmp_path))
    assert all(torch.equal(loaded[name], value) for name, value in state.items())


def test_a_process_saves_its_small_items_first_in_one_file_and_shares_the_rest_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load reads each file in a thread of its own, front to back: the small items, which cost it the most CPU
    for their bytes, come first and in one file, so that the last bytes read are large items."""
    monkeypatch.setattr(training.checkpoint.writer, "_SMALL_ITEM", 1024)
    monkeypatch.setattr(training.checkpoint.writer, "io_threads", lambda: 2)
    torch.manual_seed(0)
    state: dict[str, Any] = {
        **{f"large{i}": torch.randn(64 * (i + 1), 8) for i in range(6)},  # 2-12 KiB
        **{f"small{i}": torch.randn(16 + i) for i in range(10)},  # 64-100 bytes
        "step": 7,  # a non-tensor item
    }
    writer, _ = training.checkpoint.writer._writer(tmp_path)
    dcp_save(state, storage_writer=writer, planner=_PieceSavePlanner())
    metadata = pickle.loads((tmp_path / ".metadata").read_bytes())
    where = {index.fqn: info for index, info in metadata.storage_data.items()}
    small = [where[f"small{i}"] for i in range(10)]
    large = [where[f"large{i}"] for i in range(6)]
    first = small[0].relative_path
    assert {info.relative_path for info in small} == {first}, "the small items share one file"
    in_first = [info.offset for info in large if info.relative_path == first]
    assert max(info.offset for info in small) < min(in_first, default=math.inf), "ahead of its large items"
    # The large items go to the file with the fewest bytes so far, the small ones counted in theirs.
    sizes = sorted(path.stat().st_size for path in tmp_path.glob("*.distcp"))
    assert len(sizes) == 2 and sizes[1] - sizes[0] <= 12 * 1024 + 4096, sizes
    loaded: dict[str, Any] = {name: torch.zeros_like(value) for name, value in state.items() if name != "step"}
    loaded["step"] = 0
    dcp_load(loaded, storage_reader=FileSystemReader(tmp_path))
    assert loaded["step"] == 7
    assert all(torch.equal(loaded[name], value) for name, value in state.items() if name != "step")


def test_a_save_runs_torch_s_writer_once_for_each_layout_and_writes_what_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's writer costs a small item more time than its bytes do, with the GIL held: a save writes the tensors
    of one dtype and shape around the bytes torch wrote for the first of them (`tensor_archive.write`), and each
    item's archive is the one torch would write, read back by DCP's own reader."""
    monkeypatch.setattr(training.tensor_archive, "_LAYOUTS", {}, raising=False)  # none learnt yet
    torch.manual_seed(0)
    state: dict[str, Any] = {
        **{f"bias{i}": torch.randn(768) for i in range(40)},
        **{f"step{i}": torch.tensor(float(i)) for i in range(40)},
        "weight": torch.randn(64, 768),
        "progress": "{}",  # a non-tensor item
    }
    saves: list[torch.Size] = []
    save = torch.save

    def counted(value: Any, stream: Any) -> None:
        if isinstance(value, torch.Tensor):  # DCP's planner pickles the non-tensor items with torch.save too
            saves.append(value.shape)
        save(value, stream)

    monkeypatch.setattr(torch, "save", counted)
    writer, _ = training.checkpoint.writer._writer(tmp_path)
    dcp_save(state, storage_writer=writer, planner=_PieceSavePlanner())
    monkeypatch.setattr(torch, "save", save)
    assert sorted(saves) == sorted([torch.Size([768])] * 3 + [torch.Size([])] * 3 + [torch.Size([64, 768])] * 3)
    metadata = pickle.loads((tmp_path / ".metadata").read_bytes())
    for index, info in metadata.storage_data.items():
        if index.fqn == "progress":
            continue
        with (tmp_path / info.relative_path).open("rb") as file:
            file.seek(info.offset)
            found = file.read(info.length)
        expected = io.BytesIO()
        with serialization_config.patch({"save.compute_crc32": False}):
            torch.save(state[index.fqn], expected)
        assert found == expected.getvalue(), index.fqn
    loaded: dict[str, Any] = {name: torch.zeros_like(value) for name, value in state.items() if name != "progress"}
    loaded["progress"] = ""
    dcp_load(loaded, storage_reader=FileSystemReader(tmp_path))
    assert loaded["progress"] == "{}"
    assert all(torch.equal(loaded[name], value) for name, value in state.items() if name != "progress")


def test_only_the_very_same_tensor_under_another_name_is_left_out_of_a_state_dict() -> None:
    """Tied weights are saved once, an empty one too (a rank's empty shard of a tied weight, which every rank
    must leave out alike); views of the same bytes seen another way, copies and other empty tensors are not the
    same tensor."""
    base, empty = torch.arange(12.0).reshape(3, 4), torch.empty(0)
    model_sd = {
        "a": base,
        "b": base.detach(),
        "t": base.t(),
        "row": base[1],
        "copy": base.clone(),
        "empty": empty,
        "empty_tied": empty.detach(),
        "another_empty": torch.empty(0),
        "n": 3,
    }
    kept, tied = training.checkpoint.state._untied(model_sd)
    assert tied == {"b": "a", "empty_tied": "empty"}
    assert list(kept) == ["a", "t", "row", "copy", "empty", "another_empty", "n"]


def _params() -> list[torch.nn.Parameter]:
    """Parameters of several ranks, dtypes and layouts, one of them frozen."""
    torch.manual_seed(0)
    frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    return [
        torch.nn.Parameter(torch.randn(4, 3)),
        torch.nn.Parameter(torch.randn(3, 4).t()),
        torch.nn.Parameter(torch.randn(5)),
        torch.nn.Parameter(torch.randn(())),
        torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64)),
        frozen,
    ]


def _groups(params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
    return [{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:], "weight_decay": 0.0}]


_OPTIMIZERS = {
    "adamw_fused": lambda groups: torch.optim.AdamW(groups, lr=1e-3, fused=True),
    "adamw_foreach": lambda groups: torch.optim.AdamW(groups, lr=1e-3, foreach=True),
    "adamw_amsgrad": lambda groups: torch.optim.AdamW(groups, lr=1e-3, amsgrad=True, foreach=False),
    "adam": lambda groups: torch.optim.Adam(groups, lr=1e-3),
    "sgd_momentum": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.1),
    "rmsprop_centered": lambda groups: torch.optim.RMSprop(groups, lr=1e-3, momentum=0.9, centered=True),
    "nadam": lambda groups: torch.optim.NAdam(groups, lr=1e-3),
}


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_an_optimizer_s_unfilled_state_is_laid_out_as_dcp_s_step_lays_it_out(name: str) -> None:
    """A load fills the optimizer state made without a step: its entries, and each tensor's type, shape, strides,
    dtype and device, are those DCP's step on zero gradients makes, and the parameters and options are untouched."""
    stepped_params, unfilled_params = _params(), _params()
    stepped, unfilled = _OPTIMIZERS[name](_groups(stepped_params)), _OPTIMIZERS[name](_groups(unfilled_params))
    _init_optim_state(stepped)
    assert training.checkpoint.state._unfilled_optimizer_state(unfilled) == bool(stepped.state)  # plain SGD keeps none
    assert not training.checkpoint.state._unfilled_optimizer_state(unfilled)
    expected, made = stepped.state_dict(), unfilled.state_dict()
    assert made["param_groups"] == expected["param_groups"]
    assert made["state"].keys() == expected["state"].keys() == ({0, 1, 2, 3, 4} if stepped.state else set())
    assert state_layouts(made["state"]) == state_layouts(expected["state"])
    assert all(p.equal(q) and p.grad is None for p, q in zip(unfilled_params, _params(), strict=True))


class _OwnAdamW(torch.optim.AdamW):
    """An optimizer not of torch.optim, whose step may do what torch's do not."""


class _RowsByRows(torch.optim.Optimizer):
    """Keeps a rows x rows state for each matrix, as a preconditioner does; presented as one of torch.optim's."""

    __module__ = "torch.optim._rows_by_rows"

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 1e-3})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["rows"] = torch.zeros(p.shape[0], p.shape[0], dtype=p.dtype, device=p.device)


def test_an_optimizer_whose_state_is_not_shaped_like_its_parameters_or_that_has_gradients_is_left_to_dcp() -> None:
    """Adafactor keeps factored rows and columns, and another a rows x rows state of a matrix; another cannot step
    on tensors as small as the twins; an optimizer with gradients is one DCP takes to need no state; one not of
    torch.optim may step otherwise."""

    class _SmallRefused(_RowsByRows):
        def step(self, closure: Any = None) -> None:
            if any(p.numel() < 4 for group in self.param_groups for p in group["params"]):
                raise ValueError("too small")

    assert not training.checkpoint.state._unfilled_optimizer_state(
        _SmallRefused([torch.nn.Parameter(torch.randn(4, 3))])
    )
    square = torch.nn.Parameter(torch.randn(3, 3))
    assert not training.checkpoint.state._unfilled_optimizer_state(
        _RowsByRows([square, torch.nn.Parameter(torch.randn(4, 3))])
    )
    own = _OwnAdamW(_groups(_params()), lr=1e-3)
    assert not training.checkpoint.state._unfilled_optimizer_state(own)
    assert not own.state
    factored = torch.optim.Adafactor(_groups(_params()), lr=1e-2)
    assert not training.checkpoint.state._unfilled_optimizer_state(factored)
    assert not factored.state
    params = _params()
    params[0].grad = torch.zeros_like(params[0])
    with_gradients = torch.optim.AdamW(_groups(params), lr=1e-3)
    assert not training.checkpoint.state._unfilled_optimizer_state(with_gradients)
    assert not with_gradients.state


def test_the_unfilled_state_of_sharded_parameters_is_sharded_as_dcp_s_step_shards_it() -> None:
    mp.spawn(compare_unfilled_sharded_optimizer_state, args=(2, free_port()), nprocs=2)  # type: ignore[attr-defined,no-untyped-call]

"""A Hugging Face model folder's weights: read into the built-in model, and the trained model written as one.

Reading is streamed and sharded: after the model is sharded (FSDP2 places each rank's rows of every weight;
DDP none), each process reads from the safetensors files only the part of each weight it holds. A whole weight
that is to live on the CPU in the file's dtype (a world of one, DDP, a pipeline stage) gets no storage of its
own: its file's bytes are read into a page-aligned buffer and the parameter is a view of them there, GPT-2's
Conv1D weights a transposed view (nothing is copied); where the trainer knows that before it builds the model
(DDP, a world of one), these reads start first (`Prefetch`). Any other part is read straight into its parameter where
the file's dtype is the parameter's, else into a buffer of that part alone (then converted or transposed into it).
The reads are of 8 MiB chunks, several at once (by the process's reading threads), with O_DIRECT where the file
system allows: a cold load then runs at the disk's speed (the page cache's small read-ahead halved it on the
benchmark VM, docs/BENCHMARKS.md); safetensors' own loader maps the whole file, whose page faults read it at that
pace too, which is why the reads are done here. A part that is not whole rows of the file's tensor (a transposed
GPT-2 Conv1D weight under FSDP) is read through a memory map, whose reads touch only its pages. No process holds a
whole file or another rank's part. The folder's layout and checks are contract/model_folder.py's.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import math
import mmap
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from contract import model_folder as mf
from contract.model_args import ModelArgs
from training import direct_io

_TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_NUMPY_VIEWS = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
MAX_SHARD_BYTES = 5 * 2**30
"""The exported shards' size bound (transformers' default for save_pretrained)."""


@dataclass(frozen=True)
class BaseModel:
    """A model folder the trainer starts from, checked: its config, the built-in model's arguments, its shards."""

    path: Path
    config: dict[str, Any]
    args: ModelArgs
    index: dict[str, Any] | None
    headers: dict[str, mf.ShardHeader]

    @property
    def dtype(self) -> str:
        """The safetensors dtype of most of its weights."""
        return mf.weights_dtype(self.headers)

    def locate(self, weight: mf.WeightName) -> tuple[str, str]:
        """(file, name in that file) of a weight."""
        for file, header in self.headers.items():
            name = mf.checkpoint_name(weight.hf, set(header.tensors))
            if name is not None:
                return file, name
        raise KeyError(weight.hf)


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path.name} cannot be read as JSON: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name} must hold a JSON object")
        return None
    return data


def _file_header(path: Path) -> mf.ShardHeader | None:
    if not path.is_file():
        return None
    with path.open("rb") as handle:

        def read(offset: int, length: int) -> bytes:
            handle.seek(offset)
            return handle.read(length)

        return mf.read_header(read, path.name, path.stat().st_size)


def open_base_model(path: Path, *, dropout: float = 0.0) -> BaseModel:
    """The model folder at `path`, checked as Validate checks it; ModelFolderError listing every problem."""
    if not path.is_dir():
        raise mf.ModelFolderError([f"model folder {path} does not exist; give the run's init_from a model folder"])
    problems: list[str] = []
    config = _read_json(path / mf.CONFIG_FILE, problems)
    if config is None:
        raise mf.ModelFolderError([*problems, f"{mf.CONFIG_FILE} is missing from the model folder {path}"])
    args = mf.model_args(config, dropout=dropout)
    index = _read_json(path / mf.INDEX_FILE, problems)
    headers: dict[str, mf.ShardHeader | None] = {}
    try:
        for file in mf.shard_files(index):
            headers[file] = _file_header(path / file)
    except mf.ModelFolderError as exc:
        problems += exc.problems
    problems += mf.check_weights(args, index, headers)
    tokenizer = _read_json(path / mf.TOKENIZER_FILE, problems)
    if tokenizer is not None:
        problems += mf.check_tokenizer(args, tokenizer)
    if problems:
        raise mf.ModelFolderError(problems)
    present = {file: header for file, header in headers.items() if header is not None}
    return BaseModel(path=path, config=config, args=args, index=index, headers=present)


# -- reading -------------------------------------------------------------------------------------------

Slots = dict[str, tuple[nn.Module, str]]
"""Each parameter's name in the built-in model -> (its module, its attribute), which stay the same objects when
the model is sharded or wrapped (FSDP2 replaces the parameters, not the modules)."""


def parameter_slots(model: nn.Module) -> Slots:
    """Where each of the model's parameters lives (a tied weight once, under its first name), by the model's name
    for it (a block wrapped for activation checkpointing has its wrapper's prefix in its names)."""
    slots: Slots = {}
    seen: set[int] = set()
    for prefix, module in model.named_modules():  # named_parameters' order, without a look-up per name
        for attr, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                slots[f"{prefix}.{attr}".lstrip(".").replace(_CHECKPOINT_PREFIX, "")] = (module, attr)
    return slots


def _bytes(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as writable bytes."""
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


def local_part(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """This process's part of a parameter: its local tensor, shape and offset in the whole."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return param.to_local(), tuple(shape), tuple(offset)
    return param.data, tuple(param.shape), (0,) * param.dim()


_thread_buffers = threading.local()


def _read_chunk(fd: int, start: int, target: memoryview, direct: bool) -> None:
    """`len(target)` bytes of the file from `start` into `target`: with O_DIRECT, whole aligned blocks into this
    thread's aligned buffer, then copied; else one positioned read straight into it."""
    if not direct:
        done = 0
        while done < len(target):
            got = os.preadv(fd, [target[done:]], start + done)
            if not got:
                raise OSError(f"a weight file ended {len(target) - done} bytes early at offset {start + done}")
            done += got
        return
    try:
        _read_aligned(fd, start, target)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _through_page_cache(fd)
        _read_chunk(fd, start, target, False)


def _read_aligned(fd: int, start: int, target: memoryview) -> None:
    buffer = getattr(_thread_buffers, "buffer", None)
    if buffer is None:
        buffer = _thread_buffers.buffer = direct_io.aligned_buffer(direct_io.CHUNK + 2 * direct_io.ALIGNMENT)
    first = start - start % direct_io.ALIGNMENT
    end = -(-(start + len(target)) // direct_io.ALIGNMENT) * direct_io.ALIGNMENT
    view = memoryview(buffer)[: end - first]
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], first + done)
        if not got:
            break
        done += got
    if first + done < start + len(target):
        raise OSError(f"a weight file ended at offset {first + done}, before {start + len(target)}")
    target[:] = view[start - first : start - first + len(target)]


_FINISHERS = min(4, os.cpu_count() or 1)
"""Conversions and transpositions at once (torch's copies release the GIL)."""


def _open_to_read(path: Path) -> tuple[int, bool]:
    """A file descriptor to read `path` with O_DIRECT where its file system allows (and whether it does)."""
    flag = getattr(os, "O_DIRECT", 0)
    try:
        return os.open(path, os.O_RDONLY | flag), bool(flag)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return os.open(path, os.O_RDONLY), False


@dataclass
class _Part:
    """One weight's part to read: where in which file, into what, and what to do with it once read."""

    file: str
    start: int
    target: torch.Tensor
    finish: Callable[[], None] | None
    staging: mmap.mmap | None = None
    """An aligned buffer whose span of the file, from `start` rounded down to a block, holds `target` (a part to
    convert or transpose): read into it straight, with no copy out of a reading thread's buffer."""


def _staged(start: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[mmap.mmap, torch.Tensor]:
    """An aligned buffer for the whole blocks of the file that hold `shape` elements of `dtype` at `start`, and the
    tensor of those elements in it."""
    nbytes = math.prod(shape) * dtype.itemsize
    lead = start % direct_io.ALIGNMENT
    staging = direct_io.aligned_buffer(-(-(lead + nbytes) // direct_io.ALIGNMENT) * direct_io.ALIGNMENT)
    return staging, torch.frombuffer(staging, dtype=dtype, count=math.prod(shape), offset=lead).view(shape)


def _read_span(fd: int, start: int, span: memoryview, need: int) -> None:
    """The file's bytes from `start` (a block boundary) into `span` (a block-aligned slice of a staging buffer),
    of which the first `need` must exist (the file may end in the last block)."""
    done = 0
    while done < len(span):
        try:
            got = os.preadv(fd, [span[done:]], start + done)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _through_page_cache(fd)
            continue
        if not got:
            break
        done += got
    if done < need:
        raise OSError(f"a weight file ended at offset {start + done}, before {start + need}")


def _through_page_cache(fd: int) -> None:
    """The device refused a direct transfer (blocks larger than direct_io.ALIGNMENT): read `fd` buffered."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))


def _chunk_reads(readers: ThreadPoolExecutor, fd: int, direct: bool, part: _Part) -> list[Future[None]]:
    """The reads of a part, `direct_io.CHUNK` bytes each."""
    if part.staging is not None:
        first = part.start - part.start % direct_io.ALIGNMENT
        need = part.start - first + part.target.numel() * part.target.element_size()
        span = memoryview(part.staging)
        return [
            readers.submit(_read_span, fd, first + at, span[at : at + direct_io.CHUNK], min(direct_io.CHUNK, need - at))
            for at in range(0, need, direct_io.CHUNK)
        ]
    target = _bytes(part.target)
    return [
        readers.submit(_read_chunk, fd, part.start + at, target[at : at + direct_io.CHUNK], direct)
        for at in range(0, len(target), direct_io.CHUNK)
    ]


def _read_parts(folder: Path, parts: list[_Part]) -> None:
    """Every part's bytes, in chunks read by the process's reading threads (`direct_io.READ_THREADS` at a time),
    with O_DIRECT where the file system allows (a cold read at the disk's speed, without the page cache's copy and
    its small read-ahead); each part's finish
    (a conversion or transposition into its parameter) runs as soon as its chunks are in, while others are read."""
    descriptors = {file: _open_to_read(folder / file) for file in sorted({part.file for part in parts})}
    readers = direct_io.reading_threads()
    try:
        with ThreadPoolExecutor(_FINISHERS) as finisher:
            chunks, finishing = [], []
            for part in parts:
                chunks += (reads := _chunk_reads(readers, *descriptors[part.file], part))
                if part.finish is not None:
                    finishing.append(finisher.submit(_after, reads, part.finish))
            _all_done([*chunks, *finishing])
    finally:
        for fd, _ in descriptors.values():
            os.close(fd)


def _all_done(futures: list[Future[None]]) -> None:
    """Each future's result (the first error raised), and none left running: those not started are cancelled, the
    others waited for (the reads' files are closed after)."""
    try:
        for done in futures:
            done.result()
    finally:
        for future in futures:
            future.cancel()
        wait(futures)


def _after(chunks: list[Future[None]], finish: Callable[[], None]) -> None:
    for chunk in chunks:
        chunk.result()
    finish()


def _strided_part(
    path: Path, start: int, entry: Mapping[str, Any], shape: tuple[int, ...], offset: tuple[int, ...]
) -> torch.Tensor:
    """A part that is not whole rows of the file's tensor, through a memory map: only its pages are read."""
    mapped = np.memmap(path, dtype=_NUMPY_VIEWS[entry["dtype"]], mode="r", offset=start, shape=tuple(entry["shape"]))
    window = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
    part = torch.from_numpy(np.ascontiguousarray(mapped[window]))
    return part.view(torch.bfloat16) if entry["dtype"] == "BF16" else part


_GAP = 1 << 20
"""Weights whose bytes lie at most this far apart in their file share a read buffer (the bytes between are read)."""


@dataclass(frozen=True)
class _InFile:
    """A whole weight's bytes in its file."""

    weight: mf.WeightName
    start: int
    end: int
    entry: Mapping[str, Any]


def _in_file(base: BaseModel, weight: mf.WeightName) -> tuple[str, _InFile]:
    file, name = base.locate(weight)
    header = base.headers[file]
    entry = header.tensors[name]
    begin, end = (header.data_start + at for at in entry["data_offsets"])
    return file, _InFile(weight, begin, end, entry)


def _runs(items: list[_InFile]) -> Iterable[list[_InFile]]:
    """`items` (in file order) as runs whose neighbours are at most `_GAP` bytes apart."""
    run = items[:1]
    for item in items[1:]:
        if item.start - run[-1].end > _GAP:
            yield run
            run = []
        run.append(item)
    if run:
        yield run


def _buffers(wanted: dict[str, list[_InFile]]) -> tuple[list[_Part], dict[str, torch.Tensor]]:
    """One aligned buffer for the blocks of each run of the wanted weights in their file, and the read that fills
    it; each weight's view of its bytes there (in our layout: GPT-2's Conv1D weights transposed)."""
    reads, views = [], {}
    for file, items in wanted.items():
        for run in _runs(sorted(items, key=lambda item: item.start)):
            first, end = run[0].start - run[0].start % direct_io.ALIGNMENT, run[-1].end
            staging = direct_io.aligned_buffer(-(-(end - first) // direct_io.ALIGNMENT) * direct_io.ALIGNMENT)
            for item in run:
                dtype = _TORCH_DTYPES[item.entry["dtype"]]
                count = (item.end - item.start) // dtype.itemsize
                value = torch.frombuffer(staging, dtype=dtype, count=count, offset=item.start - first)
                value = value.view(tuple(item.entry["shape"]))
                views[item.weight.ours] = value.t() if item.weight.transposed else value
            whole = torch.frombuffer(staging, dtype=torch.uint8, count=end - run[0].start, offset=run[0].start - first)
            reads.append(_Part(file, run[0].start, whole, None, staging))
    return reads, views


class Prefetch:
    """The reads of a folder's whole weights in the default dtype, started before the model they are for is built
    (where each process will hold every weight whole on the CPU): the build and the placement run while the disk
    reads. `place_in_read_buffers` makes the parameters views of these buffers."""

    def __init__(self, base: BaseModel) -> None:
        wanted: dict[str, list[_InFile]] = {}
        for weight in mf.weight_names(base.args):
            file, item = _in_file(base, weight)
            if _TORCH_DTYPES[item.entry["dtype"]] == torch.get_default_dtype() and item.end > item.start:
                wanted.setdefault(file, []).append(item)
        parts, self.views = _buffers(wanted)
        self._descriptors = {file: _open_to_read(base.path / file) for file in wanted}
        readers = direct_io.reading_threads()
        self._chunks = [chunk for part in parts for chunk in _chunk_reads(readers, *self._descriptors[part.file], part)]

    def wait(self) -> None:
        """Every read done (an error of one raised), the threads and files closed."""
        try:
            _all_done(self._chunks)
        finally:
            for fd, _ in self._descriptors.values():
                os.close(fd)
            self._descriptors = {}


@dataclass
class Placed:
    """Parameters made views of the buffers their file's bytes are to be read into, and those reads (to start, or
    started by a Prefetch)."""

    names: set[str] = field(default_factory=set)
    reads: list[_Part] = field(default_factory=list)
    prefetch: Prefetch | None = None


def place_in_read_buffers(
    part: nn.Module, base: BaseModel, device: torch.device, prefetch: Prefetch | None = None
) -> Placed:
    """Before `part` (on the meta device) is given storage: each whole parameter (not a DTensor) that is to live on
    the CPU in its file's dtype becomes a view of the page-aligned buffer its bytes are read into (`prefetch`'s
    where it read them), in every module that holds it (GPT-2's Conv1D weights a transposed view); weights close
    together in a file share one. Its memory is then written once, by the disk."""
    placed = Placed(prefetch=prefetch)
    if device.type != "cpu":
        return placed
    slots = parameter_slots(part)
    params: dict[str, nn.Parameter] = {}
    wanted: dict[str, list[_InFile]] = {}
    for weight in mf.weight_names(base.args):
        param = getattr(*slots[weight.ours]) if weight.ours in slots else None
        if not isinstance(param, nn.Parameter) or isinstance(param, DTensor) or param.device.type != "meta":
            continue
        file, item = _in_file(base, weight)
        if _TORCH_DTYPES[item.entry["dtype"]] != param.dtype or param.numel() == 0:
            continue
        params[weight.ours] = param
        if prefetch is None or weight.ours not in prefetch.views:
            wanted.setdefault(file, []).append(item)
    placed.reads, views = _buffers(wanted)
    views = {**(prefetch.views if prefetch else {}), **views}
    holders = _holders(part)
    for name, param in params.items():
        new = nn.Parameter(views[name], requires_grad=param.requires_grad)
        for module, attr in holders[id(param)]:
            module.register_parameter(attr, new)
    placed.names = set(params)
    return placed


def _holders(part: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in part.modules():
        for attr, param in module.named_parameters(recurse=False):
            out.setdefault(id(param), []).append((module, attr))
    return out


def empty_rest(part: nn.Module, device: torch.device, placed: Placed) -> None:
    """Storage on `device` for every parameter and buffer of `part` still on the meta device (`to_empty` where
    nothing was placed in read buffers)."""
    if not placed.names:
        part.to_empty(device=device)
        return
    # to_empty's own walk over the module's tensors, leaving those that have storage.
    cast(Any, part)._apply(lambda t: torch.empty_like(t, device=device) if t.device.type == "meta" else t)


@torch.no_grad()
def load_weights(slots: Slots, base: BaseModel, *, some: bool = False, placed: Placed | None = None) -> set[str]:
    """Fill each parameter's local part (after `to_empty`, sharded or not) from the base model's files: the rows
    it holds of each weight, read as one range (into the parameter itself where dtypes match), and the read buffers
    `placed` made parameters of. `some`: the slots are a pipeline stage's, which holds some of the weights (else a
    missing one is a KeyError). The slots it filled."""
    placed = placed or Placed()
    parts = list(placed.reads)
    filled = set(placed.names)
    for weight in mf.weight_names(base.args):
        if weight.ours in placed.names or (some and weight.ours not in slots):
            continue
        module, attr = slots[weight.ours]
        filled.add(weight.ours)
        local, shape, offset = local_part(getattr(module, attr))
        if local.numel() == 0:
            continue
        if local.device.type == "cpu":
            direct_io.advise_huge_pages(local.data_ptr(), local.numel() * local.element_size())
        file, name = base.locate(weight)
        header = base.headers[file]
        entry = header.tensors[name]
        start = header.data_start + entry["data_offsets"][0]
        if weight.transposed:
            shape, offset = shape[::-1], offset[::-1]
        full = tuple(entry["shape"])
        if shape[1:] != full[1:]:  # not whole rows of the file's tensor
            part = _strided_part(base.path / file, start, entry, shape, offset)
            local.copy_(part.t() if weight.transposed else part)
            continue
        dtype = _TORCH_DTYPES[entry["dtype"]]
        direct = not weight.transposed and dtype == local.dtype and local.is_contiguous() and local.device.type == "cpu"
        row = math.prod(full[1:]) * mf.DTYPE_BYTES[entry["dtype"]]
        at = start + offset[0] * row
        if direct:
            parts.append(_Part(file, at, local, None))
            continue
        staging, target = _staged(at, shape, dtype)
        parts.append(
            _Part(file, at, target, functools.partial(_copy, local, target, transposed=weight.transposed), staging)
        )
    try:
        _read_parts(base.path, parts)
    finally:
        if placed.prefetch is not None:
            placed.prefetch.wait()
    return filled


def _copy(local: torch.Tensor, part: torch.Tensor, *, transposed: bool) -> None:
    local.copy_(part.t() if transposed else part)


def rope_frequencies(base: BaseModel) -> torch.Tensor:
    """Llama's rotary inverse frequencies for the folder's config, as transformers computes them (with the
    llama3 rule's long-context scaling where the config asks for it)."""
    args, rope = base.args, mf.rope_parameters(base.config)
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.int64).float() / args.head_dim))
    if rope["rope_type"] != "llama3":
        return inv_freq
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    context = float(rope["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, smoothed, scaled)


@torch.no_grad()
def set_rope(model: nn.Module, base: BaseModel) -> None:
    """Llama's rope tables (buffers, never loaded: after `to_empty` they hold nothing) for the folder's config."""
    if base.args.arch != "llama":
        return
    angles = torch.outer(torch.arange(base.args.max_seq_len, dtype=torch.float32), rope_frequencies(base))
    for name, table in (("rope_cos", angles.cos()), ("rope_sin", angles.sin())):
        buffer = model.get_buffer(name)
        buffer.copy_(table.to(buffer.device))


# -- writing -------------------------------------------------------------------------------------------


def hf_state(full: Mapping[str, Any], args: ModelArgs, dtype: str) -> dict[str, torch.Tensor]:
    """The built-in model's full state under the checkpoint's names and layout, in `dtype` (safetensors')."""
    out = {}
    for weight in mf.weight_names(args):
        tensor = full[weight.ours].detach().to("cpu", _TORCH_DTYPES[dtype])
        out[weight.hf] = (tensor.t() if weight.transposed else tensor).contiguous()
    return out


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def generation_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """generation_config.json for a folder that has none: the token ids the model config names."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if config.get(key) is not None}


def write_model_folder(
    directory: Path, full: Mapping[str, Any], base: BaseModel, *, max_shard_bytes: int = MAX_SHARD_BYTES
) -> Path:
    """The trained model as a model folder at `directory`, in the base model's dtype: config, shards with their
    index, tokenizer files, generation config. Written beside it, then renamed into place: the folder appears
    whole or not at all."""
    tensors = hf_state(full, base.args, base.dtype)
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shards = _shards(tensors, max_shard_bytes)
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(staging / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(staging / mf.INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    # transformers 5 writes `dtype`, earlier releases `torch_dtype`: the base model's own key says which.
    dtype_key = "dtype" if "dtype" in base.config else "torch_dtype"
    _write_json(staging / mf.CONFIG_FILE, {**base.config, dtype_key: mf.TORCH_DTYPES[base.dtype]})
    source_generation = base.path / mf.GENERATION_CONFIG_FILE
    if source_generation.is_file():
        shutil.copyfile(source_generation, staging / mf.GENERATION_CONFIG_FILE)
    else:
        _write_json(staging / mf.GENERATION_CONFIG_FILE, generation_config(base.config))
    for name in mf.TOKENIZER_FILES:
        if (base.path / name).is_file():
            shutil.copyfile(base.path / name, staging / name)
    commit_folder(staging, directory)
    return directory


def commit_folder(staging: Path, directory: Path) -> None:
    """Make `staging`'s files durable, then move it to `directory` (an earlier folder there is replaced)."""
    for path in staging.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(staging, directory)
    shutil.rmtree(old, ignore_errors=True)
    descriptor = os.open(directory.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

"""A Hugging Face model folder's weights: read into the built-in model, and the trained model written as one.

Reading is streamed and sharded: after the model is sharded (FSDP2 places each rank's rows of every weight;
DDP none), each process reads from the safetensors files only the part of each weight it holds, straight
into its parameter where the file's dtype is the parameter's (one positioned read of contiguous bytes), else
through a buffer of that part alone; a part that is not whole rows of the file's tensor (a transposed
GPT-2 Conv1D weight under FSDP) is read through a memory map, whose reads touch only the pages it holds.
No process ever holds a whole file or another rank's part. The folder's layout and checks are
contract/model_folder.py's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from contract import model_folder as mf
from contract.model_args import ModelArgs

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
    """Where each of the model's parameters lives (a tied weight once, under its first name)."""
    return {
        name: (model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
        for name, _ in model.named_parameters()
    }


def _readinto(handle: BinaryIO, target: memoryview, offset: int) -> None:
    handle.seek(offset)
    done = 0
    while done < len(target):
        got = handle.readinto(target[done:])  # type: ignore[attr-defined]
        if not got:
            raise OSError(f"{handle.name}: ended {len(target) - done} bytes early at offset {offset + done}")
        done += got


def _bytes(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as writable bytes."""
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


def local_part(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """This process's part of a parameter: its local tensor, shape and offset in the whole."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return param.to_local(), tuple(shape), tuple(offset)
    return param.data, tuple(param.shape), (0,) * param.dim()


def _read_part(
    handle: BinaryIO, start: int, entry: Mapping[str, Any], shape: tuple[int, ...], offset: tuple[int, ...]
) -> torch.Tensor:
    """The part [offset, offset + shape) of a tensor stored at `start` in the file, in the file's dtype."""
    dtype, full = entry["dtype"], tuple(entry["shape"])
    itemsize = mf.DTYPE_BYTES[dtype]
    if shape[1:] == full[1:]:  # whole rows: one run of bytes
        part = torch.empty(shape, dtype=_TORCH_DTYPES[dtype])
        row = math.prod(full[1:]) * itemsize
        _readinto(handle, _bytes(part), start + offset[0] * row)
        return part
    mapped = np.memmap(handle.name, dtype=_NUMPY_VIEWS[dtype], mode="r", offset=start, shape=full)
    window = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
    part = torch.from_numpy(np.ascontiguousarray(mapped[window]))
    return part.view(torch.bfloat16) if dtype == "BF16" else part


@torch.no_grad()
def load_weights(slots: Slots, base: BaseModel) -> None:
    """Fill each parameter's local part (after `to_empty`, sharded or not) from the base model's files."""
    handles: dict[str, BinaryIO] = {}
    try:
        for weight in mf.weight_names(base.args):
            module, attr = slots[weight.ours]
            local, shape, offset = local_part(getattr(module, attr))
            if local.numel() == 0:
                continue
            file, name = base.locate(weight)
            header = base.headers[file]
            entry = header.tensors[name]
            if file not in handles:
                handles[file] = (base.path / file).open("rb", buffering=0)
            start = header.data_start + entry["data_offsets"][0]
            if weight.transposed:
                part = _read_part(handles[file], start, entry, shape[::-1], offset[::-1]).t()
            elif _TORCH_DTYPES[entry["dtype"]] == local.dtype and local.is_contiguous() and local.device.type == "cpu":
                row = math.prod(entry["shape"][1:]) * mf.DTYPE_BYTES[entry["dtype"]]
                _readinto(handles[file], _bytes(local), start + offset[0] * row)
                continue
            else:
                part = _read_part(handles[file], start, entry, shape, offset)
            local.copy_(part)
    finally:
        for handle in handles.values():
            handle.close()


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

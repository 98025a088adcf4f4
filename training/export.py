"""The final model for /opt/ml/model: ``model.safetensors`` (full, unsharded fp32) and ``config.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def export_model(directory: Path, state_dict: Mapping[str, object], config: dict[str, Any]) -> Path:
    """Write the weights and their config; tensors sharing storage (tied embeddings) are stored once."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, int], str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"model state {name!r} is a {type(tensor).__name__}, not a tensor")
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.detach().to("cpu").contiguous()
    tmp = directory / (MODEL_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, directory / MODEL_FILE)
    _atomic_write_json(directory / CONFIG_FILE, {**config, "tied_weights": aliases})
    return directory / MODEL_FILE

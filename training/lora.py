"""LoRA adapters (Hu et al. 2021) on the built-in models, saved in the layout `peft` loads.

A target linear layer keeps its weight W frozen and adds scale · B·A·x, A (rank x in) and B (out x rank) being
the only weights trained (A as peft initialises it, B zero, so training starts from the base model exactly);
scale = alpha / rank. Targets are named as the model folder names its modules (peft's `target_modules`:
`q_proj`, `v_proj` for Llama; `c_attn` for GPT-2), matching a module whose name ends with one of them.

The adapter is written as peft writes one (`adapter_config.json`, `adapter_model.safetensors` with
`base_model.model.<module>.lora_A.weight` / `lora_B.weight`); the fine-tuned model folder holds the merged
weights W + scale · B·A, which need no peft to load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from contract import model_folder as mf
from contract.config import LoraConfig
from contract.model_args import ModelArgs

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


class LoRALinear(nn.Linear):
    """nn.Linear with a frozen weight and a trained low-rank update; its weight keeps the name it had."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device=base.weight.device)
        self.weight, self.bias = base.weight, base.bias
        for param in (self.weight, self.bias):
            if param is not None:
                param.requires_grad_(False)
        device = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=device))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        self.scale = alpha / rank
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_a), self.lora_b)
        return F.linear(x, self.weight, self.bias) + self.scale * update


def apply(model: nn.Module, cfg: LoraConfig, args: ModelArgs) -> dict[str, LoRALinear]:
    """Put adapters on the targeted layers and freeze every other weight; returns the adapted layers by name."""
    chosen = mf.lora_targets(args, cfg.target_modules)
    for param in model.parameters():
        param.requires_grad_(False)
    layers = {}
    for name in chosen:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent)
        layers[name] = LoRALinear(getattr(owner, attr), rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout)
        setattr(owner, attr, layers[name])
    return layers


@torch.no_grad()
def initialise(layers: Mapping[str, LoRALinear], seed: int) -> None:
    """A as peft draws it (Kaiming-uniform, a=√5), B zero: the same full values on every rank, whatever its shard."""
    from training.hf_weights import local_part  # noqa: PLC0415

    generator = torch.Generator().manual_seed(seed)
    for layer in layers.values():
        for param, init in ((layer.lora_a, True), (layer.lora_b, False)):
            full = torch.zeros(param.shape)
            if init:
                bound = 1 / math.sqrt(param.shape[1])  # kaiming_uniform_(a=√5) on (rank, in)
                full.uniform_(-bound, bound, generator=generator)
            local, shape, offset = local_part(param)
            window = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
            local.copy_(full[window].to(local.dtype))


def merged(full: Mapping[str, Any], chosen: Iterable[str], cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """The full state with every adapter folded into its weight, the adapters' own entries left out."""
    out = {name: t for name, t in full.items() if not name.endswith((".lora_a", ".lora_b"))}
    scale = cfg.alpha / cfg.rank
    for name in chosen:
        a, b = full[f"{name}.lora_a"].float(), full[f"{name}.lora_b"].float()
        weight = out[f"{name}.weight"]
        out[f"{name}.weight"] = (weight.float() + scale * b @ a).to(weight.dtype)
    return out


def write_adapter(
    directory: Path,
    full: Mapping[str, torch.Tensor],
    chosen: Mapping[str, str],
    cfg: LoraConfig,
    args: ModelArgs,
    *,
    base_model: str,
) -> Path:
    """The adapter in peft's layout at `directory` (written beside it, then renamed into place)."""
    from training.hf_weights import commit_folder  # noqa: PLC0415

    staging = directory.with_name(directory.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for ours, hf in chosen.items():
        tensors[f"base_model.model.{hf}.lora_A.weight"] = full[f"{ours}.lora_a"].detach().cpu().float().contiguous()
        tensors[f"base_model.model.{hf}.lora_B.weight"] = full[f"{ours}.lora_b"].detach().cpu().float().contiguous()
    save_file(tensors, str(staging / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted({hf.rsplit(".", 1)[-1] for hf in chosen.values()}),
        "bias": "none",
        "fan_in_fan_out": args.arch == "gpt2",  # GPT-2's Conv1D keeps its weight as (in, out)
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "modules_to_save": None,
    }
    (staging / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    commit_folder(staging, directory)
    return directory

"""AdamW with decoupled weight decay on matrices only, and a linear-warmup cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from contract.config import OptimConfig


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases) do not, as in GPT-2/nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=cfg.fused or None)


def lr_factor(step_index: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for the optimizer step with 0-based index ``step_index``; the cosine
    reaches ``min_lr_ratio`` at ``max_steps`` (the decay horizon) and stays there."""
    if step_index < warmup_steps:
        return (step_index + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step_index - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> LambdaLR:
    horizon = cfg.decay_steps or max_steps

    def factor(step_index: int) -> float:
        return lr_factor(step_index, warmup_steps=cfg.warmup_steps, max_steps=horizon, min_lr_ratio=cfg.min_lr_ratio)

    return LambdaLR(optimizer, factor)

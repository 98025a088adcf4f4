"""Build a model from the config: a preset, optionally resized, or a user factory (``model.factory``).

A custom factory is ``def build(args: ModelArgs) -> nn.Module`` whose module maps token ids
``(B, T) int64`` to logits ``(B, T, vocab)``. Optional: ``layers`` (an ``nn.ModuleList`` of blocks,
the unit of FSDP sharding, activation checkpointing and compilation; without it the whole model is
one unit) and ``flops_per_token(seq_len) -> float`` for MFU (default 6·N).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from contract.config import ConfigError, ModelConfig, model_args
from contract.model_args import ModelArgs
from training.flops import flops_per_token
from training.models.gpt2 import GPT2
from training.models.llama import Llama

ModelFactory = Callable[[ModelArgs], nn.Module]
ARCHS: dict[str, type[GPT2] | type[Llama]] = {"gpt2": GPT2, "llama": Llama}
"""The built-in models: each is a `ModelFactory`, and takes `init=False` for weights read afterwards."""


def load_factory(spec: str, search_path: Path | None = None) -> ModelFactory:
    """Import ``package.module:function``; ``search_path`` (the ``code`` channel) is tried too."""
    module_name, _, attr = spec.partition(":")
    if search_path is not None and search_path.is_dir() and str(search_path) not in sys.path:
        sys.path.append(str(search_path))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"hyperparameter model.factory={spec!r} is invalid: cannot import {module_name!r} ({exc}); "
            "install it in the image or put it in a 'code' input channel"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"hyperparameter model.factory={spec!r} is invalid: {module_name} has no {attr}()")
    return factory  # type: ignore[no-any-return]


def model_builder(cfg: ModelConfig, code_dir: Path | None = None) -> tuple[Callable[[], nn.Module], ModelArgs]:
    """What builds the model (on the current default device, in fp32, from the current RNG state) and its
    arguments; the factory is imported now, so that a bad one fails before anything is built."""
    args = model_args(cfg)
    factory = load_factory(cfg.factory, code_dir) if cfg.factory else ARCHS[args.arch]
    return functools.partial(factory, args), args


def build_model(cfg: ModelConfig, device: torch.device, code_dir: Path | None = None) -> tuple[nn.Module, ModelArgs]:
    """The model on ``device`` in fp32, initialised from the current RNG state (seed it first)."""
    build, args = model_builder(cfg, code_dir)
    with device:
        return build(), args


def matmul_params(model: nn.Module) -> int:
    """Parameters that take part in a matmul: all but embedding tables used only for lookups."""
    params = {id(p): p.numel() for p in model.parameters()}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and id(m.weight) not in linear}
    return sum(n for key, n in params.items() if key not in lookups)


def model_flops_per_token(model: nn.Module, args: ModelArgs, seq_len: int, custom: bool) -> float:
    """Training FLOPs per token (see training.flops); custom models may define ``flops_per_token``."""
    if custom:
        hook = getattr(model, "flops_per_token", None)
        return float(hook(seq_len)) if callable(hook) else 6.0 * matmul_params(model)
    return flops_per_token(
        matmul_params=matmul_params(model),
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        head_dim=args.head_dim,
        seq_len=seq_len,
    )

"""Architecture arguments and the built-in presets (torch-free so the config can validate names)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Arch = Literal["gpt2", "llama"]
Gelu = Literal["tanh", "exact"]


@dataclass(frozen=True)
class ModelArgs:
    """Everything a built-in model needs to be constructed; also written to the exported config.json."""

    arch: Arch
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    n_kv_heads: int = 0  # 0: same as n_heads (no grouped-query attention)
    ffn_dim: int = 0  # 0: 4*dim for gpt2, the Llama rule (8/3*dim rounded up to 256) for llama
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    bias: bool = True  # gpt2: biases in linear layers and LayerNorms
    gelu: Gelu = "tanh"  # gpt2: the MLP's activation, GELU tanh-approximated or exact

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_dim:
            return self.ffn_dim
        if self.arch == "gpt2":
            return 4 * self.dim
        return 256 * ((int(8 * self.dim / 3) + 255) // 256)

    def validate(self) -> None:
        """Raise ValueError naming the field when the shape cannot be built."""
        if self.dim % self.n_heads:
            raise ValueError(f"model dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2 and self.arch == "llama":
            raise ValueError(f"llama head_dim={self.head_dim} must be even for rotary embeddings")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}")
        if min(self.vocab_size, self.dim, self.n_layers, self.n_heads, self.max_seq_len) <= 0:
            raise ValueError(f"model sizes must be positive, got {self}")

    def replace(self, **changes: object) -> ModelArgs:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_LLAMA_3_1_8B = ModelArgs(
    arch="llama",
    vocab_size=128256,
    dim=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    ffn_dim=14336,
    max_seq_len=8192,
    rope_theta=500000.0,
    tie_embeddings=False,
)
"""Llama 3.1 8B's shape; the other Llama 3 presets are it with other sizes (grouped-query attention with 8 KV heads,
RoPE base 500,000)."""

# GPT-2 sizes follow the paper and nanoGPT (vocab padded from 50257 to 50304 for matmul efficiency).
# llama-1b is the Llama-3.2-1B shape with the GPT-2 vocabulary this package's tokenizers produce.
# llama-3.1-8b and llama-3.1-70b are those models' shapes (their config.json on the Hugging Face Hub) with their
# vocabulary of 128256 (llm.c's Llama-3 shards, uint32), trained from scratch at Llama 3's pretraining context of
# 8192: the rope scaling Llama 3.1 uses for 128K contexts is not implemented here.
# The tiny presets are for tests and laptops: 320 covers the byte tokenizer's 257 ids.
PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(arch="gpt2", vocab_size=320, dim=64, n_layers=2, n_heads=4, max_seq_len=256),
    "llama-tiny": ModelArgs(
        arch="llama",
        vocab_size=320,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=256,
        tie_embeddings=False,
    ),
    "gpt2": ModelArgs(arch="gpt2", vocab_size=50304, dim=768, n_layers=12, n_heads=12, max_seq_len=1024),
    "gpt2-medium": ModelArgs(arch="gpt2", vocab_size=50304, dim=1024, n_layers=24, n_heads=16, max_seq_len=1024),
    "gpt2-large": ModelArgs(arch="gpt2", vocab_size=50304, dim=1280, n_layers=36, n_heads=20, max_seq_len=1024),
    "gpt2-xl": ModelArgs(arch="gpt2", vocab_size=50304, dim=1600, n_layers=48, n_heads=25, max_seq_len=1024),
    "llama-1b": _LLAMA_3_1_8B.replace(
        vocab_size=50304, dim=2048, n_layers=16, ffn_dim=8192, max_seq_len=2048, tie_embeddings=True
    ),
    "llama-3.1-8b": _LLAMA_3_1_8B,
    "llama-3.1-70b": _LLAMA_3_1_8B.replace(dim=8192, n_layers=80, n_heads=64, ffn_dim=28672),
}

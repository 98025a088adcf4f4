"""A Llama-style decoder (Touvron et al. 2023): RMSNorm, rotary positions, SwiGLU, grouped-query attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from contract.model_args import ModelArgs
from training.models.documents import document_mask, document_positions


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_seq_len, head_dim // 2) for rotary embeddings."""
    freqs_D = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles_TD = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs_D)
    return angles_TD.cos(), angles_TD.sin()


def apply_rope(x_BHTD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    """Rotate each (first half, second half) pair of ``x``'s last dim by its position's angle; the tables hold
    the angles of ``x``'s positions, (T, D/2) or per row (B, 1, T, D/2)."""
    cos, sin = cos_TD.to(x_BHTD.dtype), sin_TD.to(x_BHTD.dtype)
    x1, x2 = x_BHTD.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.dropout = args.dropout
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(
        self, x_BTC: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor, mask_B1TT: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, _ = x_BTC.shape
        cos_TD, sin_TD = cos_TD[..., :T, :], sin_TD[..., :T, :]
        q_BHTD = self.wq(x_BTC).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k_BKTD = self.wk(x_BTC).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BKTD = self.wv(x_BTC).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q_BHTD, k_BKTD = apply_rope(q_BHTD, cos_TD, sin_TD), apply_rope(k_BKTD, cos_TD, sin_TD)
        # Grouped-query attention: each KV head serves n_heads // n_kv_heads query heads.
        repeat = self.n_heads // self.n_kv_heads
        k_BHTD = k_BKTD.repeat_interleave(repeat, dim=1)
        v_BHTD = v_BKTD.repeat_interleave(repeat, dim=1)
        y_BHTD = F.scaled_dot_product_attention(
            q_BHTD,
            k_BHTD,
            v_BHTD,
            attn_mask=mask_B1TT,
            is_causal=mask_B1TT is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        out: torch.Tensor = self.wo(y_BHTD.transpose(1, 2).reshape(B, T, -1))
        return out


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.hidden_dim, bias=False)

    def forward(self, x_BTC: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x_BTC)) * self.w3(x_BTC))
        return out


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args)
        self.dropout = nn.Dropout(args.dropout)

    def forward(
        self, x_BTC: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor, mask_B1TT: torch.Tensor | None = None
    ) -> torch.Tensor:
        x_BTC = x_BTC + self.dropout(self.attention(self.attention_norm(x_BTC), cos_TD, sin_TD, mask_B1TT))
        out: torch.Tensor = x_BTC + self.dropout(self.feed_forward(self.ffn_norm(x_BTC)))
        return out


class Llama(nn.Module):
    """``forward(idx_BT, doc_BT=None) -> logits_BTV``; ``doc_BT`` (packed documents' ids, see
    training/models/documents.py) restarts positions per document and makes attention block-diagonal. Blocks
    live in ``layers`` for per-block FSDP and checkpointing."""

    def __init__(self, args: ModelArgs, *, init: bool = True) -> None:
        """`init=False`: the weights are left as made (on the meta device: nothing), for a model whose every weight is
        read afterwards (training/finetune.py)."""
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Derived from the config, so not saved in checkpoints (persistent=False).
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if init:
            self.init_weights()

    def init_weights(self) -> None:
        """N(0, 0.02) everywhere, output projections of each block scaled by 1/sqrt(2·layers)."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                scaled = name.endswith(("wo", "w2"))
                std = 0.02 / math.sqrt(2 * self.args.n_layers) if scaled else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx_BT: torch.Tensor, doc_BT: torch.Tensor | None = None) -> torch.Tensor:
        x_BTC = self.tok_embeddings(idx_BT)
        mask_B1TT = None
        if doc_BT is None:
            # Whole tables, cut to the sequence in the attention: under sequence parallelism a block's input (a
            # later pipeline stage's, too) holds only part of the sequence, the attention's all of it.
            cos_TD, sin_TD = self.rope_cos, self.rope_sin
        else:
            pos_BT = document_positions(doc_BT)
            cos_TD = self.rope_cos[pos_BT].unsqueeze(1)  # type: ignore[index]
            sin_TD = self.rope_sin[pos_BT].unsqueeze(1)  # type: ignore[index]
            mask_B1TT = document_mask(doc_BT)
        for layer in self.layers:
            x_BTC = layer(x_BTC, cos_TD, sin_TD, mask_B1TT)
        logits_BTV: torch.Tensor = self.output(self.norm(x_BTC))
        return logits_BTV

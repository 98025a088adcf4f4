"""GPT-2 (Radford et al. 2019) in nanoGPT's shape: learned positions, pre-LayerNorm, GELU MLP, tied head."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from contract.model_args import ModelArgs
from training.models.documents import document_mask, document_positions


class CausalSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.dropout = args.dropout
        self.c_attn = nn.Linear(args.dim, 3 * args.dim, bias=args.bias)
        self.c_proj = nn.Linear(args.dim, args.dim, bias=args.bias)
        self.resid_dropout = nn.Dropout(args.dropout)

    def forward(self, x_BTC: torch.Tensor, mask_B1TT: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x_BTC.shape
        q, k, v = self.c_attn(x_BTC).split(C, dim=2)
        q_BHTD, k_BHTD, v_BHTD = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y_BHTD = F.scaled_dot_product_attention(
            q_BHTD,
            k_BHTD,
            v_BHTD,
            attn_mask=mask_B1TT,
            is_causal=mask_B1TT is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y_BTC = y_BHTD.transpose(1, 2).contiguous().view(B, T, C)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y_BTC))
        return out


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.c_fc = nn.Linear(args.dim, args.hidden_dim, bias=args.bias)
        self.c_proj = nn.Linear(args.hidden_dim, args.dim, bias=args.bias)
        self.dropout = nn.Dropout(args.dropout)
        self.approximate = "tanh" if args.gelu == "tanh" else "none"

    def forward(self, x_BTC: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(self.c_proj(F.gelu(self.c_fc(x_BTC), approximate=self.approximate)))
        return out


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.dim, eps=args.norm_eps, bias=args.bias)
        self.attn = CausalSelfAttention(args)
        self.ln_2 = nn.LayerNorm(args.dim, eps=args.norm_eps, bias=args.bias)
        self.mlp = MLP(args)

    def forward(self, x_BTC: torch.Tensor, mask_B1TT: torch.Tensor | None = None) -> torch.Tensor:
        x_BTC = x_BTC + self.attn(self.ln_1(x_BTC), mask_B1TT)
        out: torch.Tensor = x_BTC + self.mlp(self.ln_2(x_BTC))
        return out


class GPT2(nn.Module):
    """``forward(idx_BT, doc_BT=None) -> logits_BTV``; ``doc_BT`` (packed documents' ids, see
    training/models/documents.py) makes attention block-diagonal. Blocks live in ``layers`` for per-block FSDP
    and checkpointing."""

    def __init__(self, args: ModelArgs, *, init: bool = True) -> None:
        """`init=False`: the weights are left as made (on the meta device: nothing), for a model whose every weight is
        read afterwards (training/finetune.py)."""
        super().__init__()
        self.args = args
        self.wte = nn.Embedding(args.vocab_size, args.dim)
        self.wpe = nn.Embedding(args.max_seq_len, args.dim)
        self.drop = nn.Dropout(args.dropout)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.ln_f = nn.LayerNorm(args.dim, eps=args.norm_eps, bias=args.bias)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if init:
            self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers)."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * self.args.n_layers) if name.endswith("c_proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx_BT: torch.Tensor, doc_BT: torch.Tensor | None = None) -> torch.Tensor:
        T = idx_BT.shape[1]
        pos = torch.arange(T, device=idx_BT.device) if doc_BT is None else document_positions(doc_BT)
        mask_B1TT = None if doc_BT is None else document_mask(doc_BT)
        x_BTC = self.drop(self.wte(idx_BT) + self.wpe(pos))
        for layer in self.layers:
            x_BTC = layer(x_BTC, mask_B1TT)
        logits_BTV: torch.Tensor = self.lm_head(self.ln_f(x_BTC))
        return logits_BTV

"""Packed sequences: several documents in one row, each attending only to itself.

A row's document ids (``doc_BT``: equal ids, consecutive, mark one document) give each token its position in
its own document, and the attention mask that is causal within a document and closed across documents
(block-diagonal causal), for ``F.scaled_dot_product_attention``'s boolean ``attn_mask`` (True: may attend).
"""

from __future__ import annotations

import torch


def document_positions(doc_BT: torch.Tensor) -> torch.Tensor:
    """Each token's position in its document: 0 where a document starts, counting up to its end."""
    T = doc_BT.shape[1]
    index_BT = torch.arange(T, device=doc_BT.device).expand_as(doc_BT)
    starts_BT = torch.ones_like(doc_BT, dtype=torch.bool)
    starts_BT[:, 1:] = doc_BT[:, 1:] != doc_BT[:, :-1]
    first_BT = torch.where(starts_BT, index_BT, torch.zeros_like(index_BT)).cummax(dim=1).values
    return index_BT - first_BT


def document_mask(doc_BT: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) True where query t may attend key s: s <= t and both in one document."""
    T = doc_BT.shape[1]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=doc_BT.device).tril()
    same_BTT = doc_BT[:, :, None] == doc_BT[:, None, :]
    return (same_BTT & causal_TT).unsqueeze(1)

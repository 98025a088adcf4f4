"""Model FLOPs per token and MFU (model FLOPs utilisation), torch-free.

FLOPs per token of a training step (forward + backward), the PaLM paper's (appendix B) convention:

    6·N + 12·L·H·Q·T

N counts the weights that take part in a matmul (every parameter except embedding tables used
only as lookups; a tied input/output embedding counts once, as the output projection), L layers,
H attention heads, Q head dimension, T sequence length. The attention term counts the full T×T
score matrix although causal attention needs half of it, as PaLM and nanoGPT do.

MFU = tokens/s (all processes) · FLOPs per token / (peak FLOP/s per device · devices).
"""

from __future__ import annotations

# Dense bf16 tensor-core peaks from NVIDIA's datasheets, matched as substrings of the CUDA device
# name in this order (more specific names first). The MFU of an fp32 run is still against bf16 peak.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM, e.g. "NVIDIA H100 80GB HBM3" on p5
    ("H200", 989e12),  # also matches GH200
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def peak_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name, or None when it is not in the table."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


def flops_per_token(*, matmul_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N + 12·L·H·Q·T."""
    return 6.0 * matmul_params + 12.0 * n_layers * n_heads * head_dim * seq_len


def mfu(*, tokens_per_sec: float, flops_per_token: float, peak_flops_per_device: float, devices: int) -> float:
    """Achieved model FLOP/s as a fraction of the devices' peak."""
    return tokens_per_sec * flops_per_token / (peak_flops_per_device * devices)

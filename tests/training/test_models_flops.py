"""Model presets (sizes), causality, the factory hook, FLOPs/MFU and the LR schedule."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from contract.config import ConfigError, ModelConfig, OptimConfig
from training.flops import flops_per_token, mfu, peak_flops
from training.models.build import build_model, load_factory, matmul_params, model_args
from training.optim import build_optimizer, build_scheduler, lr_factor

META = torch.device("meta")


@pytest.mark.parametrize(
    ("name", "params"),
    [  # GPT-2 sizes with the original 50257-token vocabulary, as reported by nanoGPT/HF
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_gpt2_presets_have_the_published_sizes(name: str, params: int) -> None:
    model, _ = build_model(ModelConfig(name=name, vocab_size=50257), META)
    assert sum(p.numel() for p in model.parameters()) == params


def test_llama_1b_is_about_a_billion_parameters() -> None:
    model, args = build_model(ModelConfig(name="llama-1b"), META)
    total = sum(p.numel() for p in model.parameters())
    assert 1.0e9 < total < 1.3e9
    assert (args.kv_heads, args.hidden_dim, args.head_dim) == (8, 8192, 64)


@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_models_are_causal_and_shaped_batch_time_vocab(name: str) -> None:
    torch.manual_seed(0)
    model, args = build_model(ModelConfig(name=name), torch.device("cpu"))
    idx = torch.randint(0, args.vocab_size, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, args.vocab_size)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % args.vocab_size
    assert torch.equal(model(changed)[:, :10], logits[:, :10])
    assert not torch.equal(model(changed)[:, 10:], logits[:, 10:])


def test_overrides_resize_a_preset_and_bad_shapes_are_config_errors() -> None:
    args = model_args(ModelConfig(name="tiny", dim=96, n_heads=3, n_layers=1, vocab_size=1000))
    assert (args.dim, args.n_heads, args.n_layers, args.vocab_size, args.arch) == (96, 3, 1, 1000, "gpt2")
    with pytest.raises(ConfigError, match=r"dim=64 is not divisible by n_heads=5"):
        model_args(ModelConfig(name="tiny", n_heads=5))


def test_factory_hook_loads_a_module_from_the_code_channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_factory adds the code channel to the process's path
    (tmp_path / "my_lm.py").write_text(
        "import torch\n"
        "def build(args):\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(args.vocab_size, 8), torch.nn.Linear(8, args.vocab_size))\n"
    )
    model, args = build_model(ModelConfig(name="tiny", factory="my_lm:build"), torch.device("cpu"), tmp_path)
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, args.vocab_size)
    with pytest.raises(ConfigError, match=r"model\.factory='no_such_module:build' .*cannot import"):
        load_factory("no_such_module:build", tmp_path)
    with pytest.raises(ConfigError, match=r"my_lm has no missing\(\)"):
        load_factory("my_lm:missing", tmp_path)


def test_flops_count_matmul_weights_and_attention() -> None:
    model, _ = build_model(ModelConfig(name="gpt2", vocab_size=50257), META)
    n = matmul_params(model)
    # Positions are a lookup; the tied token embedding counts once, as the output projection.
    assert n == 124_439_808 - 1024 * 768
    expected = 6 * n + 12 * 12 * 12 * 64 * 1024
    assert flops_per_token(matmul_params=n, n_layers=12, n_heads=12, head_dim=64, seq_len=1024) == expected
    untied, _ = build_model(ModelConfig(name="llama-tiny"), META)
    assert matmul_params(untied) == sum(p.numel() for p in untied.parameters()) - 320 * 64


def test_peak_table_and_mfu() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA L40S") == 362e12
    assert peak_flops("cpu") is None
    assert mfu(tokens_per_sec=1e6, flops_per_token=989e6, peak_flops_per_device=989e12, devices=2) == 0.5


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine() -> None:
    kw = {"warmup_steps": 10, "max_steps": 110, "min_lr_ratio": 0.1}
    assert [lr_factor(i, **kw) for i in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert lr_factor(10, **kw) == 1.0
    assert math.isclose(lr_factor(60, **kw), 0.55)
    assert math.isclose(lr_factor(110, **kw), 0.1)
    assert lr_factor(500, **kw) == pytest.approx(0.1)
    assert lr_factor(0, warmup_steps=0, max_steps=10, min_lr_ratio=0.0) == 1.0


def test_the_decay_horizon_ends_the_cosine_early_and_holds_the_minimum() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=0.5, warmup_steps=10, decay_steps=60, min_lr_ratio=0.1), 200)
    lrs = []
    for _ in range(100):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[9] == pytest.approx(1.0) and lrs[35] == pytest.approx(0.55)
    assert lrs[60:] == pytest.approx([0.1] * 40)


def test_gpt2_without_biases_and_with_exact_gelu() -> None:
    base = build_model(ModelConfig(name="tiny"), torch.device("cpu"))[0]
    bare, args = build_model(ModelConfig(name="tiny", bias=False, gelu="exact"), torch.device("cpu"))
    assert (args.bias, args.gelu) == (False, "exact")
    assert not [name for name, _ in bare.named_parameters() if name.endswith("bias")]
    assert [name for name, _ in base.named_parameters() if name.endswith("bias")]
    # 2 layers x (attention 2 + MLP 2 linear biases + 2 LayerNorm biases) + the final LayerNorm's bias.
    assert (
        sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in bare.parameters())
        == 2 * (3 * 64 + 64 + 4 * 64 + 64 + 2 * 64) + 64
    )
    mlp = bare.layers[0].mlp
    x = torch.linspace(-3, 3, 64).repeat(1, 2, 1)
    assert torch.allclose(mlp(x), mlp.c_proj(torch.nn.functional.gelu(mlp.c_fc(x))))
    assert not torch.allclose(mlp(x), mlp.c_proj(torch.nn.functional.gelu(mlp.c_fc(x), approximate="tanh")))


def test_weight_decay_applies_to_matrices_only() -> None:
    model, _ = build_model(ModelConfig(name="tiny"), torch.device("cpu"))
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.1))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])

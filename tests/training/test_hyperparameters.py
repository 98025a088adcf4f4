"""Hyperparameters -> nested config: coercion, aliases, validation messages, the accepted-name list."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from training_helpers import REPO

from contract.config import (
    ALIASES,
    HYPERPARAMETERS,
    ConfigError,
    JobConfig,
    TrainConfig,
    from_hyperparameters,
    hyperparameter_names,
    hyperparameters_markdown,
    parse_overrides,
)


def test_empty_hyperparameters_give_the_defaults() -> None:
    assert from_hyperparameters({}) == JobConfig()


def test_string_values_from_sagemaker_are_coerced_to_field_types() -> None:
    cfg = from_hyperparameters(
        {
            "train.max_steps": "1e3",
            "optim.lr": "0.0003",
            "parallel.compile": "True",
            "checkpoint.async_save": "0",
            "distribution": '"fsdp"',  # the SageMaker SDK JSON-encodes strings
            "model.name": "gpt2",
            "checkpoint.interval_minutes": "7",
        }
    )
    assert cfg.train.max_steps == 1000
    assert cfg.optim.lr == 3e-4
    assert cfg.parallel.compile is True
    assert cfg.checkpoint.async_save is False
    assert cfg.distribution == "fsdp"
    assert cfg.model.name == "gpt2"
    assert cfg.checkpoint.interval_minutes == 7.0


def test_native_json_values_are_accepted() -> None:
    cfg = from_hyperparameters({"max_steps": 20, "lr": 1e-3, "train.deterministic": True, "optim.warmup_steps": 2})
    assert (cfg.train.max_steps, cfg.optim.lr, cfg.train.deterministic) == (20, 1e-3, True)


def test_aliases_land_on_their_targets() -> None:
    cfg = from_hyperparameters(
        {"model": "llama-1b", "max_steps": "500", "lr": "0.01", "seed": "7", "seq_len": "128", "batch_size": "2"}
    )
    assert cfg.model.name == "llama-1b"
    assert (cfg.train.max_steps, cfg.train.seed, cfg.train.micro_batch_size) == (500, 7, 2)
    assert (cfg.optim.lr, cfg.data.seq_len) == (0.01, 128)


def test_alias_and_target_together_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"optim\.lr is given twice .*'lr'.*'optim\.lr'"):
        from_hyperparameters({"lr": "0.1", "optim.lr": "0.2"})


def test_unknown_key_suggests_the_closest_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown hyperparameter 'optim\.learning_rat'.*did you mean"):
        from_hyperparameters({"optim.learning_rat": "1"})
    with pytest.raises(ConfigError, match=r"unknown hyperparameter 'optim\.lrr'.*did you mean 'optim\.lr'"):
        from_hyperparameters({"optim.lrr": "1"})


def test_every_problem_is_named_at_once_each_under_the_key_given() -> None:
    """Unknown keys, values of the wrong type and each field's rules: one ConfigError, one problem each."""
    with pytest.raises(ConfigError) as raised:
        from_hyperparameters({"batchsize": "8", "max_step": "10", "lr": "-1", "seq_len": "abc", "model": "gpt5"})
    problems = {p.key: p.message for p in raised.value.problems}
    assert set(problems) == {"batchsize", "max_step", "lr", "seq_len", "model"}
    assert "did you mean 'batch_size'?" in problems["batchsize"]
    assert "did you mean 'max_steps'?" in problems["max_step"]
    assert "optim.lr=-1.0 is invalid: use a value in (0, 1)" in problems["lr"]
    assert "seq_len='abc' is invalid: use an integer" in problems["seq_len"]
    assert "model='gpt5' is invalid: choose one of" in problems["model"]
    assert all(message in str(raised.value) for message in problems.values())


def test_a_rule_that_reads_a_refused_field_is_not_judged_on_it() -> None:
    """A refused micro-batch size or model leaves the rules that read it unsaid (no division by zero, no lookup)."""
    with pytest.raises(ConfigError) as raised:
        from_hyperparameters({"batch_size": "0", "train.global_batch_size": "12", "model": "gpt5", "seq_len": "9000"})
    assert [p.key for p in raised.value.problems] == ["model", "batch_size"]


def test_sagemaker_sdk_keys_are_ignored() -> None:
    assert from_hyperparameters({"sagemaker_program": "x.py", "sagemaker_region": '"us-east-1"'}) == JobConfig()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.max_steps", "ten", r"train\.max_steps='ten' is invalid: use an integer"),
        ("train.max_steps", "2.5", r"train\.max_steps='2.5' is invalid: use an integer"),
        ("train.max_steps", "0", r"train\.max_steps=0 is invalid: use at least 1"),
        ("optim.lr", "nan", r"optim\.lr='nan' is invalid: use a number"),
        ("optim.lr", "2", r"optim\.lr=2.0 is invalid: use a value in \(0, 1\)"),
        ("parallel.compile", "maybe", r"parallel\.compile='maybe' is invalid: use true or false"),
        ("distribution", "fdsp", r"distribution='fdsp' is invalid: choose one of ddp, fsdp, smddp, mpi.*'fsdp'"),
        ("model.name", "gpt3", r"model\.name='gpt3' is invalid: choose one of tiny, "),
        ("model.factory", "mymodule", r"model\.factory='mymodule' is invalid: write it as 'package\.module:function'"),
        ("checkpoint.keep_last", "0", r"checkpoint\.keep_last=0 is invalid: keep at least 1"),
        ("train.dtype", "fp16", r"train\.dtype='fp16' is invalid: choose one of auto, bf16, fp32"),
        ("model.gelu", "erf", r"model\.gelu='erf' is invalid: choose one of tanh, exact"),
        ("model.bias", "none", r"model\.bias='none' is invalid: use true or false"),
        ("eval.max_batches", "-1", r"eval\.max_batches=-1 is invalid: use >= 0"),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_hyperparameters({key: value})


def test_cross_field_checks_say_how_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"optim\.warmup_steps=50 is invalid: use at most train\.max_steps=10"):
        from_hyperparameters({"max_steps": "10", "optim.warmup_steps": "50"})
    with pytest.raises(ConfigError, match=r"data\.seq_len=512 .*max_seq_len=256 \(or raise model\.max_seq_len\)"):
        from_hyperparameters({"model": "tiny", "seq_len": "512"})
    assert from_hyperparameters({"model": "tiny", "seq_len": "512", "model.max_seq_len": "512"}).seq_len == 512


def test_gpt2_only_options_and_the_decay_horizon_are_checked_against_their_context() -> None:
    for key, value in (("model.bias", "false"), ("model.gelu", "exact")):
        with pytest.raises(
            ConfigError, match=rf"model\.{key[6:]}=.* applies to the gpt2 architecture; preset 'llama-1b'"
        ):
            from_hyperparameters({"model": "llama-1b", key: value})
        # A custom factory receives the options in its ModelArgs, whatever the preset's architecture.
        from_hyperparameters({"model": "llama-1b", "model.factory": "pkg.mod:build", key: value})
    with pytest.raises(
        ConfigError, match=r"optim\.decay_steps=50 is invalid: use 0 or at least optim\.warmup_steps=100"
    ):
        from_hyperparameters({"optim.decay_steps": "50"})
    assert from_hyperparameters({"optim.decay_steps": "100"}).optim.decay_steps == 100


def test_global_batch_must_divide_over_processes() -> None:
    train = TrainConfig(micro_batch_size=4, global_batch_size=16)
    assert [train.grad_accum_steps(w) for w in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(ConfigError, match=r"with 3 data-parallel processes x micro_batch_size 4 use a multiple of 12"):
        train.grad_accum_steps(3)
    assert TrainConfig(micro_batch_size=4).grad_accum_steps(8) == 1


def test_hyperparameter_names_cover_fields_distribution_and_aliases() -> None:
    names = hyperparameter_names()
    assert "distribution" in names
    assert {"optim.lr", "checkpoint.interval_steps", "train.max_steps", "model.name"} <= set(names)
    assert set(ALIASES) <= set(names)
    assert names == sorted(set(names))
    # Every listed name is accepted on its own.
    for name in names:
        if name in HYPERPARAMETERS and HYPERPARAMETERS[name].default not in ("", None):
            from_hyperparameters({name: str(HYPERPARAMETERS[name].default)})


def test_cli_overrides_parse_key_value_pairs() -> None:
    assert parse_overrides(["optim.lr=3e-4", "model=tiny", "model.factory=a.b:c"]) == {
        "optim.lr": "3e-4",
        "model": "tiny",
        "model.factory": "a.b:c",
    }
    with pytest.raises(ConfigError, match="write KEY=VALUE"):
        parse_overrides(["optim.lr"])


def test_hyperparameters_reference_page_documents_every_hyperparameter() -> None:
    page = (REPO / "docs" / "reference" / "hyperparameters.md").read_text()
    missing = [name for name in hyperparameter_names() if f"`{name}`" not in page]
    assert not missing, f"docs/reference/hyperparameters.md does not list {missing}"
    assert hyperparameters_markdown() in page, (
        "docs/reference/hyperparameters.md is stale: regenerate it with `make docs`"
    )


def test_torch_free_modules_do_not_import_torch() -> None:
    code = (
        "import sys, training, contract.config, contract.metrics, training.sagemaker_contract, training.launcher, "
        "training.flops, training.signals, training.prepare, training.preflight\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\n"
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_markdown_table_has_one_row_per_key() -> None:
    table = hyperparameters_markdown()
    rows = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
    assert sorted(rows) == hyperparameter_names()


def test_the_global_batch_is_fixed_when_set_else_grows_with_the_processes() -> None:
    # The one rule resume_from (contract/resume.py) and fallback clusters (Validate) are held to.
    assert [TrainConfig(micro_batch_size=4, global_batch_size=16).global_batch(w) for w in (1, 4)] == [16, 16]
    assert [TrainConfig(micro_batch_size=4).global_batch(w) for w in (1, 4)] == [4, 16]

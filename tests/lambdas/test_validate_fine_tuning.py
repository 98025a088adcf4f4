"""Validate on fine-tuning runs: the model folder, the records and the GPUs' memory judged before any job starts."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract import model_folder as mf
from contract.execution_state import TrainingRequest
from contract.model_args import ModelArgs
from lambdas.estimate.handler import estimate
from lambdas.shared.errors import InvalidRequest
from lambdas.validate.model_folder import S3Folder
from lambdas.validate.request import resolve
from tests.lambdas.test_handlers import LIMITS

BUCKET = LIMITS.datasets_bucket
MODEL = f"s3://{BUCKET}/models/small-llama/"
DATA = f"s3://{BUCKET}/chats/"
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def _header(tensors: dict[str, tuple[int, ...]]) -> tuple[bytes, int]:
    """A safetensors header (with its length prefix) for F32 tensors of these shapes, and the file's size."""
    entries, offset = {}, 0
    for name, shape in tensors.items():
        size = math.prod(shape) * 4
        entries[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(entries).encode()
    return len(raw).to_bytes(8, "little") + raw, 8 + len(raw) + offset


class Folder:
    """Files by name: JSON documents, and safetensors files of which only the header is held (their size is the
    header's)."""

    def __init__(self, files: dict[str, Any]) -> None:
        self.files = files

    def size(self, name: str) -> int | None:
        found = self.files.get(name)
        if found is None:
            return None
        return found[1] if isinstance(found, tuple) else len(self._bytes(name))

    def _bytes(self, name: str) -> bytes:
        found = self.files[name]
        if isinstance(found, tuple):
            return bytes(found[0])
        return found if isinstance(found, bytes) else json.dumps(found).encode()

    def read(self, name: str, offset: int, length: int) -> bytes:
        return self._bytes(name)[offset : offset + length]

    def names(self) -> list[str]:
        return sorted(self.files)


def _model_files(config: dict[str, Any] | None = None, *, vocab: int = 384) -> dict[str, Any]:
    config = config or LLAMA_CONFIG
    args = mf.model_args(config)
    return {
        mf.CONFIG_FILE: config,
        mf.SINGLE_WEIGHTS_FILE: _header({w.hf: w.shape for w in mf.weight_names(args)}),
        mf.TOKENIZER_FILE: {"model": {"vocab": {f"t{i}": i for i in range(vocab)}}, "added_tokens": []},
    }


def _chats(lines: list[str] | None = None) -> dict[str, Any]:
    records = lines or [
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}),
        json.dumps({"prompt": "why", "response": "because"}),
    ]
    return {"chat.jsonl": "\n".join(records).encode()}


def _input(**overrides: Any) -> dict[str, Any]:
    base = {
        "run_name": "tune-llama",
        "init_from": MODEL,
        "dataset": DATA,
        "instance_type": "ml.g5.2xlarge",
        "distribution": "fsdp",
        "max_runtime_hours": 1,
        "hyperparameters": {"seq_len": 128, "max_steps": 20, "optim.warmup_steps": 2},
    }
    return base | overrides


def _resolve(
    execution_input: dict[str, Any], model: dict[str, Any] | None = None, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    folders = {MODEL: Folder(_model_files() if model is None else model), DATA: Folder(data or _chats())}
    return resolve(execution_input, execution_name="e", limits=LIMITS, folder_at=lambda uri: folders[uri])


def _problems(execution_input: dict[str, Any], **folders: Any) -> str:
    with pytest.raises(InvalidRequest) as refused:
        _resolve(execution_input, **folders)
    return str(refused.value)


def test_a_fine_tuning_run_gets_its_model_folder_as_a_channel_and_the_trainer_its_name() -> None:
    request = _resolve(_input())
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["channels"]}
    assert channels[mf.BASE_MODEL_CHANNEL] == MODEL
    assert request["hyperparameters"]["model.init_from"] == mf.BASE_MODEL_CHANNEL
    args = mf.model_args(LLAMA_CONFIG)
    assert request["base_model"] == {
        "uri": MODEL,
        "s3_uri": MODEL,
        "architecture": "LlamaForCausalLM",
        "parameters": mf.parameter_count(args),
        "trained_parameters": mf.parameter_count(args),
        "shape": dataclasses.asdict(args),
    }


def test_an_unsupported_architecture_is_named_with_the_supported_ones() -> None:
    config = {**LLAMA_CONFIG, "architectures": ["MixtralForCausalLM"]}
    files = {**_model_files(), mf.CONFIG_FILE: config}
    message = _problems(_input(), model=files)
    assert "config.json's architectures ['MixtralForCausalLM'] is not supported" in message
    assert "LlamaForCausalLM, GPT2LMHeadModel" in message


def test_missing_and_inconsistent_shards_are_each_named() -> None:
    args = mf.model_args(LLAMA_CONFIG)
    weights = mf.weight_names(args)
    first = {w.hf: w.shape for w in weights[:5]}
    second = {w.hf: (3, 3) if w.hf.endswith("norm.weight") else w.shape for w in weights[5:]}
    weight_map = {**dict.fromkeys(first, "model-00001-of-00003.safetensors")}
    weight_map |= dict.fromkeys(second, "model-00002-of-00003.safetensors")
    weight_map["lm_head.weight"] = "model-00003-of-00003.safetensors"
    files = {
        **_model_files(),
        mf.INDEX_FILE: {"weight_map": weight_map},
        "model-00001-of-00003.safetensors": _header(first),
        "model-00002-of-00003.safetensors": _header(second),
    }
    del files[mf.SINGLE_WEIGHTS_FILE]
    message = _problems(_input(), model=files)
    assert (
        "model-00003-of-00003.safetensors is missing from the model folder (model.safetensors.index.json names it)"
        in message
    )
    assert (
        "weight model.layers.0.post_attention_layernorm.weight in model-00002-of-00003.safetensors has shape [3, 3];"
        " config.json's sizes make [64]" in message
    )
    raw, size = _header(first)
    files["model-00001-of-00003.safetensors"] = (raw, size - 4)
    assert "model-00001-of-00003.safetensors: " in _problems(_input(), model=files)


def test_a_tokenizer_larger_than_the_embedding_is_refused() -> None:
    message = _problems(_input(), model=_model_files(vocab=400))
    assert "tokenizer.json produces ids up to 399, but config.json's vocab_size=384" in message


def test_seq_len_over_the_models_limit_is_refused() -> None:
    message = _problems(_input(hyperparameters={"seq_len": 512, "max_steps": 20, "optim.warmup_steps": 2}))
    assert "512 tokens is over the model's limit of 256" in message


def test_records_that_do_not_parse_are_named_by_line_and_field() -> None:
    lines = [
        json.dumps({"prompt": "a", "response": "b"}),
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}),
        "{not json",
        json.dumps({"prompt": "only"}),
    ]
    message = _problems(_input(), data=_chats(lines))
    assert "chat.jsonl line 2: field 'messages[1].role' is 'robot'" in message
    assert "chat.jsonl line 3: not a JSON object" in message
    assert "chat.jsonl line 4: field 'response' is missing or not a string" in message


def test_records_without_a_model_folder_are_refused() -> None:
    execution_input = _input(model="tiny", hyperparameters={"max_steps": 20, "optim.warmup_steps": 2})
    del execution_input["init_from"]
    assert "holds fine-tuning records, which are tokenized with a model folder's tokenizer" in _problems(
        execution_input
    )


def _big_llama() -> dict[str, Any]:
    """An 8B-parameter Llama's config (Llama 3.1 8B's sizes)."""
    return {
        **LLAMA_CONFIG,
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
    }


def test_a_cluster_whose_gpus_cannot_hold_the_run_is_refused_and_the_estimate_shows_the_bound() -> None:
    big = _model_files(_big_llama(), vocab=128256)
    message = _problems(_input(), model=big)
    # 16 bytes a parameter of fp32 weights, gradients and AdamW's moments: 120 GiB on one 24 GB A10G.
    assert "fine-tuning 8.03B parameters: the memory plan holds 130.2 GiB on a process (one process: parameters " in (
        message
    )
    assert "over the 21.6 GiB a process may use on ml.g5.2xlarge's 24 GiB A10G" in message
    assert message.endswith(
        "the cheapest layout that fits on instance_count=8: parallel.activation_checkpointing=true (20.0 GiB a process)"
    )
    # Sharded over 8 x 80 GB with LoRA, it fits: Estimate shows the bound.
    lora = {"seq_len": 128, "max_steps": 20, "optim.warmup_steps": 2, "lora.rank": 16}
    request = _resolve(_input(instance_type="ml.p5.48xlarge", hyperparameters=lora), model=big)
    assert 0 < request["base_model"]["trained_parameters"] < request["base_model"]["parameters"] / 100
    cost = estimate(
        TrainingRequest.parse(request),
        threshold_usd=100,
        spot_fraction=(0.3, 0.5),
        price_overrides={},
    )
    # 8B x 4 bytes of weights / 8 GPUs; the adapters' gradients and states next to nothing.
    assert cost.gpu_memory is not None
    assert cost.gpu_memory.startswith("14.3 GiB on a process (dp_shard=8: parameters 3.7 GiB, gradients 0.0 GiB")
    # DDP keeps every state on every GPU: 16 bytes a parameter, 128 GB, on 80 GB GPUs.
    full = {"seq_len": 128, "max_steps": 20, "optim.warmup_steps": 2}
    replicated = _problems(_input(instance_type="ml.p5.48xlarge", distribution="ddp", hyperparameters=full), model=big)
    assert "(dp_replicate=8: parameters 29.9 GiB, gradients 29.9 GiB, optimizer states 59.8 GiB" in replicated
    assert replicated.endswith("the cheapest layout that fits: distribution=fsdp (25.5 GiB a process)")


@pytest.fixture
def bucket() -> Iterator[Any]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3


def test_validate_reads_the_folder_from_s3_with_ranged_reads(bucket: Any, tmp_path: Path) -> None:
    from tests.training.hf_fixtures import llama_folder

    folder = llama_folder(tmp_path / "model")
    for path in folder.iterdir():
        bucket.upload_file(str(path), BUCKET, f"models/small-llama/{path.name}")
    for name, body in _chats().items():
        bucket.put_object(Bucket=BUCKET, Key=f"chats/{name}", Body=body)
    request = resolve(_input(), execution_name="e", limits=LIMITS, folder_at=lambda uri: S3Folder(bucket, uri))
    assert request["base_model"]["architecture"] == "LlamaForCausalLM"
    bucket.delete_object(Bucket=BUCKET, Key="models/small-llama/model.safetensors")
    with pytest.raises(InvalidRequest, match=r"model\.safetensors is missing from the model folder"):
        resolve(_input(), execution_name="e", limits=LIMITS, folder_at=lambda uri: S3Folder(bucket, uri))


def test_model_and_init_from_together_are_refused() -> None:
    assert "init_from's config.json sets the architecture and sizes; drop model" in _problems(_input(model="tiny"))


def test_the_args_of_the_contract_are_the_trainers() -> None:
    assert mf.model_args(LLAMA_CONFIG) == ModelArgs(
        arch="llama",
        vocab_size=384,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=160,
        max_seq_len=256,
        norm_eps=1e-5,
        tie_embeddings=False,
        bias=False,
    )


def test_a_fallback_cluster_whose_gpus_cannot_hold_the_fine_tuning_run_is_refused_by_its_index() -> None:
    # 8B parameters with LoRA fit 8 x 80 GB (the estimate above); one 24 GB A10G cannot hold their fp32 weights.
    big = _model_files(_big_llama(), vocab=128256)
    lora = {"seq_len": 128, "max_steps": 20, "optim.warmup_steps": 2, "lora.rank": 16}
    fallback = [{"instance_type": "ml.p4de.24xlarge", "instance_count": 1}, {"instance_type": "ml.g5.2xlarge"}]
    message = _problems(_input(instance_type="ml.p5.48xlarge", hyperparameters=lora, fallback=fallback), model=big)
    assert "fallback[1]: hyperparameters: fine-tuning 8.03B parameters: the memory plan holds " in message
    assert "over the 21.6 GiB a process may use on ml.g5.2xlarge's 24 GiB A10G" in message
    assert "fallback[0]" not in message  # 8 x 80 GB A100s hold it


SHORT = {"seq_len": 128, "max_steps": 20, "optim.warmup_steps": 2}


def test_a_model_folder_is_split_by_tensor_and_pipeline_parallelism_its_sizes_allow() -> None:
    request = _resolve(_input(instance_type="ml.g5.12xlarge", hyperparameters={**SHORT, "parallel.tp": 2}))
    assert request["hyperparameters"]["parallel.tp"] == "2"
    # The folder's 4 heads and 2 KV heads cannot be cut in 4; fine-tuning records cannot cross pipeline stages.
    uneven = _problems(_input(instance_type="ml.g5.12xlarge", hyperparameters={**SHORT, "parallel.tp": 4}))
    assert "parallel.tp=4 must divide the model's KV heads=2 (tensor parallelism splits them in equal shards); " in (
        uneven
    )
    assert "use parallel.tp=2 or a model whose sizes it divides (init_from's config.json)" in uneven
    staged = _problems(_input(instance_type="ml.g5.12xlarge", hyperparameters={**SHORT, "parallel.pp": 2}))
    assert "hyperparameters: parallel.pp=2: fine-tuning examples are packed rows whose document ids a pipeline " in (
        staged
    )
    adapters = {**SHORT, "parallel.tp": 2, "lora.rank": 4}
    assert "split a model folder's own weights, not LoRA adapters (lora.rank=4)" in _problems(
        _input(instance_type="ml.g5.12xlarge", hyperparameters=adapters)
    )

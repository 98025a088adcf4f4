"""Fine-tuning a model folder: logits against transformers, packing, loss masks, export, LoRA with peft."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from hf_fixtures import chat_records, gpt2_folder, llama_folder, write_jsonl
from safetensors.torch import load_file
from training_helpers import (
    clean_env,
    free_port,
    launcher,
    make_opt_ml,
    run,
    run_in_process,
    run_until,
    step_losses,
)

from contract import model_folder as mf
from contract.config import ConfigError, from_hyperparameters
from contract.sft import parse_record
from training import direct_io, hf_weights, sft
from training.finetune import FineTuning
from training.models.build import ARCHS
from training.sagemaker_contract import Paths

transformers = pytest.importorskip("transformers")
FOLDERS = {"llama": llama_folder, "gpt2": gpt2_folder}
REFERENCE = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return FOLDERS[request.param](tmp_path_factory.mktemp(request.param))


def _ours(path: Path, *, prefetch: bool = False, **hyperparameters: str) -> torch.nn.Module:
    """The built-in model for a folder as the trainer makes it in a world of one: meta, materialised, loaded
    (`prefetch`: told it is for the CPU, its reads started before it is built, as the trainer's are)."""
    cfg = from_hyperparameters({"model.init_from": str(path), "seq_len": "64", **hyperparameters})
    finetune, model = FineTuning.build(cfg, Paths(path), torch.device("cpu") if prefetch else None)
    assert (finetune.prefetch is not None) == prefetch
    finetune.materialize([model], torch.device("cpu"))
    return model.eval()


def _reference(path: Path) -> Any:
    kind = json.loads((path / mf.CONFIG_FILE).read_text())["architectures"][0]
    return getattr(transformers, kind).from_pretrained(str(path), dtype=torch.float32).eval()


@torch.no_grad()
def _max_difference(ours: torch.nn.Module, reference: Any, vocab: int) -> float:
    ids = torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(0))
    return float((ours(ids) - reference(ids).logits).abs().max())


def test_logits_equal_transformers_for_the_same_weights(folder: Path) -> None:
    ours = _ours(folder)
    assert _max_difference(ours, _reference(folder), 300) <= 1e-4


@pytest.mark.parametrize(
    "overrides",
    [
        {"tie_word_embeddings": True},
        # Llama 3.1/3.2's long-context rotary scaling.
        {
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ],
    ids=["tied", "llama3-rope"],
)
def test_llama_variants_load_with_equal_logits(overrides: dict[str, Any], tmp_path: Path) -> None:
    path = llama_folder(tmp_path, seed=3, **overrides)
    assert _max_difference(_ours(path), _reference(path), 300) <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_bfloat16_folder_loads_into_float32_parameters(arch: str, tmp_path: Path) -> None:
    """Each weight read into a staging buffer of its own (no copy out of a reading thread's) and converted (GPT-2's
    also transposed) into its parameter: equal to the file's values, whatever their offset in the file."""
    source = _reference(FOLDERS[arch](tmp_path / "fp32"))
    source.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    for name in mf.TOKENIZER_FILES[:2]:
        if (tmp_path / "fp32" / name).is_file():
            shutil.copy(tmp_path / "fp32" / name, tmp_path / "bf16" / name)
    assert _max_difference(_ours(tmp_path / "bf16"), _reference(tmp_path / "bf16"), 300) <= 1e-4


def test_a_folder_in_several_shards_with_an_index_loads(tmp_path: Path) -> None:
    source = llama_folder(tmp_path / "one")
    model = _reference(source)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="100KB")
    for name in mf.TOKENIZER_FILES[:2]:
        shutil.copy(source / name, tmp_path / "sharded" / name)
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 2
    assert _max_difference(_ours(tmp_path / "sharded"), model, 300) <= 1e-4


def test_the_model_is_not_initialised_for_weights_the_folder_fills_and_nothing_is_left_unfilled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built on meta for a folder, the model's own initialisation is skipped (every weight is read over it); a
    parameter the folder does not fill and no adapter owns is refused rather than left holding no value."""
    path = gpt2_folder(tmp_path)
    cfg = from_hyperparameters({"model.init_from": str(path), "seq_len": "64"})

    def refused(_model: torch.nn.Module) -> None:
        raise AssertionError("init_weights ran for a model whose weights are all read")

    monkeypatch.setattr(ARCHS["gpt2"], "init_weights", refused)
    finetune, model = FineTuning.build(cfg, Paths(path))
    model.register_parameter("extra", torch.nn.Parameter(torch.empty(4, device="meta")))
    with pytest.raises(RuntimeError, match="the model folder fills no value of extra: they would hold no value"):
        finetune.materialize([model], torch.device("cpu"))


def test_a_folder_the_trainer_cannot_run_is_refused_with_every_reason(tmp_path: Path) -> None:
    path = llama_folder(tmp_path)
    config = json.loads((path / mf.CONFIG_FILE).read_text())
    (path / mf.CONFIG_FILE).write_text(json.dumps({**config, "intermediate_size": 128}))
    cfg = from_hyperparameters({"model.init_from": str(path), "seq_len": "64"})
    with pytest.raises(ConfigError) as refused:
        FineTuning.build(cfg, Paths(path))
    assert "model.layers.0.mlp.gate_proj.weight in model.safetensors has shape [160, 64]" in str(refused.value)
    (path / mf.CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="the model folder's limit is 256 tokens"):
        FineTuning.build(from_hyperparameters({"model.init_from": str(path), "seq_len": "300"}), Paths(path))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_packed_examples_attend_only_to_themselves(arch: str, tmp_path: Path) -> None:
    """Each example's logits in a packed row equal its logits alone: no attention across examples, positions
    restarted; and the row's targets skip the boundaries."""
    model = _ours(FOLDERS[arch](tmp_path))
    lengths = [11, 7, 20]
    generator = torch.Generator().manual_seed(1)
    pieces = [torch.randint(5, 300, (n,), generator=generator) for n in lengths]
    examples = sft.Examples.join([(p.tolist(), [1] * len(p)) for p in pieces])
    rows, cut = sft.pack(examples, seq_len=47)
    assert rows.shape == (1, 3, 48) and cut == 0
    x_BT, y_BT, doc_BT = sft.targets(torch.from_numpy(rows))
    with torch.no_grad():
        packed = model(x_BT, doc_BT)[0]
        start = 0
        for piece in pieces:
            alone = model(piece[None, :-1])[0]
            assert float((packed[start : start + len(piece) - 1] - alone).abs().max()) <= 1e-5
            start += len(piece)
    # The last token of an example does not predict the next example's first; padding predicts nothing.
    assert y_BT[0, 10] == sft.IGNORE and y_BT[0, 17] == sft.IGNORE and (y_BT[0, 37:] == sft.IGNORE).all()
    assert (y_BT[0, :10] == pieces[0][1:]).all()


def test_chat_examples_match_transformers_and_only_the_assistant_carries_loss(tmp_path: Path) -> None:
    path = llama_folder(tmp_path)
    ours = sft.ChatTokenizer(path)
    reference = transformers.AutoTokenizer.from_pretrained(str(path))
    for number, record in enumerate(chat_records(12)):
        messages = parse_record(json.dumps(record), where="test")
        assert messages is not None
        ids, mask = ours.example(messages, where=f"record {number}")
        expected = reference.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], tokenize=True, return_dict=True
        )["input_ids"]
        assert ids == list(expected)
        learned = reference.decode([t for t, m in zip(ids, mask, strict=True) if m])
        answers = [m.content + "<|eot_id|>" for m in messages if m.role == "assistant"]
        assert learned == "".join(answers)


def test_prompt_tokens_carry_no_loss(tmp_path: Path) -> None:
    """Changing what the prompt's tokens are leaves the loss as it was; changing a response token does not."""
    path = llama_folder(tmp_path)
    tokenizer = sft.ChatTokenizer(path)
    record = {"messages": [{"role": "user", "content": "explain shards"}, {"role": "assistant", "content": "a b."}]}
    ids, mask = tokenizer.example(parse_record(json.dumps(record), where="t") or [], where="t")
    rows, _ = sft.pack(sft.Examples.join([(ids, mask)]), seq_len=len(ids) + 5)
    x_BT, y_BT, _ = sft.targets(torch.from_numpy(rows))
    targets = y_BT[0, : len(ids) - 1]
    assert (targets[torch.tensor(mask[1:]) == 0] == sft.IGNORE).all()
    assert (targets[torch.tensor(mask[1:]) == 1] != sft.IGNORE).all() and (y_BT[0, len(ids) - 1 :] == sft.IGNORE).all()
    logits = torch.randn(1, x_BT.shape[1], 400, generator=torch.Generator().manual_seed(0))

    def loss(logits: torch.Tensor) -> float:
        return float(torch.nn.functional.cross_entropy(logits[0], y_BT[0], ignore_index=sft.IGNORE))

    prompt_position = mask.index(1) - 2  # predicts a prompt token
    response_position = mask.index(1) - 1  # predicts the first response token
    changed = logits.clone()
    changed[0, prompt_position] += 5 * torch.randn(400)
    assert loss(changed) == loss(logits)
    changed[0, response_position] += 5 * torch.randn(400)
    assert loss(changed) != loss(logits)


_HYPERPARAMETERS = {
    "model.init_from": "base_model",
    "seq_len": "96",
    "batch_size": "2",
    "max_steps": "5",
    "lr": "0.003",
    "optim.warmup_steps": "1",
    "metrics.log_interval": "1",
    "train.deterministic": "true",
}


def _fine_tune(tmp_path: Path, folder: Path, **extra: str) -> tuple[Paths, str]:
    paths = make_opt_ml(tmp_path, {}, corpus=None)
    shutil.copytree(folder, paths.channel("base_model"))
    write_jsonl(paths.channel("train") / "chat.jsonl", chat_records(80))
    write_jsonl(paths.channel("train") / "chat_val.jsonl", chat_records(12, seed=5))
    completed, log = run_in_process(paths.root, {**_HYPERPARAMETERS, **extra})
    assert completed, log[-2000:]
    return paths, log


def _final(paths: Paths, folder: Path) -> torch.nn.Module:
    """Our model with the trainer's final weights (its own export), built as the trainer builds it."""
    base = hf_weights.open_base_model(folder)
    model = ARCHS[base.args.arch](base.args)
    state = load_file(str(paths.model / "model.safetensors"))
    merged = dict(state)
    for name in [n for n in state if n.endswith(".lora_a")]:
        layer = name.removesuffix(".lora_a")
        merged[f"{layer}.weight"] = state[f"{layer}.weight"] + 2.0 * state[f"{layer}.lora_b"] @ state[name]
    model.load_state_dict({k: v for k, v in merged.items() if not k.endswith((".lora_a", ".lora_b"))}, strict=False)
    hf_weights.set_rope(model, base)
    return model.eval()


def test_the_fine_tuned_model_folder_loads_in_transformers_with_our_final_logits(folder: Path, tmp_path: Path) -> None:
    paths, log = _fine_tune(tmp_path, folder)
    assert "model folder written to" in log
    exported = paths.model / mf.FINE_TUNED_FOLDER
    assert {p.name for p in exported.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00001.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert not exported.with_name("hf.partial").exists()
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()
    ours = _final(paths, folder)
    assert _max_difference(ours, reference, 300) <= 1e-4
    assert _max_difference(ours, _reference(folder), 300) > 1e-3  # it did train


def test_lora_trains_only_adapters_that_peft_loads_with_the_merged_logits(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    folder = llama_folder(tmp_path / "base")
    paths, _ = _fine_tune(tmp_path / "run", folder, **{"lora.rank": "4", "lora.alpha": "8"})
    state, original = load_file(str(paths.model / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert torch.equal(state["layers.0.attention.wq.weight"], original["model.layers.0.self_attn.q_proj.weight"])
    assert state["layers.0.attention.wq.lora_b"].abs().max() > 0  # trained
    assert "layers.0.attention.wk.lora_a" not in state  # default targets: q_proj, v_proj
    adapter_config = json.loads((paths.model / mf.ADAPTER_FOLDER / "adapter_config.json").read_text())
    assert adapter_config["target_modules"] == ["q_proj", "v_proj"] and adapter_config["r"] == 4
    ours = _final(paths, folder)
    with_adapter = peft.PeftModel.from_pretrained(_reference(folder), str(paths.model / mf.ADAPTER_FOLDER)).eval()
    assert _max_difference(ours, with_adapter, 300) <= 1e-4
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(paths.model / mf.FINE_TUNED_FOLDER)).eval()
    assert _max_difference(ours, merged.float(), 300) <= 1e-4


def _job(root: Path, folder: Path, distribution: str) -> Paths:
    hyperparameters = {
        "model.init_from": "base_model",
        "distribution": distribution,
        "seq_len": "96",
        "batch_size": "2",
        "max_steps": "12",
        "lr": "0.003",
        "optim.warmup_steps": "2",
        "metrics.log_interval": "1",
        "checkpoint.interval_steps": "3",
        "train.deterministic": "true",
    }
    paths = make_opt_ml(root, hyperparameters, corpus=None)
    shutil.copytree(folder, paths.channel("base_model"))
    write_jsonl(paths.channel("train") / "chat.jsonl", chat_records(120))
    write_jsonl(paths.channel("train") / "chat_val.jsonl", chat_records(12, seed=5))
    return paths


@pytest.mark.slow
def test_fsdp_fine_tuning_resumes_exactly_after_a_spot_interruption_and_exports(folder: Path, tmp_path: Path) -> None:
    """Two processes (FSDP2) fine-tune the folder; a SIGTERM after a checkpoint, as a spot interruption sends it,
    stops them; the resumed run logs the uninterrupted run's losses exactly, and its export loads in transformers
    with our final model's logits."""
    _resumes_exactly_and_exports(folder, tmp_path, "fsdp")


@pytest.mark.slow
def test_ddp_fine_tuning_of_gpt2_resumes_exactly_after_a_spot_interruption(tmp_path: Path) -> None:
    """As above with DDP, whose parameters are the buffers the folder was read into: GPT-2's Conv1D weights
    transposed views, in DDP's buckets, the optimizer's states and the checkpoints."""
    _resumes_exactly_and_exports(gpt2_folder(tmp_path / "gpt2"), tmp_path, "ddp")


def _resumes_exactly_and_exports(folder: Path, tmp_path: Path, distribution: str) -> None:
    reference = _job(tmp_path / "reference", folder, distribution)
    env = clean_env(reference.root, TRAINING_NPROC_PER_NODE="2", TRAINING_MASTER_ADDR="127.0.0.1")
    result = run(launcher(), {**env, "TRAINING_MASTER_PORT": str(free_port())}, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    expected = step_losses(result.stdout)
    assert sorted(expected) == list(range(1, 13))

    paths = _job(tmp_path / "interrupted", folder, distribution)
    env = clean_env(paths.root, TRAINING_NPROC_PER_NODE="2", TRAINING_MASTER_ADDR="127.0.0.1")
    status, log = run_until(
        launcher(),
        {**env, "TRAINING_MASTER_PORT": str(free_port())},
        r"\bstep=4 loss=",
        lambda p: p.send_signal(signal.SIGTERM),
        timeout=300,
    )
    assert status == 0, log[-3000:]
    stopped = max(step_losses(log))
    assert f"checkpoint step-{stopped} is committed" in log and not paths.model.exists()
    result = run(launcher(), {**env, "TRAINING_MASTER_PORT": str(free_port())}, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"resumed from checkpoint step-{stopped}" in result.stdout
    assert step_losses(result.stdout) == {s: v for s, v in expected.items() if s > stopped}
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        str(paths.model / mf.FINE_TUNED_FOLDER), dtype=torch.float32
    ).eval()
    assert _max_difference(_final(paths, folder), exported, 300) <= 1e-4


def test_prepared_examples_train_as_the_jsonl_they_came_from(tmp_path: Path) -> None:
    """`python -m training.prepare --sft` writes what the trainer would tokenize itself: the same losses."""
    from training.prepare import main as prepare

    folder = llama_folder(tmp_path / "base")
    _, from_jsonl = _fine_tune(tmp_path / "jsonl", folder)
    paths = make_opt_ml(tmp_path / "prepared", {}, corpus=None)
    write_jsonl(tmp_path / "chats" / "chat.jsonl", chat_records(80))
    write_jsonl(tmp_path / "chats" / "chat_val.jsonl", chat_records(12, seed=5))
    assert (
        prepare(
            [
                "--sft",
                "--model-folder",
                str(folder),
                "--input",
                str(tmp_path / "chats"),
                "--output",
                str(paths.channel("train")),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in paths.channel("train").iterdir()) == [
        "chat.sft.safetensors",
        "chat_val.sft.safetensors",
    ]
    shutil.copytree(folder, paths.channel("base_model"))
    completed, log = run_in_process(paths.root, {**_HYPERPARAMETERS})
    assert completed and step_losses(log) == step_losses(from_jsonl) and len(step_losses(log)) == 5


def _file_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's weights under our names and in our layout, as safetensors reads them."""
    base = hf_weights.open_base_model(folder)
    tensors = {}
    for file in base.headers:
        tensors.update(load_file(str(folder / file)))
    return {w.ours: tensors[w.hf].t() if w.transposed else tensors[w.hf] for w in mf.weight_names(base.args)}


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_each_weight_is_the_buffer_its_bytes_were_read_into(arch: str, prefetch: bool, tmp_path: Path) -> None:
    """Loaded in a world of one (its reads started before the model is built, or once it is), each parameter
    equals the file's tensor bit for bit, and is where the read put its bytes: at its file offset's place within an
    aligned block, GPT-2's Conv1D weights as transposed views (not copies), and no two parameters share a storage."""
    folder = FOLDERS[arch](tmp_path / arch, hidden_size=128) if arch == "llama" else gpt2_folder(tmp_path / arch)
    model = _ours(folder, prefetch=prefetch)
    expected = _file_tensors(folder)
    params = dict(model.named_parameters())
    assert set(expected) == set(params)
    base = hf_weights.open_base_model(folder)
    storages = set()
    for weight in mf.weight_names(base.args):
        param = params[weight.ours]
        assert torch.equal(param, expected[weight.ours]), weight.ours
        assert param.dtype == expected[weight.ours].dtype
        file, name = base.locate(weight)
        header = base.headers[file]
        start = header.data_start + header.tensors[name]["data_offsets"][0]
        assert param.data_ptr() % 4096 == start % 4096, weight.ours
        assert param.is_contiguous() != weight.transposed, weight.ours
        storages.add(param.untyped_storage().data_ptr())
    assert len(storages) == len(params)
    assert any(w.transposed for w in mf.weight_names(base.args)) == (arch == "gpt2")


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_load_reads_with_the_processs_reading_threads_and_starts_none(
    prefetch: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world of one's load (its reads started early, or not) reads every weight with the process's reading
    threads, started before it: threads started while the reads fault in new memory were slow to start
    (docs/BENCHMARKS.md)."""
    folder = gpt2_folder(tmp_path / "gpt2")
    pool = direct_io.reading_threads()
    started: list[str] = []
    start = threading.Thread.start

    def recorded(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recorded)
    reading: set[str] = set()
    preadv = os.preadv

    def counted(fd: int, buffers: list[Any], offset: int, *rest: Any) -> int:
        reading.add(threading.current_thread().name)
        return preadv(fd, buffers, offset, *rest)

    monkeypatch.setattr(os, "preadv", counted)
    model = _ours(folder, prefetch=prefetch)
    assert started == []
    assert reading and reading <= {thread.name for thread in cast(Any, pool)._threads}
    params = dict(model.named_parameters())
    assert all(torch.equal(params[name], value) for name, value in _file_tensors(folder).items())


def test_the_garbage_collector_is_paused_within_a_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building and loading the model pause Python's cyclic garbage collector (a full collection there took 0.2 s
    of a load, docs/BENCHMARKS.md): it is off as the folder is opened, as the parameters are placed, as every read
    is made, and on again after."""
    folder = gpt2_folder(tmp_path / "gpt2")
    enabled: dict[str, set[bool]] = {}

    def recording(name: str, call: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            enabled.setdefault(name, set()).add(gc.isenabled())
            return call(*args, **kwargs)

        return recorded

    for name in ("open_base_model", "place_in_read_buffers", "load_weights"):
        monkeypatch.setattr(hf_weights, name, recording(name, getattr(hf_weights, name)))
    monkeypatch.setattr(os, "preadv", recording("preadv", os.preadv))
    model = _ours(folder, prefetch=True)
    assert enabled == {name: {False} for name in ("open_base_model", "place_in_read_buffers", "load_weights", "preadv")}
    assert gc.isenabled()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[name], value) for name, value in _file_tensors(folder).items())


def _fsdp_reads(folder: Path, rank: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[int, int]], Any]:
    """The byte ranges of the folder's file that rank `rank` of two reads when FSDP2 shards the model, and the
    model (a fake process group: no other process; the reads are this one's)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    reads: list[tuple[int, int]] = []
    preadv = os.preadv

    def counted(fd: int, buffers: list[Any], offset: int, *rest: Any) -> int:
        got = preadv(fd, buffers, offset, *rest)
        reads.append((offset, offset + got))
        return got

    monkeypatch.setattr(os, "preadv", counted)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    try:
        cfg = from_hyperparameters({"model.init_from": str(folder), "seq_len": "64", "distribution": "fsdp"})
        finetune, model = FineTuning.build(cfg, Paths(folder))
        mesh = init_device_mesh("cpu", (2,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        finetune.materialize([model], torch.device("cpu"))
        return reads, model
    finally:
        dist.destroy_process_group()


def test_under_fsdp_each_rank_reads_only_the_rows_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks' reads (counted per rank) of a Llama folder sharded by FSDP2: each only the blocks of its own rows
    of each weight, together the file's weights once, and each rank's part equal to the file's rows."""
    from torch.distributed.tensor import DTensor

    folder = llama_folder(tmp_path / "llama", hidden_size=512, intermediate_size=1024, tokenizer=False)
    base = hf_weights.open_base_model(folder)
    ((_, header),) = base.headers.items()
    expected = _file_tensors(folder)
    block = 4096
    read_per_rank = []
    for rank in (0, 1):
        reads, model = _fsdp_reads(folder, rank, monkeypatch)
        held: list[tuple[int, int]] = []  # the blocks of the rows this rank holds, of every weight
        for weight in mf.weight_names(base.args):
            param = model.get_parameter(weight.ours)
            assert isinstance(param, DTensor)
            local, shape, offset = hf_weights.local_part(param)
            rows = slice(offset[0], offset[0] + shape[0])
            assert torch.equal(local, expected[weight.ours][rows]), weight.ours
            entry = header.tensors[base.locate(weight)[1]]
            row = local.element_size() * int(torch.tensor(entry["shape"][1:]).prod())
            start = header.data_start + entry["data_offsets"][0] + offset[0] * row
            held.append((start // block * block, -(-(start + shape[0] * row) // block) * block))
        assert reads
        for begin, end in reads:
            assert any(b <= begin and end <= e for b, e in held), (rank, begin, end)
        read_per_rank.append(sum(end - begin for begin, end in reads))
    weights = sum(t.numel() * t.element_size() for t in expected.values())
    assert all(0.45 * weights <= read <= 0.55 * weights for read in read_per_rank), (read_per_rank, weights)

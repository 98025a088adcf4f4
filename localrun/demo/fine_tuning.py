"""A small model folder and chat records, generated offline, for the fine-tuning demo and tests: no hub.

`transformers` builds a random model from a config and `save_pretrained` writes it, as a published model
folder; the `tokenizers` library trains a small byte-level BPE on generated chat text, and the folder gets a
Llama-3-style chat template. The records are a seeded grammar of questions and answers, so that a small model's
loss on the answers falls within a few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's template, less its date and tools preamble.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
_TOPICS = ["checkpoints", "spot capacity", "the scheduler", "gradients", "shards", "the optimizer", "a cluster"]
_VERBS = ["explain", "describe", "summarise", "list the risks of", "compare"]
_ANSWERS = ["resumes", "streams", "shards", "evaluates", "registers", "trains", "restarts"]


def chat_records(count: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Generated conversations: a system turn sometimes, then one or two user/assistant exchanges; every fourth
    record a prompt/response pair instead."""
    rng = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
    records: list[dict[str, Any]] = []
    for i in range(count):
        topic = rng.choice(_TOPICS)
        question = f"please {rng.choice(_VERBS)} {topic}"
        answer = " ".join(f"{topic} {rng.choice(_ANSWERS)}" for _ in range(rng.randint(2, 6))) + "."
        if i % 4 == 3:
            records.append({"prompt": question, "response": answer})
            continue
        messages = [{"role": "system", "content": "you are brief"}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if i % 5 == 0:
            messages += [{"role": "user", "content": "and then"}, {"role": "assistant", "content": f"{topic} ends."}]
        records.append({"messages": messages})
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_tokenizer(folder: Path, *, vocab_size: int = 384, chat_template: bool = True) -> int:
    """A byte-level BPE trained on generated chat text, saved as tokenizer.json and tokenizer_config.json; returns
    its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415  (dev only)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [json.dumps(r) for r in chat_records(400, seed=1)] + ["system user assistant"] * 20
    tokenizer.train_from_iterator(texts, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "model_max_length": 256,
    }
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return int(tokenizer.get_vocab_size())


def llama_folder(folder: Path, *, seed: int = 0, tokenizer: bool = True, **overrides: Any) -> Path:
    """A random Llama (grouped-query attention, untied head unless told) saved with save_pretrained in fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415  (the demo imports this module first)

    settings: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 0,
        "eos_token_id": 4,
        "tie_word_embeddings": False,
    }
    return _saved_random(
        folder, LlamaForCausalLM, LlamaConfig, {**settings, **overrides}, seed=seed, tokenizer=tokenizer
    )


def gpt2_folder(folder: Path, *, seed: int = 0, tokenizer: bool = True, **overrides: Any) -> Path:
    """A random GPT-2 (GPT2LMHeadModel, tied head) saved with save_pretrained in fp32."""
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415

    settings: dict[str, Any] = {
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 256,
        "bos_token_id": 0,
        "eos_token_id": 4,
    }
    return _saved_random(folder, GPT2LMHeadModel, GPT2Config, {**settings, **overrides}, seed=seed, tokenizer=tokenizer)


def _saved_random(
    folder: Path, model_class: Any, config_class: Any, settings: dict[str, Any], *, seed: int, tokenizer: bool
) -> Path:
    """`model_class` of the `config_class` of `settings` and the vocabulary of the demo's tokenizer (written in
    `folder` when `tokenizer`, else 384 ids), with weights drawn from `seed` (fp32, torch's default dtype) and its
    norms randomised, saved in `folder` with save_pretrained."""
    import torch  # noqa: PLC0415  (the demo imports this module before it needs torch)

    vocab = write_tokenizer(folder) if tokenizer else 384
    torch.manual_seed(seed)
    model = model_class(config_class(**{"vocab_size": vocab, **settings}))
    _randomise_norms(model, seed)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def _randomise_norms(model: Any, seed: int) -> None:
    """Norm weights and biases away from 1 and 0, so that a weight loaded into the wrong slot shows in the logits."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or ".ln_" in name or name.endswith(("bias",)):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def build_fine_tuning(workdir: Path) -> tuple[Path, list[Path]]:
    """A random small Llama model folder and chat records (train, and a 'val' file) under `workdir`."""
    folder = llama_folder(workdir / "model", seed=7)
    files = [
        write_jsonl(workdir / "chats" / "chat.jsonl", chat_records(600, seed=3)),
        write_jsonl(workdir / "chats" / "chat_val.jsonl", chat_records(48, seed=11)),
    ]
    return folder, files

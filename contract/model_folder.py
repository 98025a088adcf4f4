"""A Hugging Face model folder, torch-free: what its config.json builds, which tensors its shards must hold.

Nomenclature: a **model folder** is a model as the Hugging Face ecosystem publishes it: ``config.json``,
the weights as ``model.safetensors`` or as shards ``model-0000i-of-0000n.safetensors`` listed by
``model.safetensors.index.json``, the tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and
optionally ``generation_config.json``. A run names one with `init_from`; the trainer starts from it (the
**base model**) and writes the fine-tuned model as another.

Validate reads the same files from S3 (config, index, each shard's header, the tokenizer) and the trainer
from its input channel; both judge them with the functions here, so they refuse the same folders. A
safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
offsets), then the tensors' bytes: its header is read without torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.model_args import Arch, ModelArgs

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, "special_tokens_map.json")
"""The tokenizer's files the fine-tuned model folder carries over from the base model's (those present)."""

BASE_MODEL_CHANNEL = "base_model"
"""The input channel that brings a run's `init_from` model folder; its hyperparameter model.init_from names it."""
FINE_TUNED_FOLDER = "hf"
"""Where the trainer writes the fine-tuned model folder, inside its model output (/opt/ml/model, model.tar.gz)."""
ADAPTER_FOLDER = "adapter"
"""Where it writes the LoRA adapter (peft's layout) beside it, when the run trains adapters."""

SUPPORTED_ARCHITECTURES: dict[str, Arch] = {"LlamaForCausalLM": "llama", "GPT2LMHeadModel": "gpt2"}
"""config.json's `architectures` value -> the built-in architecture that runs it."""

HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000
"""safetensors' own bound on a header's size."""
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
# Buffers some published checkpoints carry that the architectures recompute (GPT-2's causal mask, old
# Llama exports' rotary frequencies): present or not, they are not weights.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


class ModelFolderError(ValueError):
    """A model folder the trainer cannot start from; `problems` lists every reason, each with its fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class WeightName:
    """One weight: our parameter's name, the checkpoint's name for it, its shape in the checkpoint, and whether
    the checkpoint stores it transposed (GPT-2's Conv1D keeps (in, out) where nn.Linear keeps (out, in))."""

    ours: str
    hf: str
    shape: tuple[int, ...]
    transposed: bool = False


def architecture(config: Mapping[str, Any]) -> Arch:
    """The built-in architecture config.json's `architectures` names; ModelFolderError naming it otherwise."""
    names = config.get("architectures") or []
    supported = [name for name in names if name in SUPPORTED_ARCHITECTURES]
    if not supported:
        raise ModelFolderError(
            [
                f"config.json's architectures {names!r} is not supported; the trainer fine-tunes "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            ]
        )
    return SUPPORTED_ARCHITECTURES[supported[0]]


def model_args(config: Mapping[str, Any], *, dropout: float = 0.0) -> ModelArgs:
    """The built-in model's arguments for config.json; ModelFolderError with every setting it cannot run."""
    arch = architecture(config)
    problems: list[str] = []
    args = _llama_args(config, problems) if arch == "llama" else _gpt2_args(config, problems)
    if args is not None:
        try:
            args.replace(dropout=dropout).validate()
        except ValueError as exc:
            problems.append(f"config.json: {exc}")
    if problems or args is None:
        raise ModelFolderError(problems or ["config.json lacks the model's sizes"])
    return args.replace(dropout=dropout)


def _int(config: Mapping[str, Any], key: str, problems: list[str], default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        problems.append(f"config.json: {key}={value!r} must be a positive integer")
        return 1
    return value


def _unsupported(config: Mapping[str, Any], settings: dict[str, object], problems: list[str]) -> None:
    """Each setting whose value differs from what the built-in architecture computes."""
    for key, expected in settings.items():
        value = config.get(key, expected)
        if value != expected:
            problems.append(
                f"config.json: {key}={value!r} is not supported (the built-in architecture has {expected!r})"
            )


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rotary embedding's parameters, in transformers 5's `rope_parameters` form or the older `rope_theta` and
    `rope_scaling` keys: at least `rope_type` and `rope_theta`."""
    found = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    found = {**scaling, **found}
    found.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    found["rope_type"] = found.get("rope_type", found.get("type", "default"))
    return found


def _llama_args(config: Mapping[str, Any], problems: list[str]) -> ModelArgs | None:
    dim = _int(config, "hidden_size", problems)
    heads = _int(config, "num_attention_heads", problems)
    rope = rope_parameters(config)
    if rope["rope_type"] not in ("default", "llama3"):
        problems.append(f"config.json: rope type {rope['rope_type']!r} is not supported; use default or llama3")
    head_dim = config.get("head_dim") or dim // heads
    if head_dim * heads != dim:
        problems.append(f"config.json: head_dim={head_dim} x num_attention_heads={heads} must equal hidden_size={dim}")
    _unsupported(
        config, {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}, problems
    )
    return ModelArgs(
        arch="llama",
        vocab_size=_int(config, "vocab_size", problems),
        dim=dim,
        n_layers=_int(config, "num_hidden_layers", problems),
        n_heads=heads,
        n_kv_heads=_int(config, "num_key_value_heads", problems, default=heads),
        ffn_dim=_int(config, "intermediate_size", problems),
        max_seq_len=_int(config, "max_position_embeddings", problems),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope["rope_theta"]),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        bias=False,
    )


_GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}


def _gpt2_args(config: Mapping[str, Any], problems: list[str]) -> ModelArgs | None:
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GPT2_GELU:
        problems.append(
            f"config.json: activation_function={activation!r} is not supported; use {', '.join(_GPT2_GELU)}"
        )
    _unsupported(
        config,
        {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False},
        problems,
    )
    dim = _int(config, "n_embd", problems)
    return ModelArgs(
        arch="gpt2",
        vocab_size=_int(config, "vocab_size", problems),
        dim=dim,
        n_layers=_int(config, "n_layer", problems),
        n_heads=_int(config, "n_head", problems),
        max_seq_len=_int(config, "n_positions", problems),
        ffn_dim=config.get("n_inner") or 4 * dim,
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        bias=True,
        gelu=_GPT2_GELU.get(activation, "tanh"),  # type: ignore[arg-type]
    )


def weight_names(args: ModelArgs) -> list[WeightName]:
    """Every weight of the built-in model for `args`, under its name in a Hugging Face checkpoint."""
    names = _llama_names(args) if args.arch == "llama" else _gpt2_names(args)
    return [w for w in names if not (args.tie_embeddings and w.hf == "lm_head.weight")]


def _llama_names(args: ModelArgs) -> list[WeightName]:
    q, kv, hidden = args.n_heads * args.head_dim, args.kv_heads * args.head_dim, args.hidden_dim
    names = [WeightName("tok_embeddings.weight", "model.embed_tokens.weight", (args.vocab_size, args.dim))]
    for i in range(args.n_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        names += [
            WeightName(f"{ours}attention_norm.weight", f"{hf}input_layernorm.weight", (args.dim,)),
            WeightName(f"{ours}attention.wq.weight", f"{hf}self_attn.q_proj.weight", (q, args.dim)),
            WeightName(f"{ours}attention.wk.weight", f"{hf}self_attn.k_proj.weight", (kv, args.dim)),
            WeightName(f"{ours}attention.wv.weight", f"{hf}self_attn.v_proj.weight", (kv, args.dim)),
            WeightName(f"{ours}attention.wo.weight", f"{hf}self_attn.o_proj.weight", (args.dim, q)),
            WeightName(f"{ours}ffn_norm.weight", f"{hf}post_attention_layernorm.weight", (args.dim,)),
            WeightName(f"{ours}feed_forward.w1.weight", f"{hf}mlp.gate_proj.weight", (hidden, args.dim)),
            WeightName(f"{ours}feed_forward.w3.weight", f"{hf}mlp.up_proj.weight", (hidden, args.dim)),
            WeightName(f"{ours}feed_forward.w2.weight", f"{hf}mlp.down_proj.weight", (args.dim, hidden)),
        ]
    names += [
        WeightName("norm.weight", "model.norm.weight", (args.dim,)),
        WeightName("output.weight", "lm_head.weight", (args.vocab_size, args.dim)),
    ]
    return names


def _gpt2_names(args: ModelArgs) -> list[WeightName]:
    dim, hidden = args.dim, args.hidden_dim
    names = [
        WeightName("wte.weight", "transformer.wte.weight", (args.vocab_size, dim)),
        WeightName("wpe.weight", "transformer.wpe.weight", (args.max_seq_len, dim)),
    ]
    for i in range(args.n_layers):
        ours, hf = f"layers.{i}.", f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            names += [WeightName(f"{ours}{norm}.{p}", f"{hf}{norm}.{p}", (dim,)) for p in ("weight", "bias")]
        for module, fan_in, fan_out in (
            ("attn.c_attn", dim, 3 * dim),
            ("attn.c_proj", dim, dim),
            ("mlp.c_fc", dim, hidden),
            ("mlp.c_proj", hidden, dim),
        ):
            names += [
                WeightName(f"{ours}{module}.weight", f"{hf}{module}.weight", (fan_in, fan_out), transposed=True),
                WeightName(f"{ours}{module}.bias", f"{hf}{module}.bias", (fan_out,)),
            ]
    names += [WeightName(f"ln_f.{p}", f"transformer.ln_f.{p}", (dim,)) for p in ("weight", "bias")]
    names.append(WeightName("lm_head.weight", "lm_head.weight", (args.vocab_size, dim)))
    return names


LORA_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {"llama": ("q_proj", "v_proj"), "gpt2": ("c_attn",)}
"""The attention's query and value projections: peft's default LoRA targets for these architectures."""
_EMBEDDINGS_AND_NORMS = {"tok_embeddings", "wte", "wpe", "norm", "attention_norm", "ffn_norm", "ln_1", "ln_2", "ln_f"}


def lora_targets(args: ModelArgs, target_modules: str) -> dict[str, str]:
    """Our module -> the folder's, for each linear layer LoRA's comma-separated `target_modules` names (as peft
    matches them: the module's name or its last part); the architecture's default when it names none.
    ValueError naming the choices when a name matches no linear layer."""
    names = tuple(n.strip() for n in target_modules.split(",") if n.strip()) or LORA_DEFAULT_TARGETS[args.arch]
    modules = {w.ours.removesuffix(".weight"): w.hf.removesuffix(".weight") for w in weight_names(args)}
    linear = {ours: hf for ours, hf in modules.items() if ours.rsplit(".", 1)[-1] not in _EMBEDDINGS_AND_NORMS}

    def matches(hf: str, name: str) -> bool:
        return hf == name or hf.endswith(f".{name}")

    unknown = [n for n in names if not any(matches(hf, n) for hf in linear.values())]
    if unknown:
        choices = sorted({hf.rsplit(".", 1)[-1] for hf in linear.values()})
        raise ValueError(
            f"lora.target_modules {', '.join(unknown)} match no linear layer; choose from {', '.join(choices)}"
        )
    return {ours: hf for ours, hf in linear.items() if any(matches(hf, n) for n in names)}


def lora_parameters(args: ModelArgs, target_modules: str, rank: int) -> int:
    """The parameters LoRA adapters of `rank` on those targets train: rank x (in + out) for each layer."""
    shapes = {w.ours.removesuffix(".weight"): w.shape for w in weight_names(args)}
    return sum(rank * sum(shapes[ours]) for ours in lora_targets(args, target_modules))


def checkpoint_name(hf: str, present: set[str]) -> str | None:
    """The name `hf` has in a checkpoint holding `present`: as written, or without `transformer.` (GPT-2 as
    OpenAI's checkpoints were converted); None when it is in neither form."""
    if hf in present:
        return hf
    bare = hf.removeprefix("transformer.")
    return bare if bare in present else None


# -- safetensors headers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardHeader:
    """A safetensors file's header: its tensors (name -> dtype, shape, data_offsets), where their data starts,
    and the file's size."""

    tensors: dict[str, dict[str, Any]]
    data_start: int
    size: int


def read_header(read: Callable[[int, int], bytes], file: str, size: int) -> ShardHeader:
    """The header of a safetensors file of `size` bytes, read with `read(offset, length)` (a file, or S3 ranges)."""
    first = read(0, HEADER_LENGTH_BYTES) if size >= HEADER_LENGTH_BYTES else b""
    if len(first) < HEADER_LENGTH_BYTES:
        raise ModelFolderError([f"{file}: {size} bytes is too short for a safetensors file"])
    length = int.from_bytes(first, "little")
    if not 2 <= length <= min(MAX_HEADER_BYTES, size - HEADER_LENGTH_BYTES):
        raise ModelFolderError([f"{file}: header length {length} is not a safetensors header's (file of {size} bytes)"])
    try:
        header = json.loads(read(HEADER_LENGTH_BYTES, length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError([f"{file}: the safetensors header is not JSON ({exc})"]) from None
    if not isinstance(header, dict):
        raise ModelFolderError([f"{file}: the safetensors header is not a JSON object"])
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    return ShardHeader(tensors=tensors, data_start=HEADER_LENGTH_BYTES + length, size=size)


def shard_files(index: Mapping[str, Any] | None) -> list[str]:
    """The weight files a folder's weights are in: the index's (sorted), or the single file without one."""
    if index is None:
        return [SINGLE_WEIGHTS_FILE]
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFolderError([f"{INDEX_FILE}: has no weight_map object naming each weight's file"])
    return sorted({str(file) for file in weight_map.values()})


def check_weights(
    args: ModelArgs, index: Mapping[str, Any] | None, headers: Mapping[str, ShardHeader | None]
) -> list[str]:
    """Every inconsistency between config.json's sizes, the index and the shards' headers (None: file missing)."""
    problems: list[str] = []
    located: dict[str, str] = {}  # the checkpoint's name -> its file
    for file, header in headers.items():
        if header is None:
            problems.append(f"{file} is missing from the model folder" + (f" ({INDEX_FILE} names it)" if index else ""))
            continue
        problems += _header_problems(file, header)
        for name in header.tensors:
            located.setdefault(name, file)
    weight_map = dict((index or {}).get("weight_map") or {})
    for name, file in sorted(weight_map.items()):
        header = headers.get(file)
        if header is not None and name not in header.tensors:
            problems.append(f"{INDEX_FILE} puts {name} in {file}, whose header does not hold it")
    present = set(located)
    expected = weight_names(args)
    for weight in expected:
        stored = checkpoint_name(weight.hf, present)
        if stored is None:
            problems.append(f"weight {weight.hf} is in no shard ({', '.join(headers) or 'none'}); config.json needs it")
            continue
        found = headers[located[stored]]
        assert found is not None
        shape = tuple(found.tensors[stored]["shape"])
        if shape != weight.shape:
            problems.append(
                f"weight {stored} in {located[stored]} has shape {list(shape)}; config.json's sizes make "
                f"{list(weight.shape)}"
            )
    known = {checkpoint_name(w.hf, present) for w in expected} | {"lm_head.weight"}
    extra = sorted(n for n in present - known if not n.endswith(_IGNORED_SUFFIXES))
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        problems.append(f"the shards hold weights config.json's architecture does not have: {shown}")
    return problems


def _header_problems(file: str, header: ShardHeader) -> list[str]:
    problems = []
    end = 0
    for name, entry in header.tensors.items():
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            dtype not in DTYPE_BYTES
            or not isinstance(shape, list)
            or not isinstance(offsets, list)
            or len(offsets) != 2
        ):
            problems.append(f"{file}: {name} has no valid dtype, shape and data_offsets")
            continue
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_BYTES[dtype]:
            problems.append(f"{file}: {name}'s data_offsets do not span its {dtype} shape {shape}")
        if dtype not in FLOAT_DTYPES and not name.endswith(_IGNORED_SUFFIXES):
            problems.append(f"{file}: {name} is {dtype}; weights must be one of {', '.join(FLOAT_DTYPES)}")
        end = max(end, offsets[1])
    if header.data_start + end != header.size:
        problems.append(
            f"{file}: {header.size} bytes, but its header describes {header.data_start + end}; copy the file again"
        )
    return problems


def weights_dtype(headers: Mapping[str, ShardHeader | None]) -> str:
    """The safetensors dtype most of the weights are stored in (the fine-tuned model is written in it)."""
    counts: dict[str, int] = {}
    for header in headers.values():
        for entry in header.tensors.values() if header is not None else ():
            if entry.get("dtype") in FLOAT_DTYPES:
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + math.prod(entry["shape"])
    return max(counts, key=lambda dtype: counts[dtype]) if counts else "F32"


# -- the tokenizer -------------------------------------------------------------------------------------


def tokenizer_size(tokenizer: Mapping[str, Any]) -> int:
    """One more than the largest token id tokenizer.json can produce (its model's vocabulary and added tokens)."""
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))  # Unigram: a list
    ids += [token.get("id", 0) for token in tokenizer.get("added_tokens") or []]
    return max(ids, default=-1) + 1


def check_tokenizer(args: ModelArgs, tokenizer: Mapping[str, Any] | None) -> list[str]:
    """Whether every id the tokenizer produces has a row in the embedding (config.json's vocab_size)."""
    if tokenizer is None:
        return [f"{TOKENIZER_FILE} is missing from the model folder; the trainer tokenizes with it"]
    size = tokenizer_size(tokenizer)
    if size > args.vocab_size:
        return [
            f"{TOKENIZER_FILE} produces ids up to {size - 1}, but config.json's vocab_size={args.vocab_size} gives the "
            "embedding fewer rows; use the tokenizer the model was trained with"
        ]
    return []


def parameter_count(args: ModelArgs) -> int:
    """The model's parameters (a tied embedding counted once), from its sizes."""
    return sum(math.prod(w.shape) for w in weight_names(args))

"""Supervised fine-tuning data: conversations tokenized with the model's own tokenizer, packed into rows.

Nomenclature: an **example** is one conversation's tokens with its **loss mask** (1 on the assistant's tokens,
which the model learns to produce; 0 on everything else: system, user, template); a **row** is `seq_len + 1`
tokens of whole examples packed one after another, each example's tokens marked with its own document id, so
that attention stays within an example (training/models/documents.py) and no example predicts another's first
token. The rest of a row is padding (document 0), which carries no loss.

The tokenizer is the model folder's `tokenizer.json` (the `tokenizers` library) with the chat template of its
`tokenizer_config.json`, rendered as transformers renders it (a sandboxed jinja2 environment). Which tokens are
the assistant's is found by rendering the conversation up to each assistant message, with and without it: the
characters in between are that message (with the template's end-of-turn marker), and the tokens whose text
starts there carry the loss. Without a chat template, a prompt/response pair is the prompt's text then the
response's and the end-of-sequence token.

Examples are kept as three arrays (contract-free, also the offline format of `python -m training.prepare --sft`,
a `*.sft.safetensors` file): `tokens` and `mask` of all examples end to end, and `starts`, each example's first
index (and the end). Rows are packed at the start of training, for the run's `seq_len`, in the examples' order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contract import model_folder as mf
from contract.sft import ASSISTANT, JSONL_SUFFIX, Message, read_records

IGNORE = -100
"""The target of a token that carries no loss (torch's cross_entropy ignore_index default)."""
ROW_FIELDS = 3
"""A packed row's arrays: tokens, loss mask, document ids."""


class ChatTemplateError(ValueError):
    """The model folder's tokenizer or chat template cannot turn the dataset's records into examples."""


@dataclass
class Examples:
    """Examples end to end: `tokens` and `mask` (1: learned) of equal length, `starts` each one's first index."""

    tokens: npt.NDArray[np.int64]
    mask: npt.NDArray[np.uint8]
    starts: npt.NDArray[np.int64]

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    @classmethod
    def join(cls, parts: Sequence[tuple[list[int], list[int]]]) -> Examples:
        lengths = [len(tokens) for tokens, _ in parts]
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.fromiter((t for ids, _ in parts for t in ids), dtype=np.int64, count=int(starts[-1]))
        mask = np.fromiter((m for _, bits in parts for m in bits), dtype=np.uint8, count=int(starts[-1]))
        return cls(tokens, mask, starts)

    @classmethod
    def concat(cls, many: Sequence[Examples]) -> Examples:
        offsets = np.cumsum([0] + [len(e.tokens) for e in many])
        starts = np.concatenate([[0]] + [e.starts[1:] + off for e, off in zip(many, offsets, strict=False)])
        tokens = np.concatenate([e.tokens for e in many]) if many else np.zeros(0, np.int64)
        mask = np.concatenate([e.mask for e in many]) if many else np.zeros(0, np.uint8)
        return cls(tokens.astype(np.int64), mask.astype(np.uint8), starts.astype(np.int64))

    def save(self, path: Path) -> None:
        from safetensors.numpy import save_file  # noqa: PLC0415

        tmp = path.with_name(path.name + ".tmp")
        save_file({"tokens": self.tokens, "mask": self.mask, "starts": self.starts}, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Examples:
        from safetensors.numpy import load_file  # noqa: PLC0415

        data = load_file(str(path))
        return cls(data["tokens"].astype(np.int64), data["mask"].astype(np.uint8), data["starts"].astype(np.int64))


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an object with its content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    """The model folder's tokenizer and chat template: conversations -> tokens and loss masks."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer  # noqa: PLC0415  (the image's, not the Lambda runtime's)

        path = folder / mf.TOKENIZER_FILE
        if not path.is_file():
            raise ChatTemplateError(
                f"{mf.TOKENIZER_FILE} is missing from the model folder {folder}; it tokenizes the data"
            )
        self.tokenizer = Tokenizer.from_file(str(path))
        config_path = folder / mf.TOKENIZER_CONFIG_FILE
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.special = {
            key: text
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(key)))
        }
        template = config.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.template = _compile(template) if isinstance(template, str) else None

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        assert self.template is not None
        return str(
            self.template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                **self.special,
            )
        )

    def example(self, messages: Sequence[Message], *, where: str) -> tuple[list[int], list[int]]:
        """One conversation's token ids and loss mask."""
        if self.template is None:
            return self._plain(messages, where)
        full = self.render(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message.role != ASSISTANT:
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1], add_generation_prompt=False)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise ChatTemplateError(
                    f"{where}: the chat template does not render the conversation message by message (its text up "
                    f"to message {i} is not a prefix of the whole); the trainer cannot tell the assistant's tokens"
                )
            spans.append((len(before), len(upto)))
        encoding = self.tokenizer.encode(full, add_special_tokens=False)
        mask = [int(any(a <= start < b for a, b in spans)) for start, _ in encoding.offsets]
        return list(encoding.ids), mask

    def _plain(self, messages: Sequence[Message], where: str) -> tuple[list[int], list[int]]:
        roles = [m.role for m in messages]
        if roles != ["user", ASSISTANT]:
            raise ChatTemplateError(
                f"{where}: the model folder's tokenizer_config.json has no chat_template, so only prompt/response "
                "records can be tokenized; add a chat template or write the records as prompt and response"
            )
        prompt = self.tokenizer.encode(messages[0].content, add_special_tokens=False).ids
        response = self.tokenizer.encode(messages[1].content, add_special_tokens=False).ids
        eos = self.tokenizer.token_to_id(self.special.get("eos_token", ""))
        bos = self.tokenizer.token_to_id(self.special.get("bos_token", ""))
        head = [bos] if bos is not None else []
        tail = [eos] if eos is not None else []
        ids = head + prompt + response + tail
        return ids, [0] * (len(head) + len(prompt)) + [1] * (len(response) + len(tail))


def _compile(template: str) -> Any:
    """The template in transformers' environment: sandboxed, trimmed blocks, its globals and tojson filter."""
    from jinja2 import ext  # noqa: PLC0415
    from jinja2.exceptions import TemplateError  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # the local time, as transformers
    return env.from_string(template)


def tokenize_files(files: Iterable[Path], tokenizer: ChatTokenizer) -> Examples:
    """Every record of these JSONL files, in order, as examples."""
    parts = []
    for path in files:
        with path.open(encoding="utf-8") as lines:
            for number, conversation in enumerate(read_records(lines, source=path.name)):
                parts.append(tokenizer.example(conversation, where=f"{path.name} record {number + 1}"))
    return Examples.join(parts)


def load_examples(files: Sequence[Path], folder: Path | None) -> Examples:
    """The examples of a channel's files: JSONL tokenized with the model folder's tokenizer, or prepared files."""
    jsonl = [path for path in files if path.name.endswith(JSONL_SUFFIX)]
    if jsonl and folder is None:
        raise ChatTemplateError(
            f"{jsonl[0].name}: JSONL records are tokenized with a model folder's tokenizer; set model.init_from, or "
            "tokenize them offline with python -m training.prepare --sft"
        )
    tokenizer = ChatTokenizer(folder) if jsonl and folder is not None else None
    parts = []
    for path in files:
        if path.name.endswith(JSONL_SUFFIX):
            assert tokenizer is not None
            parts.append(tokenize_files([path], tokenizer))
        else:
            parts.append(Examples.load(path))
    return Examples.concat(parts)


def pack(examples: Examples, seq_len: int) -> tuple[npt.NDArray[np.int64], int]:
    """Rows of `seq_len + 1` tokens (tokens, mask, document ids stacked: (rows, 3, seq_len + 1)), filled with whole
    examples in order; an example longer than a row is cut to it. Also returns how many examples were cut."""
    width = seq_len + 1
    rows: list[npt.NDArray[np.int64]] = []
    row = np.zeros((ROW_FIELDS, width), dtype=np.int64)
    used = documents = cut = 0
    for i in range(examples.count):
        start, end = int(examples.starts[i]), int(examples.starts[i + 1])
        length = min(end - start, width)
        cut += end - start > width
        if used + length > width:
            rows.append(row)
            row = np.zeros((ROW_FIELDS, width), dtype=np.int64)
            used = documents = 0
        documents += 1
        row[0, used : used + length] = examples.tokens[start : start + length]
        row[1, used : used + length] = examples.mask[start : start + length]
        row[2, used : used + length] = documents
        used += length
    if used:
        rows.append(row)
    return (np.stack(rows) if rows else np.zeros((0, ROW_FIELDS, width), dtype=np.int64)), cut


class PackedSamples:
    """Packed rows as the loaders address samples (training/data.py): `gather(indices)` -> (n, 3, seq_len + 1)."""

    shifted = False

    def __init__(self, examples: Examples, seq_len: int) -> None:
        self.rows, self.cut = pack(examples, seq_len)
        self.seq_len = seq_len
        self.n_samples = len(self.rows)
        self.row_shape: tuple[int, ...] = (ROW_FIELDS, seq_len + 1)
        self.learned_tokens = int(examples.mask.sum())

    def gather(self, indices: npt.NDArray[np.int64], shift: int = 0) -> npt.NDArray[np.int64]:
        if shift:
            raise ValueError("packed rows have no shifted windows (data.shift_windows is for token shards)")
        return self.rows[indices]


def targets(rows_B3L: Any) -> tuple[Any, Any, Any]:
    """(inputs, targets, document ids) of packed rows (torch tensors (B, 3, L)): a target is IGNORE where its token
    is not learned, is padding, or starts another example than its input's."""
    import torch  # noqa: PLC0415

    tokens, mask, docs = rows_B3L[:, 0], rows_B3L[:, 1], rows_B3L[:, 2]
    learned = (mask[:, 1:] == 1) & (docs[:, 1:] == docs[:, :-1]) & (docs[:, 1:] > 0)
    y_BT = torch.where(learned, tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE))
    return tokens[:, :-1], y_BT, docs[:, :-1]

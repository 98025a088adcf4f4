"""Tokenizers for ``training.prepare``: byte-level (default), character-level over the corpus's own
alphabet, and GPT-2 BPE from local vocabulary files.

The BPE is GPT-2's algorithm (Radford et al. 2019, openai/gpt-2 ``encoder.py``): text is split by a
regex into words, each word's UTF-8 bytes are mapped to printable characters, and adjacent symbols
are merged greedily by the rank of their pair in ``vocab.bpe`` until no ranked pair is left.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    """What ``prepare`` needs: ids for a text, the end-of-text id that separates documents."""

    vocab_size: int
    eot: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are the ids 0..255; 256 is end-of-text. No vocabulary files, no unknown tokens."""

    vocab_size = 257
    eot = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class CharTokenizer:
    """The ids of the alphabet's characters in sorted order (nanoGPT's shakespeare_char ids); the next id is
    end-of-text. Saved as the alphabet in ``chars.json`` beside the shards, to decode samples."""

    FILE = "chars.json"

    def __init__(self, alphabet: str) -> None:
        self.alphabet = "".join(sorted(set(alphabet)))
        self.ids = {c: i for i, c in enumerate(self.alphabet)}
        self.vocab_size = len(self.alphabet) + 1
        self.eot = len(self.alphabet)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        return cls("".join(set().union(*map(set, texts))))

    @classmethod
    def load(cls, folder: Path) -> CharTokenizer:
        return cls(json.loads((folder / cls.FILE).read_text(encoding="utf-8"))["alphabet"])

    def save(self, folder: Path) -> Path:
        path = folder / self.FILE
        path.write_text(json.dumps({"alphabet": self.alphabet, "eot": self.eot}, ensure_ascii=False), encoding="utf-8")
        return path

    def encode(self, text: str) -> list[int]:
        try:
            return [self.ids[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer's alphabet") from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i] for i in ids if i != self.eot)


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters (whitespace becomes visible)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


# GPT-2's pre-tokenizer. \p{L}/\p{N} need the `regex` package; without it the stdlib classes below
# match the same words for all but rare characters (e.g. superscript digits count as letters).
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_STDLIB_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""


def _compile_split() -> re.Pattern[str]:
    try:
        import regex  # type: ignore[import-untyped]  # noqa: PLC0415  (optional dependency)
    except ImportError:
        return re.compile(_STDLIB_SPLIT)
    pattern: re.Pattern[str] = regex.compile(_GPT2_SPLIT)
    return pattern


class GPT2BPE:
    """GPT-2 byte-pair encoding from ``encoder.json`` (token -> id) and ``vocab.bpe`` (ranked merges)."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.encoder = encoder
        self.decoder = {i: t for t, i in encoder.items()}
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.split = _compile_split()
        self.vocab_size = max(encoder.values()) + 1
        eot = encoder.get("<|endoftext|>")
        if eot is None:
            raise ValueError("encoder.json has no '<|endoftext|>' token")
        self.eot = eot
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def from_files(cls, encoder_json: Path, vocab_bpe: Path) -> GPT2BPE:
        encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
        merges = []
        for line in vocab_bpe.read_text(encoding="utf-8").splitlines():
            if line.startswith("#version") or not line.strip():
                continue
            first, second = line.split()
            merges.append((first, second))
        return cls(encoder, merges)

    def _bpe(self, word: str) -> list[str]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [(self.ranks.get(pair, -1), i) for i, pair in enumerate(itertools.pairwise(symbols))]
            ranked = [(rank, i) for rank, i in pairs if rank >= 0]
            if not ranked:
                break
            best = min(ranked)[0]
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                # Merge every occurrence of the best pair, left to right, as GPT-2 does.
                if i + 1 < len(symbols) and self.ranks.get((symbols[i], symbols[i + 1])) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        if len(self._cache) < 100_000:
            self._cache[word] = symbols
        return symbols

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in self.split.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            for symbol in self._bpe(mapped):
                if symbol not in self.encoder:
                    raise ValueError(f"BPE produced {symbol!r}, which encoder.json does not contain")
                ids.append(self.encoder[symbol])
        return ids

    def decode(self, ids: list[int]) -> str:
        text = "".join(self.decoder[i] for i in ids if i != self.eot)
        return bytes(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")

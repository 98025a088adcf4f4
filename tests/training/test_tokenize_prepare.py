"""Byte and GPT-2 BPE tokenizers (on a hand-made vocabulary) and the offline `prepare` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from training import tokenizer as tok
from training.data import read_shard
from training.prepare import main as prepare_main
from training.prepare import prepare
from training.tokenizer import GPT2BPE, ByteTokenizer, CharTokenizer, bytes_to_unicode

MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "b c", "a b"]


@pytest.fixture
def vocab_files(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny GPT-2-format vocabulary: the 256 byte symbols, the merged tokens, end-of-text."""
    encoder = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    for merge in MERGES:
        encoder["".join(merge.split())] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    (tmp_path / "encoder.json").write_text(json.dumps(encoder))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    return tmp_path / "encoder.json", tmp_path / "vocab.bpe"


def test_byte_map_is_a_bijection_onto_printable_characters() -> None:
    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256))
    assert len(set(mapping.values())) == 256
    assert mapping[ord(" ")] == "Ġ"
    assert all(c.isprintable() for c in mapping.values())


def test_bpe_merges_by_rank_into_whole_words(vocab_files: tuple[Path, Path]) -> None:
    bpe = GPT2BPE.from_files(*vocab_files)
    ids = bpe.encode("hello world")
    assert [bpe.decoder[i] for i in ids] == ["hello", "Ġworld"]
    assert bpe.decode(ids) == "hello world"
    assert bpe.eot == bpe.vocab_size - 1


def test_bpe_applies_the_lowest_ranked_pair_first(vocab_files: tuple[Path, Path]) -> None:
    bpe = GPT2BPE.from_files(*vocab_files)
    # "b c" outranks "a b": GPT-2 gives a + bc, a left-to-right merger would give ab + c.
    assert [bpe.decoder[i] for i in bpe.encode("abc")] == ["a", "bc"]


def test_bpe_falls_back_to_bytes_and_round_trips_unicode(vocab_files: tuple[Path, Path]) -> None:
    bpe = GPT2BPE.from_files(*vocab_files)
    text = "Grüße, 世界!\n\n  x"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert len(ids) >= len(text)


def test_stdlib_pre_tokenizer_matches_gpt2s_on_common_text() -> None:
    regex = pytest.importorskip("regex")
    text = "I'm here, they'll see: 42 cats...  and\n\n  tabs\tend_of line  "
    assert re.findall(tok._STDLIB_SPLIT, text) == regex.findall(tok._GPT2_SPLIT, text)


def test_byte_tokenizer_round_trips() -> None:
    byte = ByteTokenizer()
    assert byte.encode("hé") == [104, 195, 169]
    assert byte.decode([104, 195, 169, byte.eot]) == "hé"


def test_char_tokenizer_uses_the_sorted_alphabet_and_round_trips(tmp_path: Path) -> None:
    chars = CharTokenizer.from_texts(["hello", "world!"])
    assert (chars.alphabet, chars.vocab_size, chars.eot) == ("!dehlorw", 9, 8)
    assert chars.encode("lower!") == [4, 5, 7, 2, 6, 0]
    assert chars.decode([*chars.encode("hello"), chars.eot]) == "hello"
    with pytest.raises(ValueError, match="character 'z' is not in the tokenizer's alphabet"):
        chars.encode("zed")
    chars.save(tmp_path)
    assert CharTokenizer.load(tmp_path).alphabet == chars.alphabet


def test_val_fraction_sends_the_end_of_every_document_to_validation(tmp_path: Path) -> None:
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("abcdefghij" * 10)
    (texts / "b.txt").write_text("0123456789")
    byte = ByteTokenizer()
    shards = prepare(texts, tmp_path / "out", byte, val_fraction=0.1)
    train = np.concatenate([read_shard(p) for p in shards["train"]]).tolist()
    val = np.concatenate([read_shard(p) for p in shards["val"]]).tolist()
    # The split cuts the tokens at int(n * 0.9), as nanoGPT's; validation continues the document.
    assert train == [byte.eot, *byte.encode("abcdefghij" * 9), byte.eot, *byte.encode("012345678")]
    assert val == byte.encode("abcdefghij") + byte.encode("9")
    with pytest.raises(ValueError, match="choose one validation split"):
        prepare(texts, tmp_path / "x", byte, val_every=2, val_fraction=0.1)
    with pytest.raises(ValueError, match=r"val_fraction=1.0 is invalid: use a fraction in \[0, 1\)"):
        prepare(texts, tmp_path / "x", byte, val_fraction=1.0)


def test_prepare_cli_writes_character_shards_and_their_alphabet(tmp_path: Path) -> None:
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("to be or not to be")
    assert (
        prepare_main(["--input", str(texts), "--output", str(tmp_path / "out"), "--chars", "--val-fraction", "0.5"])
        == 0
    )
    chars = CharTokenizer.load(tmp_path / "out")
    assert chars.alphabet == " benort"
    assert read_shard(tmp_path / "out" / "train_000000.bin").tolist() == [chars.eot, *chars.encode("to be or ")]
    assert chars.decode(read_shard(tmp_path / "out" / "val_000000.bin").tolist()) == "not to be"


def test_prepare_writes_train_and_val_shards_with_document_separators(tmp_path: Path) -> None:
    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    for i in range(6):
        (texts / ("sub" if i % 2 else "") / f"d{i}.txt").write_text(f"doc {i} " * 50)
    shards = prepare(texts, tmp_path / "out", ByteTokenizer(), shard_tokens=500, val_every=3)
    # Sorted documents: d0 d2 d4 sub/d1 sub/d3 sub/d5; the 3rd and 6th go to validation.
    val = np.concatenate([read_shard(p) for p in shards["val"]])
    train = np.concatenate([read_shard(p) for p in shards["train"]])
    doc = lambda i: [256, *f"doc {i} ".encode() * 50]  # noqa: E731
    assert val.tolist() == doc(4) + doc(5)
    assert train.tolist() == doc(0) + doc(2) + doc(1) + doc(3)
    assert [p.name for p in shards["train"]] == [f"train_{i:06d}.bin" for i in range(len(shards["train"]))]
    assert all(len(read_shard(p)) == 500 for p in shards["train"][:-1])


def test_prepare_cli_uses_bpe_only_with_both_vocabulary_files(tmp_path: Path, vocab_files: tuple[Path, Path]) -> None:
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("hello world")
    encoder, merges = vocab_files
    assert prepare_main(["--input", str(texts), "--output", str(tmp_path / "bpe"), "--encoder-json", str(encoder),
                         "--vocab-bpe", str(merges)]) == 0  # fmt: skip
    bpe = GPT2BPE.from_files(encoder, merges)
    assert read_shard(tmp_path / "bpe" / "train_000000.bin").tolist() == [bpe.eot, *bpe.encode("hello world")]
    with pytest.raises(SystemExit):
        prepare_main(["--input", str(texts), "--output", str(tmp_path / "x"), "--encoder-json", str(encoder)])

"""Tokenize a folder of ``.txt`` files into llm.c token shards, offline.

    python -m training.prepare --input texts/ --output shards/ [--val-every 20]
    python -m training.prepare --input texts/ --output shards/ --chars --val-fraction 0.1
    python -m training.prepare --input texts/ --output shards/ \\
        --encoder-json gpt2/encoder.json --vocab-bpe gpt2/vocab.bpe
    python -m training.prepare --sft --model-folder Llama-3.2-1B/ --input chats/ --output examples/

Each file is one document, preceded by the end-of-text token. Files are read in sorted order; every
``--val-every``-th one (the 'val-every'th, 2·val-every-th, ...) goes to ``val_NNNNNN.bin``, the others
to ``train_NNNNNN.bin``; or, with ``--val-fraction F``, the last F of every document's tokens go to
validation (nanoGPT's split of one text). Tokens are bytes by default, the corpus's own characters
with ``--chars`` (alphabet in ``chars.json``), or GPT-2 BPE. Put the output folder in the job's
``train`` channel.

With ``--sft``, every ``*.jsonl`` file of chat records (contract/sft.py) becomes a ``*.sft.safetensors`` file of
the same name: its examples tokenized with the model folder's tokenizer and chat template, each token marked
learned or not (training/sft.py). A file whose name contains 'val' validates.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from contract.sft import JSONL_SUFFIX, PREPARED_SUFFIX
from training.data import write_shard
from training.tokenizer import GPT2BPE, ByteTokenizer, CharTokenizer, Tokenizer

log = logging.getLogger("training.prepare")


class _ShardWriter:
    """Buffers tokens and writes ``<split>_<index>.bin`` every ``shard_tokens`` tokens."""

    def __init__(self, output: Path, split: str, shard_tokens: int) -> None:
        self.output, self.split, self.shard_tokens = output, split, shard_tokens
        self.chunks: list[npt.NDArray[np.int64]] = []
        self.count = 0
        self.written: list[Path] = []

    def add(self, tokens: list[int]) -> None:
        self.chunks.append(np.asarray(tokens, dtype=np.int64))
        self.count += len(tokens)
        while self.count >= self.shard_tokens:
            joined = np.concatenate(self.chunks)
            self._flush(joined[: self.shard_tokens])
            self.chunks = [joined[self.shard_tokens :]]
            self.count = len(self.chunks[0])

    def close(self) -> None:
        if self.count:
            self._flush(np.concatenate(self.chunks))
            self.chunks, self.count = [], 0

    def _flush(self, tokens: npt.NDArray[np.int64]) -> None:
        path = self.output / f"{self.split}_{len(self.written):06d}.bin"
        write_shard(path, tokens)
        self.written.append(path)


def text_files(input_dir: Path) -> list[Path]:
    """Every ``*.txt`` under ``input_dir``, in sorted order; FileNotFoundError if there is none."""
    files = sorted(p for p in input_dir.rglob("*.txt") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no .txt files under {input_dir}")
    return files


def prepare(
    input_dir: Path,
    output_dir: Path,
    tokenizer: Tokenizer,
    *,
    shard_tokens: int = 100_000_000,
    val_every: int = 0,
    val_fraction: float = 0.0,
) -> dict[str, list[Path]]:
    """Tokenize every ``*.txt`` under ``input_dir`` into shards in ``output_dir``; returns them by split."""
    if val_every and val_fraction:
        raise ValueError("choose one validation split: val_every (whole documents) or val_fraction (their ends)")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} is invalid: use a fraction in [0, 1), e.g. 0.1")
    files = text_files(input_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    writers = {split: _ShardWriter(output_dir, split, shard_tokens) for split in ("train", "val")}
    for i, path in enumerate(files):
        tokens = tokenizer.encode(path.read_text(encoding="utf-8"))
        if val_fraction:
            # The document's end continues it: validation gets no end-of-text token of its own.
            cut = int(len(tokens) * (1.0 - val_fraction))
            writers["train"].add([tokenizer.eot, *tokens[:cut]])
            writers["val"].add(tokens[cut:])
            continue
        split = "val" if val_every and (i + 1) % val_every == 0 else "train"
        writers[split].add([tokenizer.eot, *tokens])
    for writer in writers.values():
        writer.close()
    return {split: writer.written for split, writer in writers.items()}


def prepare_sft(input_dir: Path, output_dir: Path, model_folder: Path) -> list[Path]:
    """Every ``*.jsonl`` under ``input_dir`` tokenized as fine-tuning examples into ``output_dir``."""
    from training.sft import ChatTokenizer, tokenize_files  # noqa: PLC0415  (the tokenizers package)

    files = sorted(p for p in input_dir.rglob(f"*{JSONL_SUFFIX}") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no {JSONL_SUFFIX} files under {input_dir}")
    tokenizer = ChatTokenizer(model_folder)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in files:
        examples = tokenize_files([path], tokenizer)
        target = output_dir / (path.name.removesuffix(JSONL_SUFFIX) + PREPARED_SUFFIX)
        examples.save(target)
        log.info(
            "%s: %d examples, %d tokens, %d learned", target, examples.count, len(examples.tokens), examples.mask.sum()
        )
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, required=True, help="folder of .txt files (searched recursively)")
    parser.add_argument("--output", type=Path, required=True, help="folder for the .bin shards")
    parser.add_argument("--encoder-json", type=Path, help="GPT-2 encoder.json (with --vocab-bpe: GPT-2 BPE)")
    parser.add_argument("--vocab-bpe", type=Path, help="GPT-2 vocab.bpe")
    parser.add_argument(
        "--chars", action="store_true", help="character-level: the ids of the input's sorted alphabet (chars.json)"
    )
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    parser.add_argument("--sft", action="store_true", help="chat JSONL -> fine-tuning examples (needs --model-folder)")
    parser.add_argument("--model-folder", type=Path, help="the model folder whose tokenizer and chat template to use")
    splits = parser.add_mutually_exclusive_group()
    splits.add_argument("--val-every", type=int, default=0, help="send every Nth document to validation")
    splits.add_argument(
        "--val-fraction", type=float, default=0.0, help="send the last F of every document to validation, e.g. 0.1"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.sft:
        if args.model_folder is None:
            parser.error("--sft tokenizes with a model folder's tokenizer: give --model-folder")
        try:
            prepare_sft(args.input, args.output, args.model_folder)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        return 0
    if (args.encoder_json is None) != (args.vocab_bpe is None):
        parser.error("--encoder-json and --vocab-bpe go together")
    if args.chars and args.encoder_json:
        parser.error("--chars and the GPT-2 BPE files exclude each other: choose one tokenizer")
    tokenizer: Tokenizer = ByteTokenizer()
    if args.encoder_json:
        tokenizer = GPT2BPE.from_files(args.encoder_json, args.vocab_bpe)
    elif args.chars:
        chars = CharTokenizer.from_texts(p.read_text(encoding="utf-8") for p in text_files(args.input))
        args.output.mkdir(parents=True, exist_ok=True)
        log.info("alphabet of %d characters written to %s", len(chars.alphabet), chars.save(args.output))
        tokenizer = chars
    try:
        shards = prepare(
            args.input,
            args.output,
            tokenizer,
            shard_tokens=args.shard_tokens,
            val_every=args.val_every,
            val_fraction=args.val_fraction,
        )
    except ValueError as exc:
        parser.error(str(exc))
    for split, paths in shards.items():
        log.info("%s: %d shard(s) in %s", split, len(paths), args.output)
    log.info("vocabulary size %d: train with model.vocab_size >= %d", tokenizer.vocab_size, tokenizer.vocab_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())

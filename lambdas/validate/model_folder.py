"""What Validate reads of a run's model folder and fine-tuning data, with bounded reads: config.json, the index,
each shard's header (two ranged reads), tokenizer.json; the head of a few JSONL files. The judgement is
contract/model_folder.py's and contract/sft.py's, the trainer's own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from contract import model_folder as mf
from contract.layout import split_s3_uri
from contract.model_args import ModelArgs
from contract.sft import JSONL_SUFFIX, check_lines

MAX_JSON_BYTES = 64 * 2**20
"""The largest config, index or tokenizer.json Validate reads (Llama 3's tokenizer.json is 9 MB)."""
SAMPLE_FILES = 8
"""JSONL files of a dataset whose first records Validate reads."""
SAMPLE_BYTES = 2**20
"""How much of each: its first MiB, whole lines only."""


class Folder(Protocol):
    """A folder's files by name: their sizes (None: absent), byte ranges, and names."""

    def size(self, name: str) -> int | None: ...

    def read(self, name: str, offset: int, length: int) -> bytes: ...

    def names(self) -> list[str]: ...


FolderAt = Callable[[str], Folder]
"""The folder at an s3:// prefix (Validate's S3, or a local copy offline)."""


class S3Folder:
    """A prefix of a bucket, read with ranged GETs."""

    def __init__(self, s3: Any, s3_uri: str) -> None:
        self.s3 = s3
        self.bucket, self.prefix = split_s3_uri(s3_uri)

    def size(self, name: str) -> int | None:
        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=self.prefix + name)["ContentLength"])
        except self.s3.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def read(self, name: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        body = self.s3.get_object(
            Bucket=self.bucket, Key=self.prefix + name, Range=f"bytes={offset}-{offset + length - 1}"
        )["Body"]
        return bytes(body.read())

    def names(self) -> list[str]:
        found: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
        return sorted(found)


class LocalFolder:
    """A local directory (a copy of the folder, for offline checks); None: a folder with nothing in it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def size(self, name: str) -> int | None:
        file = self.path / name if self.path is not None else None
        return file.stat().st_size if file is not None and file.is_file() else None

    def read(self, name: str, offset: int, length: int) -> bytes:
        assert self.path is not None
        with (self.path / name).open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)

    def names(self) -> list[str]:
        if self.path is None:
            return []
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())


@dataclass
class ModelFolderFacts:
    """What Validate found of a model folder: the built-in model's arguments (None: refused) and every problem."""

    args: ModelArgs | None
    architecture: str | None
    problems: list[str] = field(default_factory=list)


def _json(folder: Folder, name: str, problems: list[str]) -> dict[str, Any] | None:
    size = folder.size(name)
    if size is None:
        return None
    if size > MAX_JSON_BYTES:
        problems.append(f"{name} is {size} bytes, more than Validate reads ({MAX_JSON_BYTES})")
        return None
    try:
        data = json.loads(folder.read(name, 0, size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{name} is not valid JSON: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{name} must hold a JSON object")
        return None
    return data


def inspect_model_folder(folder: Folder) -> ModelFolderFacts:
    """The folder judged as the trainer judges it (contract/model_folder.py), from its headers alone."""
    problems: list[str] = []
    config = _json(folder, mf.CONFIG_FILE, problems)
    if config is None:
        return ModelFolderFacts(None, None, [*problems, f"{mf.CONFIG_FILE} is missing: is this a model folder?"])
    try:
        mf.architecture(config)
        args = mf.model_args(config)
    except mf.ModelFolderError as exc:
        return ModelFolderFacts(None, None, [*problems, *exc.problems])
    architecture = next(name for name in config["architectures"] if name in mf.SUPPORTED_ARCHITECTURES)
    index = _json(folder, mf.INDEX_FILE, problems)
    headers: dict[str, mf.ShardHeader | None] = {}
    try:
        for file in mf.shard_files(index):
            size = folder.size(file)
            headers[file] = None if size is None else mf.read_header(functools.partial(folder.read, file), file, size)
    except mf.ModelFolderError as exc:
        problems += exc.problems
    problems += mf.check_weights(args, index, headers)
    tokenizer = _json(folder, mf.TOKENIZER_FILE, problems)
    if tokenizer is not None:
        problems += mf.check_tokenizer(args, tokenizer)
    return ModelFolderFacts(args, architecture, problems)


def jsonl_files(folder: Folder) -> list[str]:
    """The dataset's JSONL files (fine-tuning records), sorted."""
    return [name for name in folder.names() if name.endswith(JSONL_SUFFIX)]


def check_records(folder: Folder, files: list[str]) -> list[str]:
    """The problems of the first records of up to SAMPLE_FILES of the dataset's JSONL files (file, line, field)."""
    problems: list[str] = []
    for name in files[:SAMPLE_FILES]:
        size = folder.size(name) or 0
        head = folder.read(name, 0, min(size, SAMPLE_BYTES))
        lines = head.decode("utf-8", errors="replace").split("\n")
        if size > SAMPLE_BYTES:
            lines = lines[:-1]  # the last line read may be cut short
        problems += check_lines(lines, source=name)
    return problems

"""Supervised fine-tuning data: the JSONL records a run's dataset holds, parsed torch-free.

One JSON object per line, either a conversation or a prompt/response pair:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}
    {"prompt": "...", "response": "..."}

A conversation's roles are system, user and assistant (and tool); it needs at least one assistant message,
whose content is what the model learns (the loss is on the assistant's tokens only). A pair is the conversation
[user: prompt, assistant: response]. Blank lines are skipped. Validate reads a sample of a dataset's records
with `parse_record`; the trainer and `python -m training.prepare` read every record with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

JSONL_SUFFIX = ".jsonl"
PREPARED_SUFFIX = ".sft.safetensors"
"""Examples tokenized offline (`python -m training.prepare --sft`): tokens, loss mask, each example's start."""
SUFFIXES = (JSONL_SUFFIX, PREPARED_SUFFIX)
"""The files of a supervised fine-tuning dataset; a channel holds these or token shards, not both."""
ROLES = ("system", "user", "assistant", "tool")
ASSISTANT = "assistant"


class RecordError(ValueError):
    """A record that does not parse; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def parse_record(line: str, *, where: str) -> list[Message] | None:
    """The conversation on one JSONL line (None for a blank line); RecordError naming `where` and the field."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{where}: not a JSON object ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a record must be a JSON object, not {type(record).__name__}")
    if "messages" in record:
        return _messages(record["messages"], where)
    missing = [key for key in ("prompt", "response") if not isinstance(record.get(key), str)]
    if missing:
        raise RecordError(
            f"{where}: field {missing[0]!r} is missing or not a string; a record is "
            '{"messages": [...]} or {"prompt": "...", "response": "..."}'
        )
    return [Message("user", record["prompt"]), Message(ASSISTANT, record["response"])]


def _messages(messages: object, where: str) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise RecordError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    parsed = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RecordError(f"{where}: field {field!r} must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RecordError(f"{where}: field '{field}.role' is {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise RecordError(f"{where}: field '{field}.content' must be a string")
        parsed.append(Message(role, content))
    if not any(m.role == ASSISTANT for m in parsed):
        raise RecordError(f"{where}: field 'messages' has no assistant message, so nothing to learn")
    return parsed


def read_records(lines: Iterable[str], *, source: str, first_line: int = 1) -> Iterator[list[Message]]:
    """Every conversation of a JSONL text's lines; RecordError at the first that does not parse."""
    for number, line in enumerate(lines, start=first_line):
        conversation = parse_record(line, where=f"{source} line {number}")
        if conversation is not None:
            yield conversation


def check_lines(lines: Iterable[str], *, source: str, limit: int = 5) -> list[str]:
    """Up to `limit` problems with the records on these lines (each naming its line and field)."""
    problems = []
    for number, line in enumerate(lines, start=1):
        try:
            parse_record(line, where=f"{source} line {number}")
        except RecordError as exc:
            problems.append(str(exc))
            if len(problems) >= limit:
                break
    return problems

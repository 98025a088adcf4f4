"""A run's own training code (the run input's `code`): how it travels from an engineer's folder to the job's hosts.

`tp` (and `make demo`) pack the folder into one gzipped tar, named by its SHA-256, with the wheels its
requirements need inside (`WHEELHOUSE`, filled for the image's Python and platform: the training subnet reaches
no package index), and upload it write-once. Validate checks it before anything is created; the request carries
its URI and digest. The job receives it as the `CODE_CHANNEL` input channel (the one object, File mode); the
image's launcher checks its digest, unpacks it, installs the wheelhouse with no index, and runs the entry point
under torchrun (or mpirun) with SageMaker's environment, the pre-flight check, hang detection and the failure
file of the built-in trainer.

The platform's description of the code travels as hyperparameters under `CODE_PREFIX`, beside the launcher's
own settings for any job (`hang.*`, `preflight`: contract/config.py names them); the run input's other
hyperparameters are the script's own, which it receives as SageMaker's estimators pass them: `--key value`
arguments after `code.args`, and the SM_HPS / SM_HP_<KEY> environment variables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

CODE_CHANNEL = "code"
"""The input channel that holds a run's packed code (/opt/ml/input/data/code/<sha256>.tar.gz)."""
ARCHIVE_SUFFIX = ".tar.gz"
DIGEST = re.compile(r"^[0-9a-f]{64}$")
"""A packed code's SHA-256 (hex), which also names its archive: `<digest>.tar.gz`."""
MAX_ARCHIVE_BYTES = 1024**3
"""The largest packed code (its wheelhouse included) a run may name: the image brings torch and the DLC's stack."""

PACKED = ".tp/"
"""What `tp` adds to the packed folder, under this directory of the archive."""
WHEELHOUSE = f"{PACKED}wheelhouse/"
"""The wheels of the code's requirements, for `pip install --no-index --find-links` (hashes checked)."""
PACK_RECORD = f"{PACKED}pack.json"
"""What was packed: the files and their digests, the requirements file, the wheels, the Python and platform."""
IGNORE_FILE = ".tpignore"
"""Patterns (gitignore's syntax) of files in the folder that are not packed; `.gitignore` is honoured too."""

CODE_PREFIX = "code."
"""Hyperparameters under this prefix are the platform's description of the code, never the script's."""
ENTRY_POINT = "code.entry_point"
"""A script in the archive (`train.py`, `src/train.py`) or a module (`-m package.module`)."""
ARGS = "code.args"
"""The script's arguments, a JSON list of strings."""
SHA256 = "code.sha256"
"""The archive's digest, which the launcher checks before unpacking it."""
REQUIREMENTS = "code.requirements"
"""A requirements file in the archive, installed from WHEELHOUSE ("" for none)."""
RETRY_ON_EXIT_CODES = "code.retry_on_exit_codes"
"""A JSON list of the script's exit codes that are platform faults to retry on fresh instances (default none)."""

USER_CODE_FAILED = "UserCodeFailed"
"""The failure file's first word when the script itself exited non-zero: the run ends at once, never retried."""
RETRYABLE_EXIT = "RetryableExit"
"""The failure file's first word when the script exited with a status that RETRY_ON_EXIT_CODES lists: the pipeline
retries the job on fresh instances from the run's checkpoints, like a failed pre-flight check."""
COMMUNICATION_FAILED = "CommunicationFailed"
"""The failure file's first word when the script died of torch.distributed's own error (a lost peer, NCCL or EFA,
the rendezvous store): a platform fault, retried on fresh instances."""

LAUNCHER_KEYS = ("distribution", "preflight")
"""Hyperparameters the launcher reads for any job, never the script's."""
LAUNCHER_SECTIONS = ("hang.", "stragglers.")
"""Prefixes of the hyperparameters the launcher (`hang.*`) and the SDK (`stragglers.*`) read, never the script's."""
NOT_THE_SCRIPTS = ("sagemaker_", "_tuning_")
"""Prefixes of what SageMaker's SDK and tuning add to any job's hyperparameters: not passed to the script."""


class UserCodeError(ValueError):
    """The run's `code.*` hyperparameters are invalid; the message says every problem and how to fix it."""


@dataclass(frozen=True)
class EntryPoint:
    """What the job runs: a script in the packed code, or a module (`-m package.module`)."""

    script: str | None = None
    module: str | None = None

    def argv(self) -> list[str]:
        """The interpreter's arguments that run it (`train.py`, or `-m package.module`)."""
        return ["-m", str(self.module)] if self.module is not None else [str(self.script)]

    def __str__(self) -> str:
        return " ".join(self.argv())


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_entry_point(value: str) -> EntryPoint:
    """`train.py`, `src/train.py` or `-m package.module`; UserCodeError says how to write it otherwise."""
    text = value.strip()
    if text.startswith("-m ") or text.startswith("-m\t"):
        module = text[2:].strip()
        if not _MODULE.match(module):
            raise UserCodeError(f"{ENTRY_POINT}={value!r}: {module!r} is not a module name such as package.train")
        return EntryPoint(module=module)
    if not text.endswith(".py") or "\\" in text or any(part in ("", ".", "..") for part in text.split("/")):
        raise UserCodeError(
            f"{ENTRY_POINT}={value!r}: name a Python script by its path in the packed folder (train.py, "
            "src/train.py), or a module as '-m package.module'"
        )
    return EntryPoint(script=text)


@dataclass(frozen=True)
class UserCode:
    """The run's code as the launcher receives it, from the `code.*` hyperparameters."""

    entry_point: EntryPoint
    sha256: str
    args: tuple[str, ...] = ()
    requirements: str = ""
    retry_on_exit_codes: frozenset[int] = frozenset()

    @property
    def archive_name(self) -> str:
        return f"{self.sha256}{ARCHIVE_SUFFIX}"

    @classmethod
    def from_hyperparameters(cls, hyperparameters: Mapping[str, object]) -> UserCode | None:
        """The code the hyperparameters describe; None when they name no entry point (the built-in trainer)."""
        given = {key: value for key, value in hyperparameters.items() if key.startswith(CODE_PREFIX)}
        if ENTRY_POINT not in given:
            if given:
                raise UserCodeError(f"{', '.join(sorted(given))} given without {ENTRY_POINT}: name the script to run")
            return None
        problems = [f"unknown hyperparameter {key!r}" for key in sorted(set(given) - set(_KEYS))]
        values = {}
        for key, parse in _KEYS.items():
            try:
                values[key] = parse(str(given.get(key, "")))
            except UserCodeError as exc:
                problems.append(str(exc))
        if problems:
            raise UserCodeError("; ".join(problems))
        return cls(
            entry_point=values[ENTRY_POINT],
            sha256=values[SHA256],
            args=values[ARGS],
            requirements=values[REQUIREMENTS],
            retry_on_exit_codes=values[RETRY_ON_EXIT_CODES],
        )


def _sha256(raw: str) -> str:
    if not DIGEST.match(raw.strip()):
        raise UserCodeError(f"{SHA256}={raw!r} is not the packed code's SHA-256 (64 lowercase hexadecimal characters)")
    return raw.strip()


def _json_list(key: str, raw: str, kind: type, what: str) -> list[Any]:
    if not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise UserCodeError(f"{key}={raw!r} is not a JSON list of {what}")
    return value


def _args(raw: str) -> tuple[str, ...]:
    return tuple(_json_list(ARGS, raw, str, 'strings, e.g. ["--epochs", "3"]'))


def _exit_codes(raw: str) -> frozenset[int]:
    codes = _json_list(RETRY_ON_EXIT_CODES, raw, int, "exit statuses, e.g. [75]")
    if any(not 1 <= code <= 255 for code in codes):
        raise UserCodeError(f"{RETRY_ON_EXIT_CODES}={raw!r}: an exit status is between 1 and 255")
    return frozenset(codes)


def _requirements(raw: str) -> str:
    text = raw.strip()
    if text and ("\\" in text or any(part in ("", ".", "..") for part in text.split("/"))):
        raise UserCodeError(f"{REQUIREMENTS}={raw!r}: name the requirements file by its path in the packed folder")
    return text


_KEYS: dict[str, Callable[[str], Any]] = {
    ENTRY_POINT: parse_entry_point,
    SHA256: _sha256,
    ARGS: _args,
    REQUIREMENTS: _requirements,
    RETRY_ON_EXIT_CODES: _exit_codes,
}


def is_launcher_key(key: str) -> bool:
    """Whether a hyperparameter is the platform's (the code's description, the launcher's or the SDK's settings)."""
    return key.startswith((CODE_PREFIX, *LAUNCHER_SECTIONS, *NOT_THE_SCRIPTS)) or key in LAUNCHER_KEYS


def script_hyperparameters(hyperparameters: Mapping[str, object]) -> dict[str, str]:
    """The script's own hyperparameters (SageMaker's SM_HPS): all but the platform's, values as given."""
    return {key: _text(value) for key, value in hyperparameters.items() if not is_launcher_key(key)}


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)

"""The execution input's `code`: the run's own training code, checked before anything costs money.

The input names a packed archive (contract/code_archive.py) in the run's own code prefix (contract/layout.py
`run_code`) and its SHA-256, which `tp` records as it uploads it. Validate reads what it needs of the stored
archive without downloading it: its size and S3's SHA-256 checksum (`tp` uploads with one, which S3 verifies), and
the pack record at the archive's start (the files, the requirements file, the wheelhouse and what it was filled
for). It refuses, with the input's other problems, an archive that is missing, too large, not the one the input's
digest names (changed or replaced since it was packed), without the entry point or the requirements file, or whose
wheelhouse does not cover the requirements for the image's Python and platform. `tp validate` applies the same
checks to the archive it packs, read in full (contract/code_archive.py `read`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from contract import user_code
from contract.code_archive import IMAGE, CodeArchiveError, PackRecord, project_name, record_of, wheel_project
from contract.execution_state import Code
from contract.layout import code_key, split_s3_uri
from lambdas.validate.inputs import CodeInput

FIELD = "code"


@dataclass(frozen=True)
class PackedCode:
    """What Validate found of the archive `code.source` names (or `tp` of the archive it packed)."""

    size: int
    sha256: str | None
    """Its SHA-256: S3's checksum of the stored object, or the packed file's (None: stored without one)."""
    record: PackRecord | None
    """Its pack record; None when it has none that can be read (`problem` says why)."""
    problem: str = ""


def stored(s3: Any, uri: str) -> PackedCode | None:
    """The archive at `uri` as S3 holds it: its size, S3's SHA-256 of it and its pack record (None: no such
    object). Reads the archive's first member only, however large the archive is."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - the Lambda runtime's; tp imports this module too

    bucket, key = split_s3_uri(uri)
    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    size, checksum = int(head["ContentLength"]), head.get("ChecksumSHA256")
    if size > user_code.MAX_ARCHIVE_BYTES:  # not read at all
        return PackedCode(size, _hex(checksum), None)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        return PackedCode(size, _hex(checksum), record_of(body))
    except CodeArchiveError as exc:
        return PackedCode(size, _hex(checksum), None, str(exc))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        return PackedCode(size, _hex(checksum), None, f"it is not a gzipped tar archive ({exc}): pack it with tp")
    finally:
        body.close()


class CodeNotFoundError(Exception):
    """The input names the run's own packed code, and there is none there."""


def find(execution_input: dict[str, Any], *, artifacts_bucket: str, s3: Any) -> PackedCode | None:
    """What is stored of the packed code the input names, when it names the run's own (None: it names none, or
    names another place, which the checks refuse without reading it); CodeNotFoundError if it is not there."""
    try:
        code = CodeInput.model_validate(execution_input.get(FIELD))
    except ValidationError:
        return None  # the schema's problems say what is wrong with it
    run_name, team = execution_input.get("run_name"), execution_input.get("team")
    if not isinstance(run_name, str) or not isinstance(team, str | None):
        return None
    if not own_uri(code, artifacts_bucket=artifacts_bucket, run_name=run_name, team=team):
        return None
    found = stored(s3, code.source)
    if found is None:
        raise CodeNotFoundError(
            f"there is no packed code at {code.source}; start the run with `tp start --source-dir <folder>`, which "
            "packs and uploads it there"
        )
    return found


def _hex(checksum: str | None) -> str | None:
    """S3's base64 SHA-256 as hexadecimal; None for none, or a multipart object's checksum of its parts' checksums."""
    if not checksum:
        return None
    try:
        raw = base64.b64decode(checksum, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def expected_uri(artifacts_bucket: str, run_name: str, team: str | None, sha256: str) -> str:
    """Where a run's packed code of this digest must be: the run's own code prefix."""
    return f"s3://{artifacts_bucket}/{code_key(run_name, team, sha256)}"


def own_uri(code: CodeInput, *, artifacts_bucket: str, run_name: str, team: str | None) -> bool:
    """Whether `code.source` is the run's own packed code of the input's digest (only that one is read)."""
    return code.sha256 is not None and code.source == expected_uri(artifacts_bucket, run_name, team, code.sha256)


def hyperparameters(code: CodeInput) -> dict[str, str]:
    """The `code.*` hyperparameters that describe the code to the launcher (contract/user_code.py)."""
    values = {
        user_code.ENTRY_POINT: code.entry_point,
        user_code.SHA256: code.sha256 or "",
        user_code.ARGS: json.dumps(code.args),
        user_code.REQUIREMENTS: code.requirements or "",
        user_code.RETRY_ON_EXIT_CODES: json.dumps(code.retry_on_exit_codes),
    }
    # SageMaker takes no empty hyperparameter value; the launcher reads a missing one as the empty default.
    return {key: value for key, value in values.items() if value not in ("", "[]")}


def channel(uri: str) -> dict[str, Any]:
    """The `code` input channel: the one archive, on every host (File mode: /opt/ml/input/data/code/<name>)."""
    source = {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}
    return {"ChannelName": user_code.CODE_CHANNEL, "DataSource": {"S3DataSource": source}, "InputMode": "File"}


def check(
    code: CodeInput,
    packed: PackedCode | None,
    *,
    run_name: str,
    team: str | None,
    artifacts_bucket: str,
    python: str,
    platform: str,
    problems: list[str],
) -> Code | None:
    """The resolved code, or None with its problems appended (each names the `code.*` key it judges).

    `packed` is what was found of the archive (None: not looked at, as offline checks of a template do not);
    `python` and `platform` are what the image's wheels must be for ("": not judged).
    """
    before = len(problems)
    if code.sha256 is None or not user_code.DIGEST.match(code.sha256):
        problems.append(
            f"code.sha256: {code.sha256!r} is not the packed code's SHA-256 (64 lowercase hexadecimal characters);"
            " start the run with `tp start --source-dir <folder>`, which packs, uploads and records it"
        )
    elif code.source != (uri := expected_uri(artifacts_bucket, run_name, team, code.sha256)):
        problems.append(
            f"code.source {code.source!r}: a run reads only its own packed code, {uri} (the run's code prefix"
            f" {uri.rsplit('/', 1)[0]}/, named by the digest); `tp start --source-dir <folder>` uploads it there"
        )
    try:
        user_code.UserCode.from_hyperparameters({**hyperparameters(code), user_code.SHA256: "0" * 64})
    except user_code.UserCodeError as exc:  # the launcher's own reading of them
        problems.extend(f"code: {problem}" for problem in str(exc).split("; "))
    if len(problems) == before and packed is not None:
        problems.extend(archive_problems(code, packed, python=python, platform=platform))
    if len(problems) > before or code.sha256 is None:
        return None
    return Code(
        uri=code.source,
        sha256=code.sha256,
        entry_point=code.entry_point,
        args=list(code.args),
        requirements=code.requirements or "",
        retry_on_exit_codes=list(code.retry_on_exit_codes),
        size_bytes=packed.size if packed is not None else None,
    )


def archive_problems(code: CodeInput, packed: PackedCode, *, python: str, platform: str) -> list[str]:
    """What is wrong with the archive itself, for the input that names it."""
    limit = user_code.MAX_ARCHIVE_BYTES
    if packed.size > limit:
        return [
            f"code.source: the packed code is {packed.size / 2**20:.0f} MiB, over the limit of {limit / 2**20:.0f} "
            f"MiB; list data and outputs in {user_code.IGNORE_FILE} (data travels in the run's dataset)"
        ]
    if packed.sha256 is None:
        return [
            "code.source: the archive was stored without S3's SHA-256 checksum, so nothing vouches for its content;"
            " upload it with tp (or `aws s3api put-object --checksum-algorithm SHA256 --if-none-match '*'`)"
        ]
    if packed.sha256 != code.sha256:
        return [
            f"code.sha256: the stored archive's SHA-256 is {packed.sha256}, not {code.sha256}: it is not the code "
            "that was packed (it was replaced since); pack and start the run again"
        ]
    if packed.record is None:
        return [f"code.source: {packed.problem or 'the archive has no pack record'}"]
    return record_problems(code, packed.record, python=python, platform=platform)


def record_problems(code: CodeInput, record: PackRecord, *, python: str, platform: str) -> list[str]:
    """The entry point, the requirements file and the wheelhouse, against the archive's pack record."""
    problems: list[str] = []
    entry = user_code.parse_entry_point(code.entry_point)
    if not record.entry_point_found(entry):
        # The archive's other names are not listed: the input's team, whose prefix this is, is not proven yet.
        problems.append(
            f"code.entry_point: {code.entry_point!r} is not in the packed code; name a script by its path in the "
            "folder (`src/train.py`), or a module as '-m package.module'"
        )
    requirements = code.requirements or ""
    if requirements != record.requirements:
        problems.append(
            f"code.requirements: {requirements!r}, but the code was packed with "
            f"{record.requirements or 'no requirements file'!r}; pack it again with this input"
        )
        return problems
    if not requirements:
        return problems
    if record.wheels and python and (record.python, record.platform) != (python, platform):
        problems.append(
            f"code.requirements: the wheels were chosen for Python {record.python} on {record.platform}, the image "
            f"runs Python {python} on {platform}; pack again with this platform's tp (its cdk.json)"
        )
    for line, wheel in record.requires.items():
        if wheel != IMAGE and (wheel not in record.wheels or wheel_project(wheel) != _project(line)):
            problems.append(
                f"code.requirements: {line!r} has no wheel in the packed wheelhouse, and the training subnet "
                "reaches no package index; pack the code again with tp, which downloads it"
            )
    return problems


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _project(line: str) -> str:
    """A requirement's project name (PEP 503 normalized)."""
    match = _NAME.match(line)
    return project_name(match.group(1)) if match else line

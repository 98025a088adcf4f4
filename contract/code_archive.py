"""A run's packed code (contract/user_code.py): a folder packed into one archive, and the archive checked and opened.

`pack` writes `<sha256>.tar.gz`: the folder's files (minus what `.gitignore` and `.tpignore` files exclude, in
gitignore's syntax, `.git/` and `__pycache__/`), the wheels of its requirements under `WHEELHOUSE`, and the record
of it all (`PACK_RECORD`) as the archive's first entry. The archive is deterministic: the record first, then every
file in sorted order, mtime 0, owner root, mode 0644 (0755 for executables), gzip without a name or time; the same
folder and wheels give the same bytes, so the same SHA-256. `read` and `unpack` check an archive before anything
trusts it: its SHA-256 against the one the run names, its size, that it holds only regular files at plain relative
paths, and every file against the record's digest.

Stdlib only, so that `tp`, the handlers and the image's launcher share it. gitignore's matching is written here
rather than taken from `pathspec`: the contract takes no third-party dependency the image and the Lambda assets would
have to carry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from contract.user_code import (
    ARCHIVE_SUFFIX,
    DIGEST,
    IGNORE_FILE,
    MAX_ARCHIVE_BYTES,
    PACK_RECORD,
    PACKED,
    WHEELHOUSE,
    EntryPoint,
)

GITIGNORE = ".gitignore"
DEFAULT_IGNORED = (".git/", "__pycache__/")
"""Never packed, whatever the ignore files say first (a `!` pattern may re-include `__pycache__`)."""
MAX_UNPACKED_BYTES = 4 * MAX_ARCHIVE_BYTES
"""The most an archive may unpack to: a compressed archive is no licence to fill the host's disk."""
RECORD_VERSION = 1
_CHUNK = 1 << 20
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


IMAGE = "image"
"""What meets a requirement the image already holds (torch, numpy, ...): no wheel of it is packed."""


def project_name(name: str) -> str:
    """A project's name as PEP 503 compares them: `Foo_Bar.baz` is `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(file_name: str) -> str:
    """The project a wheel's file name is of (PEP 503 normalized); "" for a name that is not a wheel's."""
    match = _WHEEL.match(file_name)
    return project_name(match["name"]) if match else ""


class CodeArchiveError(ValueError):
    """A folder that cannot be packed, or an archive that must not be trusted; says what to fix."""


@dataclass(frozen=True)
class PackRecord:
    """What an archive holds (`PACK_RECORD`): the folder's files and the wheels, each with its SHA-256."""

    files: dict[str, str]
    """The folder's files (POSIX paths relative to it) -> SHA-256."""
    requirements: str = ""
    """The requirements file among `files` whose wheels are in the wheelhouse ("" for none)."""
    wheels: dict[str, str] = field(default_factory=dict)
    """Wheel file name (in WHEELHOUSE) -> SHA-256."""
    python: str = ""
    """The Python the wheels were chosen for (e.g. "3.11"); "" when there are none."""
    platform: str = ""
    """The platform tag the wheels were chosen for (e.g. "manylinux2014_x86_64"); "" when there are none."""
    requires: dict[str, str] = field(default_factory=dict)
    """Each requirement of the requirements file -> the wheel (in `wheels`) that meets it, or IMAGE."""

    def to_json(self) -> bytes:
        body = {"version": RECORD_VERSION, **self.__dict__}
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PackRecord:
        try:
            body = json.loads(raw)
            if body.pop("version") != RECORD_VERSION:
                raise ValueError(f"version {body.get('version')!r}")
            record = cls(**body)
        except (ValueError, TypeError, KeyError) as exc:
            raise CodeArchiveError(
                f"the archive's {PACK_RECORD} is not a pack record ({exc}): pack it with tp"
            ) from None
        return record

    def members(self) -> dict[str, str]:
        """Every archive member but the record -> SHA-256."""
        return {**self.files, **{f"{WHEELHOUSE}{name}": digest for name, digest in self.wheels.items()}}

    def entry_point_found(self, entry: EntryPoint) -> bool:
        """Whether the packed files hold the script, or the module (`pkg/mod.py` or `pkg/mod/__main__.py`)."""
        if entry.script is not None:
            return entry.script in self.files
        path = str(entry.module).replace(".", "/")
        return f"{path}.py" in self.files or f"{path}/__main__.py" in self.files

    def lock(self) -> str:
        """The wheelhouse as a requirements file for `pip install --require-hashes`: one pinned, hashed line per
        distribution (every wheel the packer took, the requirements' dependencies included)."""
        hashes: dict[tuple[str, str], list[str]] = {}
        for name, digest in sorted(self.wheels.items()):
            match = _WHEEL.match(name)
            assert match is not None, name  # pack() and read() accept wheel names only
            hashes.setdefault((match["name"], match["version"]), []).append(digest)
        return "".join(
            f"{name}=={version} " + " ".join(f"--hash=sha256:{d}" for d in digests) + "\n"
            for (name, version), digests in sorted(hashes.items())
        )


@dataclass(frozen=True)
class Packed:
    """An archive `pack` wrote."""

    path: Path
    sha256: str
    size: int
    record: PackRecord


# -- the ignore files --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    base: str
    """The directory (relative, POSIX; "" for the folder) of the ignore file that holds the pattern."""
    regex: re.Pattern[str]
    negate: bool
    directories_only: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.directories_only and not is_dir:
            return False
        if self.base:
            if not path.startswith(f"{self.base}/"):
                return False
            path = path[len(self.base) + 1 :]
        return self.regex.match(path) is not None


def _glob_regex(pattern: str) -> str:
    """gitignore's glob (with `**`) as a regular expression over a relative POSIX path."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body[0] in "!^" else body).replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _rules(lines: Sequence[str], base: str) -> list[_Rule]:
    """The rules of an ignore file's lines (gitignore(5)): comments, `!`, a trailing `/`, anchoring by `/`."""
    rules = []
    for raw in lines:
        line = re.sub(r"(?<!\\)\s+$", "", raw)
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        directories_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line  # a slash at the start or in the middle anchors it to the ignore file's directory
        glob = line.lstrip("/") if anchored else f"**/{line}"
        rules.append(_Rule(base, re.compile(_glob_regex(glob) + r"\Z", re.DOTALL), negate, directories_only))
    return rules


def _ignored(rules: Sequence[_Rule], path: str, is_dir: bool) -> bool:
    verdict = False
    for rule in rules:  # the last matching rule decides; deeper files' rules come later
        if rule.matches(path, is_dir):
            verdict = not rule.negate
    return verdict


def source_files(folder: Path) -> list[str]:
    """The folder's files `pack` takes (POSIX paths relative to it, sorted); CodeArchiveError lists every file
    that cannot be packed (a link out of the folder, a device, the reserved `.tp/`)."""
    root = folder.resolve()
    if not root.is_dir():
        raise CodeArchiveError(f"the code folder {folder} is not a directory")
    found: list[str] = []
    problems: list[str] = []
    _walk(root, "", _rules(DEFAULT_IGNORED, ""), found, problems)
    if problems:
        raise CodeArchiveError(
            f"the code folder {folder} cannot be packed: " + "; ".join(problems) + f" (or list them in {IGNORE_FILE})"
        )
    return sorted(found)


def _walk(root: Path, relative: str, rules: list[_Rule], found: list[str], problems: list[str]) -> None:
    directory = root / relative
    rules = [*rules, *(r for name in (GITIGNORE, IGNORE_FILE) for r in _ignore_file(directory / name, relative))]
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        path = f"{relative}/{entry.name}" if relative else entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if _ignored(rules, path, is_dir):
            continue
        if not relative and entry.name == PACKED.rstrip("/"):
            problems.append(f"{path}/ is reserved for what tp adds: rename it")
        elif entry.is_symlink():
            target = Path(entry.path).resolve()
            if not target.is_file() or not target.is_relative_to(root):
                problems.append(f"{path} is a link to {target}, outside the folder or not a file: replace it")
            else:
                found.append(path)
        elif is_dir:
            _walk(root, path, rules, found, problems)
        elif entry.is_file(follow_symlinks=False):
            found.append(path)
        else:
            problems.append(f"{path} is not a regular file")


def _ignore_file(path: Path, base: str) -> list[_Rule]:
    if not path.is_file():
        return []
    return _rules(path.read_text(errors="replace").splitlines(), base)


# -- packing -----------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _HashingWriter(io.RawIOBase):
    """The archive's file, hashed and counted as it is written."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha256, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.out.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


def _member(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o755 if executable else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(
    folder: Path,
    into: Path,
    *,
    requirements: str = "",
    wheels: Sequence[Path] = (),
    python: str = "",
    platform: str = "",
    requires: dict[str, str] | None = None,
) -> Packed:
    """Pack `folder` (and the `wheels` of its `requirements` file) into `into/<sha256>.tar.gz`."""
    files = source_files(folder)
    problems = []
    if requirements and requirements not in files:
        problems.append(f"the requirements file {requirements!r} is not among the folder's packed files")
    names = [wheel.name for wheel in wheels]
    problems += [f"{name} is not a wheel's file name" for name in names if not _WHEEL.match(name)]
    problems += [f"the wheel {name} is given twice" for name in sorted({n for n in names if names.count(n) > 1})]
    problems += [
        f"the requirement {line!r} is met by {wheel}, which is not among the wheels"
        for line, wheel in (requires or {}).items()
        if wheel != IMAGE and wheel not in names
    ]
    if problems:
        raise CodeArchiveError("; ".join(problems))
    sources = {name: folder / name for name in files}
    record = PackRecord(
        files={name: sha256_of(path) for name, path in sources.items()},
        requirements=requirements,
        wheels={wheel.name: sha256_of(wheel) for wheel in wheels},
        python=python,
        platform=platform,
        requires=dict(requires or {}),
    )
    sources.update({f"{WHEELHOUSE}{wheel.name}": wheel for wheel in wheels})
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=into, prefix=".packing-", delete=False) as raw:
        try:
            written = _write(raw, record, sources)
        except BaseException:
            os.unlink(raw.name)
            raise
    if written.size > MAX_ARCHIVE_BYTES:
        os.unlink(raw.name)
        raise CodeArchiveError(
            f"the packed code is {written.size / 2**20:.0f} MiB, over the limit of {MAX_ARCHIVE_BYTES / 2**20:.0f} "
            f"MiB: list data and outputs in {IGNORE_FILE} (data travels in the run's dataset)"
        )
    digest = written.sha256.hexdigest()
    path = into / f"{digest}{ARCHIVE_SUFFIX}"
    os.replace(raw.name, path)
    return Packed(path, digest, written.size, record)


def _write(raw: IO[bytes], record: PackRecord, sources: dict[str, Path]) -> _HashingWriter:
    hashing = _HashingWriter(raw)
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=hashing, compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        body = record.to_json()
        tar.addfile(_member(PACK_RECORD, len(body), False), io.BytesIO(body))
        for name in sorted(sources):
            path = sources[name]
            with path.open("rb") as stream:
                size = os.fstat(stream.fileno()).st_size
                tar.addfile(_member(name, size, bool(os.stat(path).st_mode & stat.S_IXUSR)), stream)
    return hashing


# -- checking and unpacking --------------------------------------------------------------------------


def _check_digest(archive: Path, sha256: str) -> None:
    if not DIGEST.match(sha256):
        raise CodeArchiveError(f"{sha256!r} is not a SHA-256 digest (64 lowercase hexadecimal characters)")
    size = archive.stat().st_size
    if size > MAX_ARCHIVE_BYTES:
        raise CodeArchiveError(
            f"the code archive {archive.name} is {size} bytes, over the limit of {MAX_ARCHIVE_BYTES}"
        )
    actual = sha256_of(archive)
    if actual != sha256:
        raise CodeArchiveError(
            f"the code archive {archive.name} has SHA-256 {actual}, not the {sha256} the run names: it changed "
            "after it was packed; nothing of it was run (pack and start the run again)"
        )


def _safe_name(name: str) -> bool:
    return "\\" not in name and all(part not in ("", ".", "..") for part in name.split("/"))


def _record(tar: tarfile.TarFile) -> tuple[tarfile.TarInfo, PackRecord]:
    """The archive's first member, and the record it holds."""
    first = tar.next()
    if first is None or first.name != PACK_RECORD or not first.isreg():
        raise CodeArchiveError(f"the code archive does not begin with {PACK_RECORD}: pack it with tp")
    stream = tar.extractfile(first)
    assert stream is not None  # a regular file
    record = PackRecord.from_json(stream.read())
    for name in record.wheels:
        if not _WHEEL.match(name) or "/" in name:
            raise CodeArchiveError(f"the pack record lists {name!r}, not a wheel's file name")
    return first, record


def record_of(stream: IO[bytes]) -> PackRecord:
    """The record at an archive's start, read from a stream without reading any further (Validate's look at a
    stored archive, whose digest S3 vouches for); CodeArchiveError if it has none."""
    with tarfile.open(fileobj=stream, mode="r|gz") as tar:
        return _record(tar)[1]


def _copy(stream: IO[bytes], target: Path | None) -> str:
    """Stream a member into `target` (None: nowhere); its SHA-256."""
    digest = hashlib.sha256()
    with open(target, "xb") if target is not None else io.BytesIO() as out:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _checked(archive: Path, sha256: str, write: Path | None) -> PackRecord:
    _check_digest(archive, sha256)
    seen: dict[str, str] = {}
    total = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            first, record = _record(tar)
            if write is not None:
                (write / PACKED).mkdir()
                (write / PACK_RECORD).write_bytes(record.to_json())
            for info in tar:
                if info is first:
                    continue
                if not info.isreg() or not _safe_name(info.name) or info.name == PACK_RECORD:
                    raise CodeArchiveError(f"the code archive holds {info.name!r}, not a regular file at a plain path")
                if info.name in seen:
                    raise CodeArchiveError(f"the code archive holds {info.name} twice")
                total += info.size
                if total > MAX_UNPACKED_BYTES:
                    raise CodeArchiveError(f"the code archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
                target = None if write is None else write / info.name
                if target is not None:
                    target.parent.mkdir(parents=True, exist_ok=True)
                stream = tar.extractfile(info)
                assert stream is not None  # a regular file
                seen[info.name] = _copy(stream, target)
                if target is not None:
                    target.chmod(0o755 if info.mode & stat.S_IXUSR else 0o644)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CodeArchiveError(f"the code archive {archive.name} cannot be read: {exc}") from None
    expected = record.members()
    if seen != expected:
        changed = sorted(n for n in set(seen) | set(expected) if seen.get(n) != expected.get(n))
        raise CodeArchiveError(f"the code archive does not match its {PACK_RECORD}: {', '.join(changed[:10])}")
    return record


def read(archive: Path, *, sha256: str) -> PackRecord:
    """Check the archive (its digest first, then every member against its record) without writing; its record."""
    return _checked(archive, sha256, None)


def unpack(archive: Path, into: Path, *, sha256: str) -> PackRecord:
    """Check the archive's digest, then unpack it into the new directory `into`, checking every file against the
    record; nothing is left in `into` if any check fails."""
    into.mkdir(parents=True)
    try:
        return _checked(archive, sha256, into)
    except BaseException:
        shutil.rmtree(into, ignore_errors=True)
        raise

"""A run's own code made ready by `tp` (and `make demo`): its wheelhouse, its archive and its upload.

The training subnet reaches no package index, so the wheels of the code's requirements travel in the archive. pip
resolves the requirements for the image's Python and platform (stacks/images.py `WheelTarget`; binary wheels only,
nothing is built), the projects the image already holds are left out with everything only they need (torch brings
gigabytes of CUDA libraries the image has), and pip downloads the rest with the hashes its resolution recorded. A
requirement with no wheel for the image is an error here, at `tp validate`, not a job that fails after its
instances start. pip's own configuration chooses the index (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, pip.conf):
a private index such as CodeArtifact works as it does for `pip install`.

The archive (contract/code_archive.py) is uploaded to the run's own code prefix (contract/layout.py) once: S3's
If-None-Match makes the put fail where an object exists, and an existing archive of the same digest is the same
code. S3 checks the SHA-256 the put carries, and Validate compares the input's digest with the one S3 stored.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement

from contract.code_archive import IMAGE, CodeArchiveError, Packed, pack, project_name, read, sha256_of
from contract.layout import split_s3_uri
from lambdas.validate.code import FIELD, PackedCode, expected_uri
from stacks.images import WheelTarget

# The last lines of pip's output that an error shows (where it says what it could not find or what conflicts),
# less its progress and its general advice.
PIP_TAIL_LINES = 8
PIP_PROGRESS = ("Looking in", "Processing", "Collecting", "Downloading", "INFO:", "Saved", "To fix", "1. ", "2. ")


class PackError(Exception):
    """The code cannot be packed for the image: the input's `field` it is about, and what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Wheelhouse:
    """The wheels a requirements file needs on the image, and which wheel meets each of its requirements."""

    wheels: list[Path]
    requires: dict[str, str]
    """Each requirement line -> the wheel's file name, or IMAGE when the image holds the project."""


def _environment(target: WheelTarget) -> dict[str, str]:
    """The image's marker environment (PEP 508), for the requirements' `; python_version < ...` conditions."""
    return {
        "python_version": target.python,
        "python_full_version": f"{target.python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": target.architecture,
    }


def requirement_lines(path: Path, target: WheelTarget) -> dict[str, Requirement]:
    """The requirements of a requirements file that apply on the image, by their line; PackError lists every line
    that is not a project's name (options, paths and URLs cannot be had as wheels for another machine)."""
    found: dict[str, Requirement] = {}
    problems: list[str] = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            requirement = None
        if requirement is None or requirement.url:
            problems.append(f"{path.name}:{number} {line!r}")
            continue
        if requirement.marker is None or requirement.marker.evaluate(_environment(target)):
            found[line] = requirement
    if problems:
        raise PackError(
            "code.requirements",
            f"{', '.join(problems)} cannot be had as wheels for the image; list projects by name "
            "and version (e.g. transformers==4.46.0), one a line",
        )
    return found


def _pip(arguments: list[str], what: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *arguments],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        said = [
            line.strip()
            for line in (result.stdout + result.stderr).splitlines()
            if line.strip() and not line.lstrip().startswith(PIP_PROGRESS)
        ]
        raise PackError("code.requirements", f"{what} (pip said: {' | '.join(said[-PIP_TAIL_LINES:])})")


def fill_wheelhouse(
    requirements: Path, target: WheelTarget, *, provided: Mapping[str, str | None], into: Path
) -> Wheelhouse:
    """Download into `into` the wheels `requirements` needs on the image beyond what it holds (`provided`: project
    name -> its version there, None where any is taken as it is)."""
    lines = requirement_lines(requirements, target)
    if all(project_name(r.name) in provided for r in lines.values()):
        return Wheelhouse([], _held(lines, provided))  # nothing to resolve: no index is asked
    where = f"for Python {target.python} on {target.platform}"
    with tempfile.TemporaryDirectory(prefix="tp-wheels-") as scratch:
        constraints = Path(scratch, "image.txt")
        # A local version (`2.14.1+cpu`) is on no index: what needs it meets it in the image, unconstrained.
        pins = {name: version for name, version in provided.items() if version and "+" not in version}
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
        report = Path(scratch, "report.json")
        _pip(
            [
                *("install", "--dry-run", "--ignore-installed", "--report", str(report)),
                *("--target", str(Path(scratch, "target")), *target.pip_options()),
                *("-c", str(constraints), "-r", str(requirements)),
            ],
            f"pip finds no wheels {where} that meet them beside what the image holds ("
            + ", ".join(f"{name} {version}" if version else name for name, version in provided.items())
            + "); a project without such a wheel cannot travel with the code (the training subnet reaches no index)",
        )
        resolved = {project_name(item["metadata"]["name"]): item for item in json.loads(report.read_text())["install"]}
        needed = _needed(lines, resolved, provided, target)
        locked = Path(scratch, "locked.txt")
        locked.write_text("".join(f"{_pin(resolved[name])}\n" for name in sorted(needed)))
        into.mkdir(parents=True, exist_ok=True)
        if needed:
            _pip(
                [
                    "download",
                    "--no-deps",
                    "--require-hashes",
                    "-r",
                    str(locked),
                    "-d",
                    str(into),
                    *target.pip_options(),
                ],
                f"the wheels {where} could not be downloaded",
            )
    wheels = {name: into / _wheel_of(resolved[name]) for name in needed}
    for name, wheel in wheels.items():
        if not wheel.is_file() or sha256_of(wheel) != _sha256(resolved[name]):
            raise PackError("code.requirements", f"the downloaded {wheel.name} is not the wheel pip resolved")
    requires = {
        line: IMAGE if project_name(r.name) in provided else wheels[project_name(r.name)].name
        for line, r in lines.items()
    }
    return Wheelhouse(sorted(wheels.values()), requires)


def _held(lines: Mapping[str, Requirement], provided: Mapping[str, str | None]) -> dict[str, str]:
    """Requirements the image alone meets, each as IMAGE; PackError where it holds another version than one asks."""
    wrong = [
        f"{line!r} (the image holds {version})"
        for line, r in lines.items()
        if (version := provided[project_name(r.name)]) and not r.specifier.contains(version, prereleases=True)
    ]
    if wrong:
        raise PackError("code.requirements", f"{', '.join(wrong)}: require what the image holds, or drop the line")
    return dict.fromkeys(lines, IMAGE)


def _needed(
    lines: Mapping[str, Requirement],
    resolved: Mapping[str, Any],
    provided: Mapping[str, str | None],
    target: WheelTarget,
) -> set[str]:
    """The projects to download: the requirements and what they need in turn, stopping at what the image holds."""
    needed: set[str] = set()
    queue = [(project_name(r.name), frozenset(r.extras)) for r in lines.values()]
    while queue:
        name, extras = queue.pop()
        if name in provided or name in needed:
            continue
        if name not in resolved:
            raise PackError("code.requirements", f"pip's resolution holds no {name}, which a requirement needs")
        needed.add(name)
        for text in resolved[name]["metadata"].get("requires_dist") or []:
            dependency = Requirement(text)
            if dependency.marker is None or any(_applies(dependency.marker, target, extra) for extra in ("", *extras)):
                queue.append((project_name(dependency.name), frozenset(dependency.extras)))
    return needed


def _applies(marker: Marker, target: WheelTarget, extra: str) -> bool:
    return marker.evaluate({**_environment(target), "extra": extra})


def _wheel_of(item: Mapping[str, Any]) -> str:
    return str(item["download_info"]["url"]).rsplit("/", 1)[-1]


def _sha256(item: Mapping[str, Any]) -> str:
    return str(item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256", ""))


def _pin(item: Mapping[str, Any]) -> str:
    """A resolved project as a hashed requirement line: exactly the wheel the resolution chose."""
    metadata = item["metadata"]
    return f"{metadata['name']}=={metadata['version']} --hash=sha256:{_sha256(item)}"


def pack_code(
    folder: Path,
    into: Path,
    *,
    requirements: str | None,
    target: WheelTarget,
    provided: Mapping[str, str | None],
) -> Packed:
    """The folder packed with the wheelhouse of its requirements file (a path in it) for the image, into `into`."""
    wheelhouse = Wheelhouse([], {})
    if requirements:
        path = folder / requirements
        if not path.is_file():
            raise PackError("code.requirements", f"{requirements!r} is not a file in {folder}")
        wheelhouse = fill_wheelhouse(path, target, provided=provided, into=into / "wheelhouse")
    try:
        return pack(
            folder,
            into,
            requirements=requirements or "",
            wheels=wheelhouse.wheels,
            python=target.python if wheelhouse.wheels else "",
            platform=target.platform if wheelhouse.wheels else "",
            requires=wheelhouse.requires,
        )
    except CodeArchiveError as exc:
        raise PackError("code.source", str(exc)) from None


def upload(s3: Any, packed: Packed, uri: str) -> bool:
    """Put the archive at `uri` once, with its SHA-256 for S3 to check; True if it was written, False if the same
    archive was there already. PackError when another object holds the key."""
    from botocore.exceptions import ClientError  # noqa: PLC0415

    bucket, key = split_s3_uri(uri)
    checksum = base64.b64encode(bytes.fromhex(packed.sha256)).decode()
    try:
        with packed.path.open("rb") as body:
            # One PutObject (the archive is within S3's 5 GB for one): the bucket refuses parts in the code prefix.
            s3.put_object(
                Bucket=bucket, Key=key, Body=body, IfNoneMatch="*", ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum
            )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise
        existing = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED").get("ChecksumSHA256")
        if existing != checksum:
            raise PackError(
                "code.source",
                f"{uri} holds another archive than this code's (SHA-256 {packed.sha256}); the code "
                "prefix is written once: ask the platform team, who may remove it",
            ) from None
        return False
    return True


# -- an execution input's code -------------------------------------------------------------------------


def code_folder(execution_input: Any, input_dir: Path, source_dir: Path | None) -> Path | None:
    """The folder to pack for the input: `source_dir` (`--source-dir`), or `code.source` when it names a local folder
    (relative to `input_dir`, the input file's); None when the input names code uploaded already, or none."""
    code = execution_input.get(FIELD) if isinstance(execution_input, dict) else None
    if source_dir is not None:
        if not isinstance(code, dict):
            raise PackError(FIELD, "--source-dir packs your folder as the input's code; give `code` its entry_point")
        return source_dir
    source = code.get("source") if isinstance(code, dict) else None
    if isinstance(source, str) and not source.startswith("s3://"):
        return input_dir / source
    return None


def packed_input(
    execution_input: dict[str, Any],
    folder: Path,
    into: Path,
    *,
    artifacts_bucket: str,
    target: WheelTarget,
    provided: Mapping[str, str | None],
) -> tuple[dict[str, Any], Packed]:
    """The input with its code's folder packed into `into`: `code.source` the archive's place in the run's own code
    prefix, `code.sha256` its digest."""
    code = execution_input[FIELD]
    requirements = code.get("requirements")
    if requirements is not None and not isinstance(requirements, str):
        raise PackError("code.requirements", f"{requirements!r} must name a file in the folder, e.g. requirements.txt")
    packed = pack_code(folder, into, requirements=requirements, target=target, provided=provided)
    return at(execution_input, artifacts_bucket, packed.sha256), packed


def at(execution_input: dict[str, Any], artifacts_bucket: str, sha256: str) -> dict[str, Any]:
    """The input naming the packed code of `sha256` in the run's own code prefix."""
    run_name, team = execution_input.get("run_name"), execution_input.get("team")
    uri = expected_uri(artifacts_bucket, str(run_name), team if isinstance(team, str) else None, sha256)
    return {**execution_input, FIELD: {**execution_input[FIELD], "source": uri, "sha256": sha256}}


def found(packed: Packed) -> PackedCode:
    """What Validate's checks read of an archive, from the packed file, checked in full against its record."""
    return PackedCode(size=packed.size, sha256=sha256_of(packed.path), record=read(packed.path, sha256=packed.sha256))

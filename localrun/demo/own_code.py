"""`make demo` of an input whose `code.source` is a local folder: packed and uploaded as `tp start` does, its data
made by the folder's own `make_data.py`.

The local "image" is this machine's interpreter, which the local hosts run: the wheels are chosen for its Python
and platform (the local Validate holds them to it), and what it has installed is left out of them. The archive
goes to the run's own code prefix in the local artifacts bucket, written once, and the input names it by its
digest, so Validate, the job and the lineage see what they see in AWS. A folder with a `make_data.py` makes the
run's data: `python make_data.py --out <folder>` writes it into the folder, which is uploaded to the run's dataset
(the examples under examples/own-code/ each generate theirs); without one, the dataset is what the datasets bucket
holds.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3

from contract.code_archive import project_name
from contract.layout import split_s3_uri
from lambdas.validate.limits import CODE_PLATFORM_ENV, CODE_PYTHON_ENV
from localrun.aws.cfn import REGION
from localrun.aws.engine import LocalPlatform
from localrun.demo.report import StandIn
from stacks.images import WheelTarget
from tools import code_pack

MAKE_DATA = "make_data.py"
"""A code folder's data maker, run by the demo as `python make_data.py --out <folder>`."""
FSX_DATASETS = "fsx:///datasets/"


def local_folder(execution_input: dict[str, Any], input_dir: Path) -> Path | None:
    """The local folder the input's `code.source` names (relative to `input_dir`, the input file's), or None."""
    return code_pack.code_folder(execution_input, input_dir, None)


def local_target() -> WheelTarget:
    """This machine's interpreter as the image the local hosts run."""
    libc, version = platform.libc_ver()
    minor = int(version.split(".")[1]) if libc == "glibc" else 17
    return WheelTarget(
        python=f"{sys.version_info.major}.{sys.version_info.minor}", glibc_minor=minor, architecture=platform.machine()
    )


def local_image() -> dict[str, str | None]:
    """What this interpreter has installed, by project: the local image holds it."""
    return {project_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def run_here(platform: LocalPlatform) -> StandIn:
    """Hold the wheels of a run's own code to this machine's interpreter, which the local hosts run in place of the
    image: Validate's image Python and platform become its own. What was replaced, for the report."""
    variables = platform.functions.named("Validate").resource["Properties"]["Environment"]["Variables"]
    image = f"Python {variables[CODE_PYTHON_ENV]} on {variables[CODE_PLATFORM_ENV]}"
    here = local_target()
    variables[CODE_PYTHON_ENV], variables[CODE_PLATFORM_ENV] = here.python, here.platform
    return StandIn("the image's Python", image, f"Python {here.python} on {here.platform} (this machine's)")


def upload(
    execution_input: dict[str, Any], folder: Path, workdir: Path, *, artifacts_bucket: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """The input naming its code in the run's own code prefix of the local artifacts bucket, packed and uploaded
    there as `tp start --source-dir` does."""
    ready, packed = code_pack.packed_input(
        execution_input,
        folder,
        workdir,
        artifacts_bucket=artifacts_bucket,
        target=local_target(),
        provided=local_image(),
    )
    code_pack.upload(boto3.client("s3", region_name=REGION), packed, ready["code"]["source"])
    wheels = f"{len(packed.record.wheels)} wheel{'' if len(packed.record.wheels) == 1 else 's'}"
    say(f"packed {folder} ({packed.size:,} bytes, {wheels}) to {ready['code']['source']}")
    return ready


def seed(
    execution_input: dict[str, Any], folder: Path, workdir: Path, *, datasets_bucket: str, say: Callable[[str], None]
) -> str:
    """Make the run's data with the folder's `make_data.py` and put it where the input's `dataset` points; what it
    is, for the report."""
    maker = folder / MAKE_DATA
    if not maker.is_file():
        say(f"{folder} has no {MAKE_DATA}: the run reads what its dataset holds")
        return "what the dataset holds"
    data = workdir / "data"
    subprocess.run([sys.executable, str(maker), "--out", str(data)], check=True, cwd=folder)
    prefix = _prefix(str(execution_input.get("dataset", "")), datasets_bucket)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    s3 = boto3.client("s3", region_name=REGION)
    for path in files:
        s3.upload_file(str(path), datasets_bucket, prefix + path.relative_to(data).as_posix())
    say(f"seeded s3://{datasets_bucket}/{prefix} with {len(files)} files from {maker}")
    return f"{len(files)} files made by {folder.name}/{MAKE_DATA}"


def _prefix(uri: str, datasets_bucket: str) -> str:
    """The datasets bucket's prefix an input's dataset names (FSx reads the bucket's same path)."""
    if uri.startswith(FSX_DATASETS):
        return uri.removeprefix(FSX_DATASETS).strip("/") + "/"
    bucket, key = split_s3_uri(uri)
    if bucket != datasets_bucket:
        raise ValueError(f"dataset {uri!r} is not in the local datasets bucket {datasets_bucket}")
    return key.strip("/") + "/"

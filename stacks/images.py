"""Resolve the SageMaker PyTorch training DLC that the platform image builds on, offline.

The SageMaker SDK's own image URI table (shipped in sagemaker-core) is the source. Reading
the JSON directly, instead of importing `sagemaker.core.image_uris`, keeps synth fast: the
SDK import costs seconds; tests check this resolution against `image_uris.retrieve`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from contract.code_archive import project_name

_TABLE = "sagemaker/core/image_uri_config/pytorch.json"
IMAGE_EXTRAS = Path(__file__).resolve().parents[1] / "training" / "requirements.txt"
"""What the image installs over the DLC (training/Dockerfile)."""


class ImageTableError(ValueError):
    """The requested framework/Python/region is not in the SDK's table."""


IMAGE_GLIBC_MINOR = 35
"""The C library the DLCs run (Ubuntu 22.04's glibc 2.35, or a newer one): a run's own code's wheels are chosen for
it, so that they load on every DLC the image may build on."""
IMAGE_ARCHITECTURE = "x86_64"
"""The GPU training DLCs' machine."""
_OLDEST_MANYLINUX = 17  # manylinux2014, below which no wheel of a current Python is built
_LEGACY_MANYLINUX = {17: "manylinux2014"}


@dataclass(frozen=True)
class WheelTarget:
    """What a run's own code's wheels must install on: the image's Python and platform (pip's --python-version,
    --platform, --implementation and --abi, for a machine other than the one pip runs on)."""

    python: str
    """`major.minor`, e.g. "3.12"."""
    glibc_minor: int = IMAGE_GLIBC_MINOR
    architecture: str = IMAGE_ARCHITECTURE

    @property
    def platform(self) -> str:
        """The newest manylinux tag the platform runs, e.g. "manylinux_2_35_x86_64" (what the pack record names)."""
        return f"manylinux_2_{self.glibc_minor}_{self.architecture}"

    def platforms(self) -> list[str]:
        """Every manylinux tag the platform runs, newest first: pip expands no manylinux tag to older ones for another
        machine, so each is given."""
        tags = []
        for minor in range(self.glibc_minor, _OLDEST_MANYLINUX - 1, -1):
            tags.append(f"manylinux_2_{minor}_{self.architecture}")
            if minor in _LEGACY_MANYLINUX:
                tags.append(f"{_LEGACY_MANYLINUX[minor]}_{self.architecture}")
        return tags

    def pip_options(self) -> list[str]:
        """pip's options that choose wheels for this target (binary wheels only: nothing is built for it)."""
        abi = "cp" + self.python.replace(".", "")
        platforms = [option for tag in self.platforms() for option in ("--platform", tag)]
        return [
            "--only-binary=:all:",
            "--python-version",
            self.python,
            "--implementation",
            "cp",
            "--abi",
            abi,
            *platforms,
        ]


@dataclass(frozen=True)
class BaseImage:
    account: str
    region: str
    repository: str
    tag: str

    @property
    def registry(self) -> str:
        domain = "amazonaws.com.cn" if self.region.startswith("cn-") else "amazonaws.com"
        return f"{self.account}.dkr.ecr.{self.region}.{domain}"

    @property
    def uri(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"

    @property
    def provides(self) -> dict[str, str | None]:
        """The projects the image holds (PEP 503 names -> version; None: the DLC's own, not known here): the DLC's
        PyTorch stack and the platform's extras (training/requirements.txt). A run's own code's wheels leave them
        out, with everything only they need."""
        held: dict[str, str | None] = {"torch": self.tag.split("-", 1)[0], "torchvision": None, "torchaudio": None}
        held["numpy"] = None
        for line in IMAGE_EXTRAS.read_text().splitlines():
            name, pinned, version = line.split("#", 1)[0].strip().partition("==")
            if pinned:
                held[project_name(name)] = version
        return held

    @property
    def wheel_target(self) -> WheelTarget:
        """The Python and platform of the image (its tag ends in the DLC's Python, e.g. `-py312`)."""
        digits = self.tag.rsplit("-py", 1)[1]
        return WheelTarget(python=f"{digits[0]}.{digits[1:]}")


@functools.cache
def _training_table() -> dict[str, Any]:
    path = Path(str(metadata.distribution("sagemaker-core").locate_file(_TABLE)))
    table: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["training"]
    return table


def resolve_base_image(version: str, py_version: str | None, region: str) -> BaseImage:
    """The GPU training DLC for `version` (e.g. "2.10.0" or "2.10") in `region`."""
    table = _training_table()
    full = table.get("version_aliases", {}).get(version, version)
    entry = table["versions"].get(full)
    if entry is None:
        known = ", ".join(table["versions"])
        raise ImageTableError(f"PyTorch {version!r} has no SageMaker training DLC; known versions: {known}")
    pys: list[str] = entry["py_versions"]
    py = py_version or pys[-1]
    if py not in pys:
        raise ImageTableError(f"PyTorch {full} DLCs exist for {', '.join(pys)}, not {py!r}")
    account = entry["registries"].get(region)
    if account is None:
        raise ImageTableError(
            f"no PyTorch {full} training DLC registry in region {region!r}; "
            f"regions: {', '.join(sorted(entry['registries']))}"
        )
    return BaseImage(account=account, region=region, repository=entry["repository"], tag=f"{version}-gpu-{py}")

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

_TABLE = "sagemaker/core/image_uri_config/pytorch.json"


class ImageTableError(ValueError):
    """The requested framework/Python/region is not in the SDK's table."""


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

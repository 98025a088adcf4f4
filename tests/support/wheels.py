"""Small wheels built on the spot, and pip pointed at them alone: the tests' package index, with no network."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest


def wheel(folder: Path, name: str, version: str, requires: Sequence[str] = (), tag: str = "py3-none-any") -> Path:
    """A wheel of one empty package, whose metadata requires `requires` (PEP 508 lines)."""
    folder.mkdir(parents=True, exist_ok=True)
    package = name.replace("-", "_")
    dist = f"{package}-{version}"
    extras = sorted({extra for line in requires for extra in re.findall(r"extra == '([^']+)'", line)})
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Provides-Extra: {extra}\n" for extra in extras)
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    described = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    files = {
        f"{package}/__init__.py": b"",
        f"{dist}.dist-info/METADATA": metadata.encode(),
        f"{dist}.dist-info/WHEEL": described.encode(),
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    path = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def only_these_wheels(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """pip (in this process's children) finds wheels in `folder` only: no index, no machine-wide configuration."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)

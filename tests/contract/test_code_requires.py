"""What a pack record says of the requirements (which wheel meets each), and reading the record alone from a stream."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from contract.code_archive import IMAGE, CodeArchiveError, pack, project_name, read, record_of, wheel_project


def _wheel(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"not really a zip, but named as a wheel is" * 1000)
    return path


def test_the_record_names_the_wheel_or_the_image_that_meets_each_requirement(tmp_path: Path) -> None:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("print(1)\n")
    (folder / "requirements.txt").write_text("tokenizers==0.21\ntorch\n")
    wheel = _wheel(tmp_path / "wheels", "tokenizers-0.21.0-cp39-abi3-manylinux_2_17_x86_64.whl")
    requires = {"tokenizers==0.21": wheel.name, "torch": IMAGE}
    packed = pack(
        folder,
        tmp_path / "out",
        requirements="requirements.txt",
        wheels=[wheel],
        python="3.13",
        platform="manylinux_2_35_x86_64",
        requires=requires,
    )
    assert packed.record.requires == requires
    assert read(packed.path, sha256=packed.sha256).requires == requires  # what the archive says, read back

    with pytest.raises(CodeArchiveError, match=r"'numpy' is met by numpy-2\.whl, which is not among the wheels"):
        pack(folder, tmp_path / "out2", requirements="requirements.txt", requires={"numpy": "numpy-2.whl"})


class _Bounded(io.RawIOBase):
    """A stream that fails if more than `limit` bytes of it are read: the reader must stop early."""

    def __init__(self, data: bytes, limit: int) -> None:
        self._data, self._limit, self.read_bytes = data, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data[self.read_bytes : self.read_bytes + min(len(buffer), 8192)]
        self.read_bytes += len(chunk)
        assert self.read_bytes <= self._limit, (
            f"read {self.read_bytes} bytes of an archive whose record is at its start"
        )
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_the_record_is_read_from_the_archives_start_without_reading_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("print(1)\n")
    (folder / "data.bin").write_bytes(os.urandom(10 * 2**20))  # 10 MiB that gzip cannot shrink
    packed = pack(folder, tmp_path / "out")
    data = packed.path.read_bytes()
    stream = _Bounded(data, limit=256 * 1024)
    assert record_of(io.BufferedReader(stream)) == packed.record
    assert stream.read_bytes < len(data) // 10

    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("train.py"), io.BytesIO(b""))
    with pytest.raises(CodeArchiveError, match="does not begin with"):
        record_of(io.BytesIO(raw.getvalue()))


def test_project_names_compare_as_pep_503_says() -> None:
    assert project_name("Foo_Bar.baz") == "foo-bar-baz"
    assert wheel_project("Foo_Bar-1.0-py3-none-any.whl") == "foo-bar"
    assert wheel_project("not-a-wheel.tar.gz") == ""

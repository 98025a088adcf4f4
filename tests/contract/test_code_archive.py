"""A run's packed code (contract/code_archive.py): packed deterministically, any archive it cannot trust refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from contract import code_archive
from contract.code_archive import CodeArchiveError, PackRecord, pack, read, source_files, unpack
from contract.user_code import PACK_RECORD, WHEELHOUSE, parse_entry_point


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _project(root: Path) -> Path:
    return _tree(
        root,
        {
            "train.py": "print('train')\n",
            "pkg/__init__.py": "",
            "pkg/model.py": "X = 1\n",
            "requirements.txt": "tokenizers\n",
            ".gitignore": "*.log\n/build\ndata/\n!keep.log\n# a comment\n\n",
            "run.log": "noise",
            "keep.log": "kept",
            "build/out.bin": "x",
            "pkg/build/kept.txt": "a 'build' below the top is not /build",
            "pkg/data/ignored.csv": "a directory named data at any depth",
            "pkg/.gitignore": "secret.txt\n",
            "pkg/secret.txt": "ignored by pkg/.gitignore",
            "secret.txt": "the nested rule does not reach up",
            ".tpignore": "notes/**\n!notes/keep.md\n*.log\n",
            "notes/a.md": "ignored",
            "notes/keep.md": "re-included below notes/, which itself is not ignored",
            ".git/HEAD": "ref: refs/heads/main",
            "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
        },
    )


def test_the_ignore_files_decide_what_is_packed_as_gitignore_would(tmp_path: Path) -> None:
    assert source_files(_project(tmp_path)) == [
        ".gitignore",
        ".tpignore",
        "notes/keep.md",
        "pkg/.gitignore",
        "pkg/__init__.py",
        "pkg/build/kept.txt",
        "pkg/model.py",
        "requirements.txt",
        "secret.txt",
        "train.py",
    ]  # keep.log: .tpignore's *.log comes after .gitignore's !keep.log, so it wins


def test_the_same_folder_packs_to_the_same_bytes_whatever_its_times_owner_or_place(tmp_path: Path) -> None:
    first = _project(tmp_path / "a")
    (first / "train.py").chmod(0o755)
    one = pack(first, tmp_path / "out1")
    second = tmp_path / "elsewhere" / "b"
    shutil.copytree(first, second)
    for path in second.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    two = pack(second, tmp_path / "out2")
    assert one.sha256 == two.sha256 == hashlib.sha256(one.path.read_bytes()).hexdigest()
    assert one.path.name == f"{one.sha256}.tar.gz" and one.path.read_bytes() == two.path.read_bytes()
    (second / "train.py").write_text("print('changed')\n")
    assert pack(second, tmp_path / "out3").sha256 != one.sha256
    with tarfile.open(one.path) as tar:
        members = tar.getmembers()
    assert members[0].name == PACK_RECORD
    assert [m.name for m in members[1:]] == sorted(m.name for m in members[1:])
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(0, 0, 0, "")}
    assert {m.name: m.mode for m in members}["train.py"] == 0o755
    assert {m.name: m.mode for m in members}["pkg/model.py"] == 0o644


def test_an_archive_unpacks_to_the_folder_and_its_wheels_with_a_hashed_lock(tmp_path: Path) -> None:
    folder = _project(tmp_path / "src")
    wheels = [
        _tree(tmp_path / "w", {"tokenizers-0.22.1-cp39-abi3-manylinux_2_17_x86_64.whl": "wheel one"})
        / "tokenizers-0.22.1-cp39-abi3-manylinux_2_17_x86_64.whl",
        _tree(tmp_path / "w", {"tqdm-4.67.1-py3-none-any.whl": "wheel two"}) / "tqdm-4.67.1-py3-none-any.whl",
    ]
    packed = pack(folder, tmp_path / "out", requirements="requirements.txt", wheels=wheels, python="3.11")
    record = unpack(packed.path, tmp_path / "code", sha256=packed.sha256)
    assert record == packed.record == read(packed.path, sha256=packed.sha256)
    assert (tmp_path / "code" / "pkg" / "model.py").read_text() == "X = 1\n"
    assert (tmp_path / "code" / WHEELHOUSE / wheels[0].name).read_text() == "wheel one"
    assert sorted(
        p.relative_to(tmp_path / "code").as_posix() for p in (tmp_path / "code").rglob("*") if p.is_file()
    ) == (sorted([*record.files, PACK_RECORD, *(f"{WHEELHOUSE}{w.name}" for w in wheels)]))
    digest = hashlib.sha256(b"wheel one").hexdigest()
    assert record.lock().splitlines() == [
        f"tokenizers==0.22.1 --hash=sha256:{digest}",
        f"tqdm==4.67.1 --hash=sha256:{hashlib.sha256(b'wheel two').hexdigest()}",
    ]
    assert record.entry_point_found(parse_entry_point("train.py"))
    assert record.entry_point_found(parse_entry_point("-m pkg.model"))
    assert not record.entry_point_found(parse_entry_point("-m pkg.missing"))
    assert not record.entry_point_found(parse_entry_point("notes/a.py"))


def test_a_tampered_archive_is_refused_and_nothing_of_it_is_unpacked(tmp_path: Path) -> None:
    packed = pack(_project(tmp_path / "src"), tmp_path / "out")
    raw = bytearray(packed.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    packed.path.write_bytes(bytes(raw))
    with pytest.raises(CodeArchiveError, match=f"not the {packed.sha256} the run names"):
        unpack(packed.path, tmp_path / "code", sha256=packed.sha256)
    assert not (tmp_path / "code").exists()
    with pytest.raises(CodeArchiveError, match="is not a SHA-256"):
        read(packed.path, sha256="abc")


def _hand_made(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> str:
    """An archive written by hand (not by `pack`), and its digest: what a forged upload could hold."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info, body in members:
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def test_an_archive_whose_files_do_not_match_its_record_or_leave_the_folder_is_refused(tmp_path: Path) -> None:
    record = PackRecord(files={"train.py": hashlib.sha256(b"print(1)").hexdigest()}).to_json()
    cases = {
        "does not match its": [(tarfile.TarInfo("train.py"), b"print(2)")],
        "not a regular file at a plain path": [(tarfile.TarInfo("../train.py"), b"print(1)")],
        "holds train.py twice": [(tarfile.TarInfo("train.py"), b"print(1)")] * 2,
    }
    link = tarfile.TarInfo("train.py")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    cases["not a regular file"] = [(link, b"")]
    for message, members in cases.items():
        archive = tmp_path / "forged.tar.gz"
        digest = _hand_made(archive, [(tarfile.TarInfo(PACK_RECORD), record), *members])
        with pytest.raises(CodeArchiveError, match=message):
            unpack(archive, tmp_path / "code", sha256=digest)
        assert not (tmp_path / "code").exists(), message
    digest = _hand_made(archive, [(tarfile.TarInfo("train.py"), b"print(1)")])
    with pytest.raises(CodeArchiveError, match="does not begin with"):
        read(archive, sha256=digest)


def test_every_problem_of_a_folder_is_named_at_once(tmp_path: Path) -> None:
    folder = _tree(tmp_path / "src", {"train.py": "", ".tp/x": ""})
    (folder / "secrets").symlink_to(Path.home())
    (folder / "inside.py").symlink_to(folder / "train.py")
    with pytest.raises(CodeArchiveError) as raised:
        source_files(folder)
    assert ".tp/ is reserved" in str(raised.value) and "secrets is a link to" in str(raised.value)
    (folder / "secrets").unlink()
    shutil.rmtree(folder / ".tp")
    assert source_files(folder) == ["inside.py", "train.py"]  # a link inside the folder packs as its file
    with pytest.raises(CodeArchiveError) as raised:
        pack(folder, tmp_path / "out", requirements="requirements.txt", wheels=[folder / "train.py"])
    assert "requirements.txt" in str(raised.value) and "train.py is not a wheel" in str(raised.value)


def test_a_folder_over_the_size_limit_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _tree(tmp_path / "src", {"train.py": "", "data.bin": os.urandom(4096).hex()})
    monkeypatch.setattr(code_archive, "MAX_ARCHIVE_BYTES", 1024)
    with pytest.raises(CodeArchiveError, match=r"over the limit.*tpignore"):
        pack(folder, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []

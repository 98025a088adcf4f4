"""A checkpoint planted in a run's prefix, or changed after its commit, is refused before anything unpickles it."""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import os
import pickle
import shutil
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from blake3 import blake3
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.utils.serialization import config as serialization_config
from training_helpers import (
    CHECKPOINTED_JOB,
    Payload,
    cached_pages,
    make_opt_ml,
    o_direct_works,
    refuse_o_direct,
    run_in_process,
    step_losses,
)

import training.checkpoint
import training.checkpoint.integrity
import training.checkpoint.manager
import training.checkpoint.planners
import training.checkpoint.reader
import training.checkpoint.writer
import training.tensor_archive
from contract.layout import LEDGER_CHANNEL, MANIFEST
from contract.ledger import OPENED, Record
from contract.stored_checkpoints import DCP_METADATA, FORMAT_VERSION, Manifest, Segment, manifest_sha256
from training import direct_io
from training.checkpoint import segment_digest, verify


def _copy(reference: tuple[Path, str], tmp_path: Path) -> Path:
    root = tmp_path / "ml"
    shutil.copytree(reference[0], root)
    shutil.rmtree(root / "model")
    return root


def _recommit(directory: Path) -> None:
    """Rewrite the manifest so that it checks out against the files now there, in the format a save writes."""
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["format"] = FORMAT_VERSION
    for name, entry in manifest["files"].items():
        data = (directory / name).read_bytes()
        if isinstance(entry, dict):
            entry.update(size=len(data), segments=[list(s) for s in training.checkpoint.segments_of(directory / name)])
        else:
            manifest["files"][name] = len(data)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_planted_metadata_with_a_valid_manifest_runs_no_code_and_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    root = _copy(reference, tmp_path)
    marker = tmp_path / "marker"
    planted = root / "checkpoints" / "step-12"
    (planted / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    _recommit(planted)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert not marker.exists(), "unpickling the planted .metadata ran its code"
    assert completed
    assert "skipping checkpoint step-12" in log and "which DCP metadata never holds" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _unicode(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
# Pickles that only name globals .metadata may name, and set attributes (BUILD) of what one names: a class, a
# function, an enum member. Each leaves None as the result.
_BUILT_GLOBALS = {
    "metadata_class": (  # Metadata.__setstate__ = torch.Size: every later metadata's unpickling raises TypeError
        _global(_METADATA_MODULE, "Metadata") + b"N}" + _unicode("__setstate__") + _global("torch", "Size") + b"s\x86b",
        lambda: torch.distributed.checkpoint.metadata.Metadata,
    ),
    "function": (
        _global("torch.serialization", "_get_layout") + b"}" + _unicode("planted") + b"\x88sb",
        lambda: torch.serialization._get_layout,
    ),
    "enum_member": (
        _global(_METADATA_MODULE, "_MEM_FORMAT_ENCODING") + b"K\x00\x85R}" + _unicode("planted") + b"\x88sb",
        lambda: torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
    ),
}


@pytest.mark.parametrize("gadget", sorted(_BUILT_GLOBALS))
def test_planted_metadata_changes_no_class_function_or_enum_member_and_older_checkpoints_still_load(
    gadget: str, reference: tuple[Path, str], tmp_path: Path
) -> None:
    """A planted .metadata that sets attributes of what a global it may name names is refused before it sets
    them. Had it changed them, that would last for the whole process: every older checkpoint's metadata would
    then fail to load too."""
    body, named = _BUILT_GLOBALS[gadget]
    target = named()
    before = dict(vars(target))
    root = _copy(reference, tmp_path)
    planted = root / "checkpoints" / "step-12"
    (planted / ".metadata").write_bytes(b"\x80\x02" + body + b"0N.")
    _recommit(planted)
    try:
        completed, log = run_in_process(root, CHECKPOINTED_JOB)
    finally:
        changed = dict(vars(target)) != before
        for name in set(vars(target)) - set(before):  # were it changed, later tests would run with it
            delattr(target, name)
    assert not changed
    assert completed
    assert "skipping checkpoint step-12" in log and "which DCP metadata never does" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_shard_changed_after_its_commit_is_refused_for_the_previous_checkpoint(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    root = _copy(reference, tmp_path)
    shard = next((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    _flip(shard, -8)  # same size: only the digest tells
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert f"skipping checkpoint step-12: rank 0: step-12: {shard.name} does not match the blake3 digest" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_change_to_any_one_of_a_ranks_data_files_is_refused(reference: tuple[Path, str], tmp_path: Path) -> None:
    """The save writes several data files per rank: the last one, not only the first, is verified."""
    root = _copy(reference, tmp_path)
    shards = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    assert len(shards) >= 2
    _flip(shards[-1], -8)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert f"skipping checkpoint step-12: rank 0: step-12: {shards[-1].name} does not match the blake3 digest" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _failing_reads(monkeypatch: pytest.MonkeyPatch, fails: Callable[[Path, int], bool], code: int) -> None:
    """A load's reads of a span raise OSError(`code`) where `fails(file, n)`: n counts the spans every file a
    load opened has read, from 1 (the first checkpoint's .metadata's first); the manifest's read where
    `fails(manifest, 0)`."""
    opened, read_bytes, count = training.checkpoint.integrity._opened, Path.read_bytes, itertools.count(1)

    def failing_opened(path: Path, listed: Any) -> Any:
        reader = opened(path, listed)
        next_span = reader.next_span

        def failing() -> Any:
            if fails(path, next(count)):
                raise OSError(code, os.strerror(code))
            return next_span()

        reader.next_span = failing
        return reader

    def failing_read_bytes(path: Path) -> bytes:
        if path.name == MANIFEST and fails(path, 0):
            raise OSError(code, os.strerror(code), str(path))
        return read_bytes(path)

    monkeypatch.setattr(training.checkpoint.integrity, "_opened", failing_opened)
    monkeypatch.setattr(training.checkpoint.reader, "_opened", failing_opened)
    monkeypatch.setattr(Path, "read_bytes", failing_read_bytes)
    monkeypatch.setattr(training.checkpoint.manager, "LOAD_RETRY_SECONDS", (0.0, 0.0))


def _once(first: Callable[[Path, int], bool]) -> Callable[[Path, int], bool]:
    failed: list[Path] = []

    def fails(path: Path, n: int) -> bool:
        if failed or not first(path, n):
            return False
        failed.append(path)
        return True

    return fails


@pytest.mark.parametrize(
    "where",
    ["manifest", "metadata", "data"],
)
def test_a_read_error_that_may_pass_is_tried_again_not_taken_for_a_bad_checkpoint(
    where: str, reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One EIO reading the newest checkpoint (its manifest, its .metadata, a span of a data file in a reading
    thread) is not a reason to resume from an older one: the same checkpoint is loaded again, in full."""
    root = _copy(reference, tmp_path)
    first = {
        "manifest": lambda path, n: n == 0 and path.parent.name == "step-12",
        "metadata": lambda path, n: path.name == DCP_METADATA,
        "data": lambda path, n: path.suffix == ".distcp" and n >= 3,
    }[where]
    _failing_reads(monkeypatch, _once(first), errno.EIO)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "checkpoint step-12: rank 0: step-12:" in log and "loading it again in 0 s (try 1 of 3 failed" in log
    assert "Input/output error" in log and "skipping checkpoint" not in log
    assert "resumed from checkpoint step-12" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 12}


def test_a_read_error_listing_the_checkpoints_the_ledger_records_does_not_end_the_run(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a ledger, the newest manifest is read to list the recorded checkpoints, and again to load it: an EIO
    the first time leaves it to the load, which reads it again and checks it against the ledger."""
    root = _copy(reference, tmp_path)
    _ledger(root, [4, 8, 12])
    _failing_reads(monkeypatch, _once(lambda path, n: n == 0 and path.parent.name == "step-12"), errno.EIO)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "resumed from checkpoint step-12" in log and "skipping" not in log


def test_a_read_error_that_does_not_pass_is_tried_three_times_then_the_older_checkpoint_loads(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(reference, tmp_path)
    _failing_reads(monkeypatch, lambda path, n: path.parent.name == "step-12" and n > 0, errno.EIO)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "try 1 of 3 failed" in log and "try 2 of 3 failed" in log and "try 3 of 3" not in log
    assert "skipping checkpoint step-12: rank 0: step-12: OSError: [Errno 5] Input/output error" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_read_error_that_will_not_pass_is_not_tried_again(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(reference, tmp_path)
    _failing_reads(monkeypatch, _once(lambda path, n: path.name == DCP_METADATA), errno.EACCES)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "loading it again" not in log and "skipping checkpoint step-12" in log and "Permission denied" in log
    assert "resumed from checkpoint step-8" in log


def test_errors_that_may_pass_are_os_errors_of_a_kind_that_passes_and_never_a_file_that_does_not_match() -> None:
    def wrapped(*errors: BaseException) -> CheckpointException:
        return CheckpointException("load failed", {rank: (error, None) for rank, error in enumerate(errors)})  # type: ignore[misc]

    eio, enoent = OSError(errno.EIO, "Input/output error"), FileNotFoundError(errno.ENOENT, "No such file")
    mismatch = training.checkpoint.CheckpointError("does not match the blake3 digest its manifest lists")
    caused = RuntimeError("read failed")
    caused.__cause__ = eio
    transient = training.checkpoint.transient
    assert transient(eio) and transient(wrapped(eio)) and transient(caused) and transient(wrapped(caused))
    assert not transient(enoent) and not transient(wrapped(enoent)) and not transient(RuntimeError("thread"))
    assert not transient(wrapped(eio, mismatch)) and not transient(mismatch)
    # Each failing rank's error must be one that may pass.
    assert transient(wrapped(eio, eio))
    assert not transient(wrapped(eio, enoent)) and not transient(wrapped(eio, pickle.UnpicklingError("planted")))
    assert not transient(CheckpointException("load failed", {}))


def test_a_file_that_does_not_match_is_the_reason_even_when_a_read_error_in_another_thread_ends_first(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two files are read in two threads: one's first read fails with EIO, the other's first segment is changed.
    The thread that finds the change waits for the EIO to end its thread first; the load still reports the
    change, and does not load the checkpoint again."""
    root = _copy(reference, tmp_path)
    failing, changed = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))[:2]
    _flip(changed, 0)
    monkeypatch.setattr(training.checkpoint.reader, "io_threads", lambda: 2)
    monkeypatch.setattr(training.checkpoint.manager, "io_threads", lambda: 2)
    monkeypatch.setattr(training.checkpoint.manager, "LOAD_RETRY_SECONDS", (0.0, 0.0))
    ended = threading.Event()
    opened = training.checkpoint.integrity._opened

    def racing(path: Path, listed: Any) -> Any:
        reader = opened(path, listed)
        next_span = reader.next_span

        def fail() -> Any:
            ended.set()
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        def late() -> Any:
            assert ended.wait(30)
            return next_span()

        if path == failing:
            reader.next_span = fail
        elif path == changed:
            reader.next_span = late
        return reader

    monkeypatch.setattr(training.checkpoint.integrity, "_opened", racing)
    monkeypatch.setattr(training.checkpoint.reader, "_opened", racing)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "loading it again" not in log
    assert f"skipping checkpoint step-12: rank 0: step-12: {changed.name} does not match the blake3 digest" in log
    assert "resumed from checkpoint step-8" in log


def _flip(path: Path, start: int, count: int = 8) -> None:
    """Invert `count` bytes of the file from `start` (from its end where negative): they change, whatever they
    were (zeroing them changes nothing where they are zeros, as the optimizer's moments are for the rows of the
    position embedding past the run's sequence length, which no step uses)."""
    data = bytearray(path.read_bytes())
    start %= len(data)
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


def _change_middle(path: Path) -> None:
    """Change 64 bytes in the middle of a data file, where the tensors are: it still loads, with other weights."""
    _flip(path, path.stat().st_size // 2, 64)


def test_a_data_file_changed_after_the_checkpoint_was_checked_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes that are loaded are the bytes that were hashed: a file replaced between the check and the read
    (another process, a sync that lands late) is not loaded."""
    root = _copy(reference, tmp_path)
    shards = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    reader = training.checkpoint.reader._SafeReader.__init__

    def changed_once_checked(self: Any, directory: Path, *args: Any, **kwargs: Any) -> None:
        if directory.name == "step-12":  # its manifest was checked: its files are about to be opened
            _change_middle(max(shards, key=lambda shard: shard.stat().st_size))
        reader(self, directory, *args, **kwargs)

    monkeypatch.setattr(training.checkpoint.reader._SafeReader, "__init__", changed_once_checked)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "does not match the blake3 digest" in log and "skipping checkpoint step-12" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_manifest_replaced_after_the_ledger_check_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest whose digest the ledger records is the one the load parses: one swapped in after the listing
    was checked (with files to match) is refused."""
    root = _copy(reference, tmp_path)
    checkpoints = root / "checkpoints"
    _ledger(root, [4, 8, 12])
    recorded = training.checkpoint.CheckpointManager._recorded

    def swapped_after_listing(self: Any, steps: list[int]) -> list[int]:
        kept = recorded(self, steps)
        _change_middle(max((checkpoints / "step-12").glob("__0_*.distcp"), key=lambda shard: shard.stat().st_size))
        _recommit(checkpoints / "step-12")
        return kept

    monkeypatch.setattr(training.checkpoint.CheckpointManager, "_recorded", swapped_after_listing)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12" in log and "not one the run's ledger records" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _largest_item(directory: Path) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """The bytes of the data file holding the checkpoint's largest item (a tensor), checked; the item's storage
    info; the tensor as torch.load reads it from the file."""
    manifest = training.checkpoint.manifest_of(directory)
    assert not isinstance(manifest, str)
    reader = training.checkpoint.reader._SafeReader(directory, manifest)
    reader.set_up_storage_reader(reader.read_metadata(), is_coordinator=True)
    info = max(reader.storage_data.values(), key=lambda info: info.length)
    listed = manifest.files[info.relative_path]
    data = training.checkpoint.integrity._read_verified(directory / info.relative_path, listed, manifest.hashed_with)
    with (directory / info.relative_path).open("rb") as file:
        file.seek(info.offset)
        expected = torch.load(io.BytesIO(file.read(info.length)), weights_only=True)
    return data, info, expected


def test_tensors_are_loaded_from_the_checked_bytes_without_a_copy(reference: tuple[Path, str]) -> None:
    data, info, expected = _largest_item(reference[0] / "checkpoints" / "step-12")
    tensor = training.tensor_archive.saved(data, info.offset, info.length)
    assert data.data_ptr() + info.offset <= tensor.data_ptr() < data.data_ptr() + info.offset + info.length
    assert torch.equal(tensor, expected)


def test_every_tensor_a_trainer_saves_is_read_without_torch_s_reader(reference: tuple[Path, str]) -> None:
    """`tensor_archive` reads each tensor item of a checkpoint itself, as torch's reader would."""
    directory = reference[0] / "checkpoints" / "step-12"
    metadata = pickle.loads((directory / ".metadata").read_bytes())  # the test's own, trusted file
    read = 0
    for index, item in metadata.storage_data.items():
        if isinstance(metadata.state_dict_metadata[index.fqn], TensorStorageMetadata):
            file = (directory / item.relative_path).read_bytes()[item.offset : item.offset + item.length]
            data = torch.frombuffer(bytearray(file), dtype=torch.uint8)
            found = training.tensor_archive._read_itself(data, 0, len(file))
            expected = torch.load(io.BytesIO(file), weights_only=True)
            assert (found.dtype, found.shape, found.stride(), found.storage_offset()) == (
                expected.dtype,
                expected.shape,
                expected.stride(),
                expected.storage_offset(),
            )
            assert bytes(found.untyped_storage()) == bytes(expected.untyped_storage())
            read += 1
    assert read >= 20


def test_where_torch_has_no_zero_copy_load_tensors_are_loaded_with_torch_load(
    reference: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive torch's reader takes (one `tensor_archive` does not read itself) on a torch without the
    zero-copy form of its reader."""
    data, info, expected = _largest_item(reference[0] / "checkpoints" / "step-12")

    def not_read_here(*_: object) -> None:
        raise training.tensor_archive._NotReadHereError

    monkeypatch.setattr(training.tensor_archive, "_read_itself", not_read_here)
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {})  # nor laid out as one it read
    tensor = training.tensor_archive.saved(data, info.offset, info.length)
    assert data.data_ptr() <= tensor.data_ptr() < data.data_ptr() + len(data)  # torch's zero-copy form
    monkeypatch.setattr(training.tensor_archive, "_ZERO_COPY_LOAD", None)
    tensor = training.tensor_archive.saved(data, info.offset, info.length)
    assert not data.data_ptr() <= tensor.data_ptr() < data.data_ptr() + len(data)  # a copy
    assert torch.equal(tensor, expected)


def test_a_save_hashes_its_data_files_as_it_writes_them(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committing does not read the data files back from the disk; the manifest still matches them."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    read_back: list[str] = []
    hash_file = training.checkpoint.segments_of

    def recording(path: Path) -> tuple[Segment, ...]:
        read_back.append(path.name)
        return hash_file(path)

    monkeypatch.setattr(training.checkpoint.writer, "segments_of", recording)
    completed, _ = run_in_process(paths.root, {**CHECKPOINTED_JOB, "max_steps": "4"})
    monkeypatch.undo()
    assert completed
    assert read_back == [".metadata"]
    assert verify(paths.checkpoints / "step-4") is None


def test_a_save_computes_no_zip_crc_the_load_never_reads(reference: tuple[Path, str]) -> None:
    """The digest of every segment is the check; the per-record CRC-32 inside each item's archive is left at
    zero in every data file, whichever of DCP's writer threads wrote it, only while the checkpoint is written."""
    directory = reference[0] / "checkpoints" / "step-12"
    data, info, expected = _largest_item(directory)
    assert torch.equal(training.tensor_archive.saved(data, info.offset, info.length), expected)
    metadata = pickle.loads((directory / ".metadata").read_bytes())  # the test's own, trusted file
    crcs: dict[str, set[int]] = {}
    for item in metadata.storage_data.values():
        file = (directory / item.relative_path).read_bytes()[item.offset : item.offset + item.length]
        if file.startswith(b"PK"):  # a tensor's archive (the progress and settings items are plain pickles)
            crcs.setdefault(item.relative_path, set()).update(
                r.CRC for r in zipfile.ZipFile(io.BytesIO(file)).infolist()
            )
    assert len(crcs) >= 2 and all(found == {0} for found in crcs.values()), crcs
    assert serialization_config.save.compute_crc32  # the process's setting is restored after the save


_SMALL_SEGMENT = 4096


@pytest.fixture(scope="module")
def segmented(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The reference job run with segments of at least 4 KiB instead of 16 MiB, so that its data files have
    several segments, as a large model's have; and its log."""
    root = tmp_path_factory.mktemp("segmented")
    make_opt_ml(root, {}, corpus=corpus)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training.checkpoint.writer, "_MIN_SEGMENT", _SMALL_SEGMENT)
        completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    return root, log


def _item_ends(directory: Path) -> dict[str, set[int]]:
    """Where each item of each data file ends, by DCP's metadata (the test's own, trusted file)."""
    metadata = pickle.loads((directory / ".metadata").read_bytes())
    ends: dict[str, set[int]] = {}
    for info in metadata.storage_data.values():
        ends.setdefault(info.relative_path, set()).add(info.offset + info.length)
    return ends


def test_segment_digests_are_the_hashes_their_names_say() -> None:
    """Known answers (the empty input's digest in each hash's specification), so that a name in the format table
    cannot stand for another hash."""
    empty = {"sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}
    empty["blake3"] = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    for name, expected in empty.items():
        assert segment_digest(name).hexdigest() == expected
    assert training.checkpoint.SAVED_HASH == "blake3"
    digest = segment_digest()
    digest.update(b"abc")
    assert digest.hexdigest() == blake3(b"abc").hexdigest() != hashlib.sha256(b"abc").hexdigest()


@pytest.mark.parametrize("run", ["reference", "segmented"])
def test_manifest_lists_every_file_by_segments_of_whole_items(run: str, request: pytest.FixtureRequest) -> None:
    """Each file's segments cover it in order, each with its bytes' BLAKE3 digest (format 4); a data file's segments
    end where items end, at the first item end after 16 MiB (4 KiB in the segmented run)."""
    root, _ = request.getfixturevalue(run)
    smallest = _SMALL_SEGMENT if run == "segmented" else training.checkpoint.writer._MIN_SEGMENT
    directory = root / "checkpoints" / "step-12"
    manifest = json.loads((directory / MANIFEST).read_text())
    files = manifest["files"]
    assert manifest["format"] == 4
    assert set(files) == {p.name for p in directory.iterdir() if p.name != MANIFEST}
    item_ends = _item_ends(directory)
    for name, entry in files.items():
        data = (directory / name).read_bytes()
        assert set(entry) == {"size", "segments"} and entry["size"] == len(data)
        start, ends = 0, []
        for length, digest in entry["segments"]:
            assert blake3(data[start : start + length]).hexdigest() == digest
            start += length
            ends.append(start)
        assert start == len(data)
        if name in item_ends:  # a data file: cut at the first item end `smallest` bytes or more after the last cut
            expected, cut = [], 0
            for end in sorted(item_ends[name]):
                if end - cut >= smallest or end == len(data):
                    expected.append(end)
                    cut = end
            assert ends == expected
    if run == "segmented":
        assert max(len(entry["segments"]) for entry in files.values()) > 2


@pytest.mark.parametrize("planted_as", ["progress", "tensor"])
def test_a_planted_item_runs_no_code(reference: tuple[Path, str], tmp_path: Path, planted_as: str) -> None:
    """The progress item (like the optimizer's settings) is a pickled object: it is read with weights_only; a
    tensor item is read by `tensor_archive`, which leaves what it does not know to weights_only."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    root = _copy(reference, tmp_path)
    marker = tmp_path / "marker"
    planted = root / "checkpoints" / "step-12"
    shard = next(planted.glob("__0_*.distcp"))
    payload = io.BytesIO()
    torch.save(Payload(marker), payload)
    offset = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + payload.getvalue())
    metadata = pickle.loads((planted / ".metadata").read_bytes())  # the test's own, trusted file
    index = MetadataIndex("progress")
    if planted_as == "tensor":
        index = next(key for key in metadata.storage_data if key.fqn.startswith("model."))
    metadata.storage_data[index] = _StorageInfo(shard.name, offset, len(payload.getvalue()))
    (planted / ".metadata").write_bytes(pickle.dumps(metadata))
    _recommit(planted)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert not marker.exists(), "loading the planted item ran its code"
    assert completed
    assert "skipping checkpoint step-12: rank 0: step-12: " in log
    assert "WeightsUnpickler error: Unsupported global: GLOBAL exec" in log
    assert "resumed from checkpoint step-8" in log


def _ledger(root: Path, steps: list[int]) -> None:
    """The job's ledger channel, recording the manifests of `steps` as they are now (contract/ledger.py)."""
    channel = root / "input" / "data" / LEDGER_CHANNEL
    channel.mkdir(parents=True)
    (channel / OPENED).write_text(json.dumps({"run": "r"}))
    for step in steps:
        manifest = (root / "checkpoints" / f"step-{step}" / MANIFEST).read_bytes()
        record = Record(f"step-{step}/", step, manifest_sha256(manifest), "r-1", "arn:execution", "now")
        (channel / f"step-{step}.json").write_text(json.dumps(asdict(record)))


def test_only_checkpoints_the_runs_ledger_records_are_loaded(reference: tuple[Path, str], tmp_path: Path) -> None:
    root = _copy(reference, tmp_path)
    _ledger(root, [4, 8])  # step-12 is intact, but the platform never recorded it
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12: the run's ledger does not record it" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_recorded_checkpoint_replaced_by_a_consistent_one_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """Another run's code rewrites step-12 and its manifest so that every digest checks out: the ledger's does not."""
    root = _copy(reference, tmp_path)
    _ledger(root, [4, 8, 12])
    planted = root / "checkpoints" / "step-12"
    shutil.rmtree(planted)
    shutil.copytree(root / "checkpoints" / "step-4", planted)
    manifest = json.loads((planted / MANIFEST).read_text())
    (planted / MANIFEST).write_text(json.dumps({**manifest, "step": 12}))
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12: the run's ledger does not record it" in log
    assert "resumed from checkpoint step-8" in log


def test_a_recorded_checkpoint_copied_over_a_newer_one_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """A checkpoint's manifest must be the one recorded of its own directory (contract/ledger.py `Recorded.admits`):
    recorded step-8's bytes copied over step-12 are not step 12, though the ledger records their digest."""
    root = _copy(reference, tmp_path)
    _ledger(root, [4, 8, 12])
    planted = root / "checkpoints" / "step-12"
    shutil.rmtree(planted)
    shutil.copytree(root / "checkpoints" / "step-8", planted)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12: the run's ledger does not record it" in log
    assert "resumed from checkpoint step-8" in log


def test_a_write_error_in_a_writer_thread_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save missing items must fail, naming the file and its error, not commit a checkpoint whose metadata names
    only what was written (torch's own threaded writer drops a helper thread's error)."""
    import threading

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    write = training.checkpoint.writer._HashingStream.write

    def disk_full_off_the_main_thread(self: Any, data: Any) -> int:
        if threading.current_thread() is not threading.main_thread():
            raise OSError(28, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(training.checkpoint.writer, "io_threads", lambda: 4)
    monkeypatch.setattr(training.checkpoint.writer._HashingStream, "write", disk_full_off_the_main_thread)
    writer, _ = training.checkpoint.writer._writer(tmp_path)
    with pytest.raises(CheckpointException, match=r"wrote \d of the 8 items of this process: __0_\d\.distcp: OSError"):
        dcp.save({f"w{i}": torch.randn(1000) for i in range(8)}, storage_writer=writer, no_dist=True)
    assert not (tmp_path / ".metadata").exists()


def test_a_changed_metadata_file_is_refused_for_what_it_is(reference: tuple[Path, str], tmp_path: Path) -> None:
    root = _copy(reference, tmp_path)
    metadata = root / "checkpoints" / "step-12" / ".metadata"
    _flip(metadata, metadata.stat().st_size // 2, 1)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert ".metadata does not match the blake3 digest its manifest lists" in log
    assert "resumed from checkpoint step-8" in log
    # Where DCP's read of .metadata fails, it asks for a rank's own metadata file: refused for what it is.
    manifest = training.checkpoint.manifest_of(metadata.parent)
    assert not isinstance(manifest, str)
    with pytest.raises(training.checkpoint.CheckpointError, match=r"saves here write one \.metadata and no rank's own"):
        training.checkpoint.reader._SafeReader(metadata.parent, manifest).read_metadata(rank=0)


def test_the_in_memory_file_reads_and_seeks_as_a_file_does() -> None:
    import array

    file = training.tensor_archive._MemoryFile(memoryview(bytes(range(16))))
    assert file.seek(0, io.SEEK_END) == 16 and file.read(4) == b""
    assert file.seek(-4, io.SEEK_END) == 12 and file.read() == bytes([12, 13, 14, 15])
    file.seek(2)
    floats = array.array("f", [0.0, 0.0])  # 8 bytes, 2 elements
    assert file.readinto(floats) == 8 and floats.tobytes() == bytes(range(2, 10))
    with pytest.raises(ValueError, match="cannot seek"):
        file.seek(-1)


def test_a_load_holds_a_few_segments_of_a_data_file_not_the_file(
    segmented: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load reads each data file a segment at a time, into buffers of its largest segment's size (with the blocks
    it starts and ends in), never one of the whole file, and takes each item from the segment it lies in, with no
    copy into a window of several (`direct_io` bounds how many segments a reader holds). ``.metadata`` is read
    whole."""
    root = _copy(segmented, tmp_path)
    shards = {shard.name: shard.stat().st_size for shard in (root / "checkpoints" / "step-12").glob("__0_*.distcp")}
    opened: dict[str, list[int]] = {}
    asked: list[int] = []
    open_to_read, kept_buffer, allocate = (
        direct_io.open_to_read,
        direct_io._kept_buffer,
        training.checkpoint.integrity._buffer,
    )
    windows: list[int] = []

    def opening(path: Path, spans: Any) -> Any:
        opened[path.name] = list(spans)
        return open_to_read(path, spans)

    def buffer(size: int = direct_io.CHUNK, at_most: int | None = None) -> Any:
        asked.append(size)
        return kept_buffer(size, at_most)

    monkeypatch.setattr(direct_io, "open_to_read", opening)
    monkeypatch.setattr(direct_io, "_kept_buffer", buffer)
    monkeypatch.setattr(
        training.checkpoint.integrity, "_buffer", lambda size: (windows.append(size), allocate(size))[1]
    )
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "resumed from checkpoint step-12" in log
    assert opened.keys() >= shards.keys()
    for name, size in shards.items():
        assert len(opened[name]) > 2 and sum(opened[name]) == size
    largest = max(max(opened[name]) for name in shards)
    read_buffers = [size for size in asked if size != direct_io.CHUNK]  # a save's writes take buffers of CHUNK bytes
    assert read_buffers and max(read_buffers) <= largest + 2 * direct_io.ALIGNMENT < min(shards.values()) / 2
    metadata = (root / "checkpoints" / "step-12" / ".metadata").stat().st_size
    assert set(windows) == {metadata}  # read whole, as one window of its segments


def test_a_cold_load_reads_the_checkpoint_from_the_disk_and_leaves_none_of_it_cached(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """A load reads each file it checks with O_DIRECT: the kernel neither caches the checkpoint's pages nor
    copies them through its cache (docs/BENCHMARKS.md: that cost a cold load most of its kernel time)."""
    root = _copy(reference, tmp_path)
    if not o_direct_works(root):
        pytest.skip(f"{root}'s file system refuses O_DIRECT")
    checked = [path for path in (root / "checkpoints" / "step-12").iterdir() if path.name != MANIFEST]
    for path in checked:
        direct_io.evict(path)
    if any(cached_pages(path) for path in checked):
        pytest.skip(f"{root}'s file system keeps its files' pages cached (tmpfs)")
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "resumed from checkpoint step-12" in log
    assert {path.name: cached_pages(path) for path in checked} == dict.fromkeys((p.name for p in checked), 0)


def _record_loaded_items(monkeypatch: pytest.MonkeyPatch, loaded: list[tuple[str, str]]) -> list[Any]:
    """Record (checkpoint, file) of each item a load loads into `loaded`; the readers made, in order."""
    readers: list[Any] = []
    read_data, load_item = (
        training.checkpoint.reader._SafeReader.read_data,
        training.checkpoint.reader._SafeReader._load_item,
    )

    def reading(self: Any, plan: Any, planner: Any) -> Any:
        readers.append(self)
        return read_data(self, plan, planner)

    def loading(item: Any, planner: Any, **kwargs: Any) -> None:
        loaded.append((readers[-1].directory.name, kwargs["name"]))
        load_item(item, planner, **kwargs)

    monkeypatch.setattr(training.checkpoint.reader._SafeReader, "read_data", reading)
    monkeypatch.setattr(training.checkpoint.reader._SafeReader, "_load_item", staticmethod(loading))
    return readers


def test_a_changed_later_segment_is_refused_after_earlier_windows_were_loaded(
    segmented: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items of a file's windows are loaded before its later windows are read: when a later one fails its
    check, the older checkpoint is loaded whole, and the run goes on exactly as from that checkpoint."""
    root = _copy(segmented, tmp_path)
    directory = root / "checkpoints" / "step-12"
    shard = max(directory.glob("__0_*.distcp"), key=lambda path: path.stat().st_size)
    segments = json.loads((directory / MANIFEST).read_text())["files"][shard.name]["segments"]
    size = shard.stat().st_size
    last = size - segments[-1][0]
    _flip(shard, last)
    loaded: list[tuple[str, str]] = []  # (checkpoint, file) of each item loaded
    _record_loaded_items(monkeypatch, loaded)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert f"{shard.name} does not match the blake3 digest its manifest lists for bytes {last}-{size}" in log
    assert ("step-12", shard.name) in loaded  # items of its earlier windows were loaded before the refusal
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(segmented[1]).items() if s > 8}


@pytest.mark.parametrize(("version", "run"), [(2, "reference"), (3, "segmented")])
def test_a_checkpoint_saved_with_sha256_digests_still_loads(
    version: int, run: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A checkpoint saved before BLAKE3 (manifest format 3: the SHA-256 of each segment, here several per file;
    format 2, before segments: one SHA-256 per file) resumes a run, and is refused at the segment that changed."""
    saved: tuple[Path, str] = request.getfixturevalue(run)
    root = _copy(saved, tmp_path)
    for step in (8, 12):
        directory = root / "checkpoints" / f"step-{step}"
        manifest = json.loads((directory / MANIFEST).read_text())
        for name, entry in manifest["files"].items():
            data = (directory / name).read_bytes()
            if version == 2:
                manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                continue
            start = 0
            for segment in entry["segments"]:
                segment[1] = hashlib.sha256(data[start : start + segment[0]]).hexdigest()
                start += segment[0]
        (directory / MANIFEST).write_text(json.dumps({**manifest, "format": version}))
    changed = tmp_path / "changed"
    shutil.copytree(root, changed)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed and "resumed from checkpoint step-12" in log
    directory = changed / "checkpoints" / "step-12"
    shard = max(directory.glob("__0_*.distcp"), key=lambda path: path.stat().st_size)
    size, middle = shard.stat().st_size, shard.stat().st_size // 2
    _change_middle(shard)
    where = f"0-{size}"
    if version == 3:  # the segment holding the first changed byte
        segments = json.loads((directory / MANIFEST).read_text())["files"][shard.name]["segments"]
        ends = list(itertools.accumulate(length for length, _ in segments))
        assert len(ends) > 2
        index = next(i for i, end in enumerate(ends) if middle < end)
        where = f"{ends[index - 1] if index else 0}-{ends[index]}"
    completed, log = run_in_process(changed, CHECKPOINTED_JOB)
    assert completed
    assert f"{shard.name} does not match the sha256 digest its manifest lists for bytes {where}" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(saved[1]).items() if s > 8}


@pytest.mark.parametrize(
    ("spans", "windows"),
    [
        ([], [(0, 4), (4, 8), (8, 12)]),
        ([(0, 4), (4, 4), (8, 4)], [(0, 4), (4, 8), (8, 12)]),
        ([(2, 4)], [(0, 8), (8, 12)]),
        ([(2, 7)], [(0, 12)]),
        ([(0, 1), (3, 2), (9, 1)], [(0, 8), (8, 12)]),
    ],
    ids=["no-items", "one-per-segment", "straddles-one-end", "straddles-two-ends", "several"],
)
def test_a_window_ends_where_no_item_straddles_a_segment_end(
    spans: list[tuple[int, int]], windows: list[tuple[int, int]]
) -> None:
    segments = [(4, "a"), (4, "b"), (4, "c")]
    assert training.checkpoint.integrity._windows(segments, spans) == windows


def _listed_file(path: Path, lengths: list[int]) -> tuple[bytes, tuple[int, tuple[Segment, ...]]]:
    """A new file at `path` of patterned bytes in segments of `lengths`; its bytes, and its (size, segments)."""
    data = bytes(itertools.islice(itertools.cycle(range(251)), sum(lengths)))
    path.write_bytes(data)
    starts = list(itertools.accumulate(lengths, initial=0))
    segments = tuple(
        (length, blake3(data[start : start + length]).hexdigest())
        for start, length in zip(starts, lengths, strict=False)
    )
    return data, (len(data), segments)


@pytest.mark.parametrize("o_direct", [True, False], ids=["o_direct", "refused"])
def test_a_window_of_one_segment_is_the_memory_it_was_read_into_and_one_of_several_a_copy(
    o_direct: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window is its file's bytes there; a window of one segment is a view of the reader's own memory (no
    copy), one of several segments a copy of them in one buffer."""
    if o_direct and not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    if not o_direct:
        refuse_o_direct(monkeypatch)
    data, listed = _listed_file(tmp_path / "file", [5000, 3000, 4096, 7])
    windows = [(0, 5000), (5000, 12096), (12096, 12103)]
    opened: list[Any] = []
    open_to_read = direct_io.open_to_read
    monkeypatch.setattr(direct_io, "open_to_read", lambda *args: (opened.append(open_to_read(*args)), opened[-1])[1])
    verified = training.checkpoint.integrity._verified_windows(tmp_path / "file", listed, windows, "blake3")
    for (start, end), (at, window) in zip(windows, verified, strict=True):
        assert at == start and bytes(window.numpy()) == data[start:end]
        (reader,) = opened
        memory = reader._buffers if isinstance(reader, direct_io.DirectReader) else [reader._buffer.obj]
        in_reader = any(_within(window, torch.frombuffer(buffer, dtype=torch.uint8)) for buffer in memory)
        assert in_reader is (end - start in (5000, 7)), (start, end)


def test_only_windows_of_several_segments_are_copied_into_a_buffer_of_their_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, listed = _listed_file(tmp_path / "file", [9000, 3000, 4096, 7, 100, 50])
    windows = [(0, 9000), (9000, 16096), (16096, 16103), (16103, 16253)]
    sizes: list[int] = []
    buffer = training.checkpoint.integrity._buffer
    monkeypatch.setattr(training.checkpoint.integrity, "_buffer", lambda size: (sizes.append(size), buffer(size))[1])
    for (start, end), (_, window) in zip(
        windows,
        training.checkpoint.integrity._verified_windows(tmp_path / "file", listed, windows, "blake3"),
        strict=True,
    ):
        assert bytes(window.numpy()) == data[start:end]
    assert sizes == [7096]  # the second window's; the last, smaller, reuses it


def _within(view: torch.Tensor, memory: torch.Tensor) -> bool:
    """Whether the bytes of `view` lie in `memory`'s."""
    start, low = view.data_ptr(), memory.data_ptr()
    return low <= start and start + view.numel() <= low + memory.numel()


@pytest.mark.parametrize("change", ["longer", "shorter", "changed"])
def test_a_file_not_as_its_segments_list_is_refused(change: str, tmp_path: Path) -> None:
    data, listed = _listed_file(tmp_path / "file", [5000, 4096])
    if change == "longer":
        (tmp_path / "file").write_bytes(data + b"x")
        problem = "is no longer the 9096 bytes its manifest lists"
    elif change == "shorter":
        (tmp_path / "file").write_bytes(data[:-1])
        problem = "is no longer the 9096 bytes its manifest lists"
    else:
        (tmp_path / "file").write_bytes(data[:6000] + b"x" + data[6001:])
        problem = "does not match the blake3 digest its manifest lists for bytes 5000-9096"
    with pytest.raises(training.checkpoint.CheckpointError, match=problem):
        list(
            training.checkpoint.integrity._verified_windows(
                tmp_path / "file", listed, [(0, 5000), (5000, 9096)], "blake3"
            )
        )


def _recorded_opens(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, str]]) -> list[Any]:
    """Record ("open", directory/file) of each file a load opens to read, ("state", "") as the training state's
    state dict is taken, and ("plan", "") as DCP plans each load; the readers opened."""
    opened: list[Any] = []
    open_to_read, set_up = direct_io.open_to_read, training.checkpoint.planners._WeightsOnlyPlanner.set_up_planner
    state_dict = training.checkpoint.TrainingState.state_dict

    def taking(self: Any, **kwargs: Any) -> dict[str, Any]:
        events.append(("state", ""))
        return state_dict(self, **kwargs)

    def opening(path: Path, spans: Any) -> Any:
        events.append(("open", f"{path.parent.name}/{path.name}"))
        opened.append(open_to_read(path, spans))
        return opened[-1]

    def planning(self: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("plan", ""))
        set_up(self, *args, **kwargs)

    monkeypatch.setattr(direct_io, "open_to_read", opening)
    monkeypatch.setattr(training.checkpoint.planners._WeightsOnlyPlanner, "set_up_planner", planning)
    monkeypatch.setattr(training.checkpoint.TrainingState, "state_dict", taking)
    return opened


def _closed(reader: Any) -> bool:
    return reader._closed if isinstance(reader, direct_io.DirectReader) else reader.file.closed


def test_a_process_reads_the_files_it_wrote_while_dcp_plans_the_load(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming on as many processes as saved the checkpoint, a process opens the files it wrote, which starts
    their reads, once ``.metadata`` is checked and before it takes the state dict to load into and DCP plans the
    load; each is read once, and closed."""
    root = _copy(reference, tmp_path)
    events: list[tuple[str, str]] = []
    opened = _recorded_opens(monkeypatch, events)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed and "resumed from checkpoint step-12" in log
    own = sorted(f"step-12/{p.name}" for p in (root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    plan = events.index(("plan", ""))
    assert events[:plan] == [("open", name) for name in (f"step-12/{DCP_METADATA}", *own)] + [("state", "")]
    assert sorted(name for kind, name in events if name.startswith("step-12/__")) == own  # none opened twice
    assert all(_closed(reader) for reader in opened)


def test_an_error_taking_the_state_dict_to_load_into_is_not_blamed_on_the_checkpoints(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state dict is taken while the files are read, but its failure is the trainer's: it is raised as it is,
    not logged as each checkpoint's problem until none can be loaded."""
    root = _copy(reference, tmp_path)

    def failing(self: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("the optimizer has no state for a parameter")

    monkeypatch.setattr(training.checkpoint.TrainingState, "state_dict", failing)
    logged: list[str] = []
    monkeypatch.setattr(
        training.checkpoint.manager.log, "warning", lambda message, *args: logged.append(message % args)
    )
    with pytest.raises(RuntimeError, match="the optimizer has no state for a parameter"):
        run_in_process(root, CHECKPOINTED_JOB)
    assert not [message for message in logged if "skipping checkpoint" in message]


def test_the_files_read_ahead_of_a_refused_checkpoint_are_closed(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint refused while its files are being read (one fails its digest; the other may not have been
    taken by a read yet) leaves none of them open, and the load goes on to the one before."""
    root = _copy(reference, tmp_path)
    shards = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    _flip(shards[0], 0)
    events: list[tuple[str, str]] = []
    opened = _recorded_opens(monkeypatch, events)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "skipping checkpoint step-12" in log and "resumed from checkpoint step-8" in log
    assert ("open", f"step-12/{shards[1].name}") in events
    assert opened and all(_closed(reader) for reader in opened)
    # Files read ahead of a load that never reads them (DCP refused the plan) are closed with the reader.
    directory = root / "checkpoints" / "step-8"
    manifest = training.checkpoint.manifest_of(directory)
    assert not isinstance(manifest, str)
    opened.clear()
    reader = training.checkpoint.reader._SafeReader(directory, manifest)
    reader.read_ahead(sorted(p.name for p in directory.glob("__0_*.distcp")))
    assert len(opened) == 3 and not any(_closed(file) for file in opened[1:])  # .metadata's, then the two files
    reader.close()
    assert all(_closed(file) for file in opened)


def test_once_a_file_is_refused_no_thread_loads_another_window_of_the_checkpoint(
    segmented: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file's first segment is changed; the other file's thread, held in its first window until the refusal,
    loads no later window."""
    root = _copy(segmented, tmp_path)
    directory = root / "checkpoints" / "step-12"
    changed, other = sorted(directory.glob("__0_*.distcp"))
    _flip(changed, 0)
    loaded: list[tuple[str, str]] = []
    readers = _record_loaded_items(monkeypatch, loaded)
    load_item = training.checkpoint.reader._SafeReader._load_item  # the recording one
    verified_windows, failed = training.checkpoint.integrity._verified_windows, threading.Event()

    def watched(path: Path, *args: Any) -> Iterator[tuple[int, torch.Tensor]]:
        try:
            yield from verified_windows(path, *args)
        except training.checkpoint.CheckpointError:
            failed.set()
            raise

    def held_until_refused(item: Any, planner: Any, **kwargs: Any) -> None:
        if readers[-1].directory.name == "step-12" and kwargs["name"] == other.name:
            assert failed.wait(timeout=60)
            refused = getattr(readers[-1], "refused", None)  # a reader that stops on a refusal says when it does
            assert refused is None or refused.wait(timeout=60)
        load_item(item, planner, **kwargs)

    monkeypatch.setattr(training.checkpoint.integrity, "_verified_windows", watched)
    monkeypatch.setattr(training.checkpoint.reader, "_verified_windows", watched)

    monkeypatch.setattr(training.checkpoint.reader._SafeReader, "_load_item", staticmethod(held_until_refused))
    first_window = training.checkpoint.integrity._windows(
        training.checkpoint.manifest_of(directory).files[other.name][1], []
    )[0]
    items = list(pickle.loads((directory / ".metadata").read_bytes()).storage_data.values())
    in_first = [i for i in items if i.relative_path == other.name and i.offset + i.length <= first_window[1]]
    completed, log = run_in_process(root, CHECKPOINTED_JOB)  # it saves step-12 anew: the files are read before
    assert completed
    assert f"{changed.name} does not match the blake3 digest its manifest lists for bytes 0-" in log
    assert "resumed from checkpoint step-8" in log
    assert loaded.count(("step-12", other.name)) <= len(in_first) < sum(i.relative_path == other.name for i in items)
    assert loaded.count(("step-12", changed.name)) == 0


def test_an_item_that_lies_in_no_segment_is_refused(tmp_path: Path) -> None:
    """A zero-length item of an empty file (no segment, no window) is not skipped in silence."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    (tmp_path / "__0_0.distcp").write_bytes(b"")
    manifest = Manifest(files={"__0_0.distcp": (0, ())}, world_size=1, hashed_with="blake3")
    reader = training.checkpoint.reader._SafeReader(tmp_path, manifest)
    index = MetadataIndex("w")
    reader.storage_data = {index: _StorageInfo("__0_0.distcp", 0, 0)}
    empty = torch.Size([0])
    item = ReadItem(LoadItemType.TENSOR, index, empty, index, empty, empty)
    with pytest.raises(training.checkpoint.CheckpointError, match=r"__0_0\.distcp: w lies in no segment of the file"):
        reader._read_file("__0_0.distcp", [item], planner=cast(Any, None))


def _save_alone(state: dict[str, torch.Tensor], directory: Path) -> dict[str, Any]:
    """`state` saved by this trainer's writer, outside a run; the (size, segments) of each data file."""
    import torch.distributed.checkpoint as dcp

    writer, hashed = training.checkpoint.writer._writer(directory)
    dcp.save(state, storage_writer=writer, no_dist=True)
    return hashed


def test_data_files_written_with_o_direct_or_buffered_are_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save writes its data files with O_DIRECT where the file system allows, and falls back to buffered
    writes where it does not: both give the same files, and the segments listed are those of the bytes on the
    disk."""

    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(direct_io, "CHUNK", 4 * direct_io.ALIGNMENT)  # many chunks and a partial last block
    monkeypatch.setattr(training.checkpoint.writer, "_MIN_SEGMENT", _SMALL_SEGMENT)
    state = {f"w{i}": torch.randn(1000 + 333 * i) for i in range(8)}
    opened: list[str] = []
    create = direct_io.create

    def recorded(path: Path) -> Any:
        file = create(path)
        opened.append(type(file).__name__)
        return file

    monkeypatch.setattr(direct_io, "create", recorded)
    direct = _save_alone(state, tmp_path / "direct")
    assert opened == ["DirectFile"] * len(direct)
    refuse_o_direct(monkeypatch)
    opened.clear()
    buffered = _save_alone(state, tmp_path / "buffered")
    assert opened == ["BufferedFile"] * len(buffered)
    assert direct == buffered
    for name, (size, segments) in direct.items():
        on_disk = (tmp_path / "direct" / name).read_bytes()
        assert on_disk == (tmp_path / "buffered" / name).read_bytes()
        assert len(on_disk) == size and len(segments) > 1
        at = 0
        for length, digest in segments:
            assert blake3(on_disk[at : at + length]).hexdigest() == digest
            at += length
        assert at == size


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # torch's thread dies of it
@pytest.mark.parametrize("elements", [1000, 100_000], ids=["at_close", "while_writing"])
def test_a_failed_o_direct_write_fails_the_save(elements: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk writes of a file written with O_DIRECT run in threads of their own: their error fails the
    save, whether it comes while DCP writes the file or from the last block, written when DCP closes it."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not o_direct_works(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    if elements > 1000:
        monkeypatch.setattr(direct_io, "CHUNK", 4 * direct_io.ALIGNMENT)  # 8 items of 400 KB: many buffers' worth
    written: list[int] = []

    def disk_full(fd: int, data: memoryview, offset: int) -> None:
        written.append(len(data))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(direct_io, "_write_all", disk_full)
    with pytest.raises(CheckpointException, match=r"OSError: \[Errno 28\] No space left on device"):
        _save_alone({f"w{i}": torch.randn(elements) for i in range(8)}, tmp_path)
    assert written and (elements == 1000) == all(length < direct_io.CHUNK for length in written)
    assert not (tmp_path / ".metadata").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # torch's thread dies of it
def test_a_disk_error_inside_an_item_is_reported_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save meets the file's error halfway through an item's archive and raises its own ("unexpected
    pos ..."): the save reports the disk's error, which says what to fix."""
    from torch.distributed.checkpoint.api import CheckpointException

    refuse_o_direct(monkeypatch)
    write, calls = direct_io.BufferedFile.write, []

    def full_after_a_while(self: direct_io.BufferedFile, data: memoryview) -> None:
        calls.append(len(data))
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        write(self, data)

    monkeypatch.setattr(direct_io.BufferedFile, "write", full_after_a_while)
    with pytest.raises(CheckpointException, match=r"OSError: \[Errno 28\] No space left on device") as raised:
        _save_alone({f"w{i}": torch.randn(1000) for i in range(8)}, tmp_path)
    assert "unexpected pos" not in str(raised.value)

"""A checkpoint planted in a run's prefix, or changed after its commit, is refused before anything unpickles it."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.serialization import config as serialization_config
from training_helpers import CHECKPOINTED_JOB, make_opt_ml, run_in_process, step_losses

import training.checkpoint
from training.checkpoint import verify
from training.layout import LEDGER_CHANNEL, MANIFEST
from training.ledger import OPENED, Record
from training.stored_checkpoints import manifest_sha256


def _copy(reference: tuple[Path, str], tmp_path: Path) -> Path:
    root = tmp_path / "ml"
    shutil.copytree(reference[0], root)
    shutil.rmtree(root / "model")
    return root


class _Payload:
    """Unpickling this writes `marker`: what planted training code would do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _recommit(directory: Path) -> None:
    """Rewrite the manifest so that it checks out against the files now there (whatever its format)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        data = (directory / name).read_bytes()
        if isinstance(entry, dict):
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        else:
            manifest["files"][name] = len(data)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_planted_metadata_with_a_valid_manifest_runs_no_code_and_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    root = _copy(reference, tmp_path)
    marker = tmp_path / "marker"
    planted = root / "checkpoints" / "step-12"
    (planted / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    _recommit(planted)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert not marker.exists(), "unpickling the planted .metadata ran its code"
    assert completed
    assert "skipping checkpoint step-12" in log and "which DCP metadata never holds" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_shard_changed_after_its_commit_is_refused_for_the_previous_checkpoint(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    root = _copy(reference, tmp_path)
    shard = next((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-8:] = bytes(8)  # same size: only the digest tells
    shard.write_bytes(bytes(data))
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert f"skipping checkpoint step-12: rank 0: step-12: {shard.name} does not match the SHA-256" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def test_a_change_to_any_one_of_a_ranks_data_files_is_refused(reference: tuple[Path, str], tmp_path: Path) -> None:
    """The save writes several data files per rank: the last one, not only the first, is verified."""
    root = _copy(reference, tmp_path)
    shards = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    assert len(shards) >= 2
    data = bytearray(shards[-1].read_bytes())
    data[-8:] = bytes(8)
    shards[-1].write_bytes(bytes(data))
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert f"skipping checkpoint step-12: rank 0: step-12: {shards[-1].name} does not match the SHA-256" in log
    assert "resumed from checkpoint step-8" in log
    assert step_losses(log) == {s: v for s, v in step_losses(reference[1]).items() if s > 8}


def _change_middle(path: Path) -> None:
    """Change 64 bytes in the middle of a data file, where the tensors are: it still loads, with other weights."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))


def test_a_data_file_changed_after_the_checkpoint_was_checked_is_not_loaded(
    reference: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes that are loaded are the bytes that were hashed: a file replaced between the check and the read
    (another process, a sync that lands late) is not loaded."""
    root = _copy(reference, tmp_path)
    shards = sorted((root / "checkpoints" / "step-12").glob("__0_*.distcp"))
    load = training.checkpoint.dcp_load

    def changed_once_checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs["storage_reader"].path.name == "step-12":
            _change_middle(max(shards, key=lambda shard: shard.stat().st_size))
        return load(*args, **kwargs)

    monkeypatch.setattr(training.checkpoint, "dcp_load", changed_once_checked)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert "does not match the SHA-256" in log and "skipping checkpoint step-12" in log
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
    reader = training.checkpoint._SafeReader(directory, manifest)
    reader.set_up_storage_reader(reader.read_metadata(), is_coordinator=True)
    info = max(reader.storage_data.values(), key=lambda info: info.length)
    data = training.checkpoint._read_verified(directory / info.relative_path, *manifest.files[info.relative_path])
    with (directory / info.relative_path).open("rb") as file:
        file.seek(info.offset)
        expected = torch.load(io.BytesIO(file.read(info.length)), weights_only=True)
    return data, info, expected


def test_tensors_are_loaded_from_the_checked_bytes_without_a_copy(reference: tuple[Path, str]) -> None:
    data, info, expected = _largest_item(reference[0] / "checkpoints" / "step-12")
    tensor = training.checkpoint._saved_tensor(data, info.offset, info.length)
    assert data.data_ptr() + info.offset <= tensor.data_ptr() < data.data_ptr() + info.offset + info.length
    assert torch.equal(tensor, expected)


def test_where_torch_has_no_zero_copy_load_tensors_are_loaded_with_torch_load(
    reference: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data, info, expected = _largest_item(reference[0] / "checkpoints" / "step-12")
    monkeypatch.setattr(training.checkpoint, "_ZERO_COPY_LOAD", None)
    tensor = training.checkpoint._saved_tensor(data, info.offset, info.length)
    assert not data.data_ptr() <= tensor.data_ptr() < data.data_ptr() + len(data)  # a copy
    assert torch.equal(tensor, expected)


def test_a_save_hashes_its_data_files_as_it_writes_them(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committing does not read the data files back from the disk; the manifest still matches them."""
    paths = make_opt_ml(tmp_path, {}, corpus=corpus)
    read_back: list[str] = []
    hash_file = training.checkpoint.sha256_of

    def recording(path: Path) -> str:
        read_back.append(path.name)
        return hash_file(path)

    monkeypatch.setattr(training.checkpoint, "sha256_of", recording)
    completed, _ = run_in_process(paths.root, {**CHECKPOINTED_JOB, "max_steps": "4"})
    monkeypatch.undo()
    assert completed
    assert read_back == [".metadata"]
    assert verify(paths.checkpoints / "step-4") is None


def test_a_save_computes_no_zip_crc_the_load_never_reads(reference: tuple[Path, str]) -> None:
    """The SHA-256 of every file is the check; the per-record CRC-32 inside each item's archive is left at zero
    in every data file, whichever of DCP's writer threads wrote it, only while the checkpoint is written."""
    directory = reference[0] / "checkpoints" / "step-12"
    data, info, expected = _largest_item(directory)
    assert torch.equal(training.checkpoint._saved_tensor(data, info.offset, info.length), expected)
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


def test_manifest_names_every_file_with_its_size_and_sha256(reference: tuple[Path, str]) -> None:
    directory = reference[0] / "checkpoints" / "step-12"
    files = json.loads((directory / MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in directory.iterdir() if p.name != MANIFEST}
    for name, entry in files.items():
        data = (directory / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_planted_non_tensor_item_runs_no_code(reference: tuple[Path, str], tmp_path: Path) -> None:
    """The progress item (like the optimizer's settings) is a pickled object: it is read with weights_only."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    root = _copy(reference, tmp_path)
    marker = tmp_path / "marker"
    planted = root / "checkpoints" / "step-12"
    shard = next(planted.glob("__0_*.distcp"))
    payload = io.BytesIO()
    torch.save(_Payload(marker), payload)
    offset = shard.stat().st_size
    shard.write_bytes(shard.read_bytes() + payload.getvalue())
    metadata = pickle.loads((planted / ".metadata").read_bytes())  # the test's own, trusted file
    metadata.storage_data[MetadataIndex("progress")] = _StorageInfo(shard.name, offset, len(payload.getvalue()))
    (planted / ".metadata").write_bytes(pickle.dumps(metadata))
    _recommit(planted)
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert not marker.exists(), "loading the planted progress item ran its code"
    assert completed
    assert "skipping checkpoint step-12: rank 0: step-12: WeightsUnpickler error: Unsupported global" in log
    assert "resumed from checkpoint step-8" in log


def _ledger(root: Path, steps: list[int]) -> None:
    """The job's ledger channel, recording the manifests of `steps` as they are now (training/ledger.py)."""
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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # torch's thread dies of it
def test_a_write_error_in_a_writer_thread_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's threaded writer drops a helper thread's error and returns the items written: a save missing
    items must fail, not commit a checkpoint whose metadata names only what was written."""
    import threading

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    write = training.checkpoint._HashingStream.write

    def disk_full_off_the_main_thread(self: Any, data: Any) -> int:
        if threading.current_thread() is not threading.main_thread():
            raise OSError(28, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(training.checkpoint, "io_threads", lambda: 4)
    monkeypatch.setattr(training.checkpoint._HashingStream, "write", disk_full_off_the_main_thread)
    writer, _ = training.checkpoint._writer(tmp_path)
    with pytest.raises(CheckpointException, match=r"wrote \d of the 8 items of this process: __0_\d\.distcp: OSError"):
        dcp.save({f"w{i}": torch.randn(1000) for i in range(8)}, storage_writer=writer, no_dist=True)
    assert not (tmp_path / ".metadata").exists()


def test_a_changed_metadata_file_is_refused_for_what_it_is(reference: tuple[Path, str], tmp_path: Path) -> None:
    root = _copy(reference, tmp_path)
    metadata = root / "checkpoints" / "step-12" / ".metadata"
    data = bytearray(metadata.read_bytes())
    data[len(data) // 2] ^= 0xFF
    metadata.write_bytes(bytes(data))
    completed, log = run_in_process(root, CHECKPOINTED_JOB)
    assert completed
    assert ".metadata does not match the SHA-256 in its manifest" in log
    assert "saves here write one .metadata and no rank's own" in log  # DCP's retry, refused for that reason
    assert "resumed from checkpoint step-8" in log


def test_the_in_memory_file_reads_and_seeks_as_a_file_does() -> None:
    import array

    file = training.checkpoint._MemoryFile(memoryview(bytes(range(16))))
    assert file.seek(0, io.SEEK_END) == 16 and file.read(4) == b""
    assert file.seek(-4, io.SEEK_END) == 12 and file.read() == bytes([12, 13, 14, 15])
    file.seek(2)
    floats = array.array("f", [0.0, 0.0])  # 8 bytes, 2 elements
    assert file.readinto(floats) == 8 and floats.tobytes() == bytes(range(2, 10))
    with pytest.raises(ValueError, match="cannot seek"):
        file.seek(-1)

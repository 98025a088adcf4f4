"""training/tensor_archive.py reads what torch's reader reads, from the same bytes, or leaves it to torch's reader."""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import training.tensor_archive
from training.tensor_archive import _NotReadHereError, _read_itself, saved_tensor

_PAD = 13  # bytes before the archive in the buffer it is read from


def _tensors() -> list[torch.Tensor]:
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    return [
        base,
        base[2:5],  # a view: its storage holds the whole of `base`, from an offset
        base.t(),  # strides not those of a contiguous tensor
        base[:, 3],
        torch.tensor(2.5),
        torch.empty(0, 3),
        torch.randn(7, 5).to(torch.bfloat16),
        torch.randn(4).to(torch.float16),
        torch.arange(-5, 5, dtype=torch.int64),
        torch.arange(-5, 5, dtype=torch.int8),
        torch.tensor([True, False, True]),
        torch.arange(250, dtype=torch.uint8),
        torch.randn(3, dtype=torch.complex64),
        torch.randn(3, dtype=torch.float64),
    ]


def _archive(value: Any) -> bytes:
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def _placed(archive: bytes) -> torch.Tensor:
    """`archive` `_PAD` bytes into a uint8 tensor that is itself a view from an offset of a larger one."""
    whole = torch.zeros(3 + _PAD + len(archive) + 5, dtype=torch.uint8)
    whole[3 + _PAD : 3 + _PAD + len(archive)] = torch.frombuffer(bytearray(archive), dtype=torch.uint8)
    return whole[3:]


def _same(found: torch.Tensor, expected: torch.Tensor) -> None:
    assert type(found) is type(expected) and found.dtype == expected.dtype
    assert found.shape == expected.shape and found.stride() == expected.stride()
    assert found.storage_offset() == expected.storage_offset()
    assert found.untyped_storage().nbytes() == expected.untyped_storage().nbytes()
    assert bytes(found.untyped_storage()) == bytes(expected.untyped_storage())  # bit for bit, NaNs and all


@pytest.mark.parametrize("index", range(len(_tensors())))
def test_it_reads_each_dtype_and_layout_as_torch_does_from_the_archive_s_own_bytes(index: int) -> None:
    archive = _archive(_tensors()[index])
    data = _placed(archive)
    found = _read_itself(data, _PAD, len(archive))  # not torch's reader: it would raise were it not its own
    _same(found, torch.load(io.BytesIO(archive), weights_only=True))
    start = data.data_ptr() + _PAD
    pointer = found.untyped_storage().data_ptr()
    assert start <= pointer and pointer + found.untyped_storage().nbytes() <= start + len(archive)  # no copy
    assert saved_tensor(data, _PAD, len(archive)).untyped_storage().data_ptr() == pointer


def test_an_archive_of_more_than_a_plain_tensor_is_read_by_torch_s_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter, and a tensor with an attribute of its own: torch's weights-only reader takes each as before."""
    noted = torch.ones(3)
    noted.note = 7  # type: ignore[attr-defined]
    values = [torch.nn.Parameter(torch.ones(2, 2)), noted]
    by_torch: list[Any] = []
    read_by_torch = training.tensor_archive._read_by_torch
    monkeypatch.setattr(
        training.tensor_archive, "_read_by_torch", lambda *args: by_torch.append(args) or read_by_torch(*args)
    )
    for value in values:
        archive = _archive(value)
        data = _placed(archive)
        with pytest.raises(_NotReadHereError):
            _read_itself(data, _PAD, len(archive))
        found = saved_tensor(data, _PAD, len(archive))
        expected = torch.load(io.BytesIO(archive), weights_only=True)
        assert type(found) is type(expected) and torch.equal(found, expected)
        assert getattr(found, "note", None) == getattr(value, "note", None)
    assert len(by_torch) == len(values)


class _Payload:
    """Unpickling this writes `marker`: what planted code would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_a_planted_archive_runs_no_code_and_is_refused_by_torch_s_reader(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    archive = _archive(_Payload(marker))
    data = _placed(archive)
    with pytest.raises(_NotReadHereError):
        _read_itself(data, _PAD, len(archive))
    with pytest.raises(pickle.UnpicklingError, match=r"WeightsUnpickler error: .*exec"):
        saved_tensor(data, _PAD, len(archive))
    assert not marker.exists()


def _rewritten(archive: bytes, replace: dict[str, bytes], *, compression: int = zipfile.ZIP_STORED) -> bytes:
    """`archive` with the records named in `replace` (without the archive's folder) replaced, others kept."""
    source, target = zipfile.ZipFile(io.BytesIO(archive)), io.BytesIO()
    with zipfile.ZipFile(target, "w", compression=compression) as rewritten:
        for info in source.infolist():
            inner = info.filename.partition("/")[2]
            rewritten.writestr(info.filename, replace.get(inner, source.read(info)))
    return target.getvalue()


class _Storage:
    """Pickled as torch pickles a storage, with the number of elements given."""

    def __init__(self, numel: int) -> None:
        self.numel = numel


def _tensor_pickle(numel: int, size: tuple[int, ...], offset: int = 0) -> bytes:
    """A tensor's pickle as torch writes it, with a storage of `numel` floats and the shape and offset given."""

    class Rebuilt:
        def __reduce__(self) -> tuple[Any, ...]:
            stride = tuple(int(torch.tensor(size[i + 1 :]).prod()) for i in range(len(size)))
            rebuild = torch._utils._rebuild_tensor_v2  # type: ignore[no-untyped-call]
            return (rebuild, (storage, offset, size, stride, False, collections.OrderedDict()))

    storage = _Storage(numel)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("storage", torch.FloatStorage, "0", "cpu", obj.numel) if isinstance(obj, _Storage) else None

    stream = io.BytesIO()
    Pickler(stream, protocol=2).dump(Rebuilt())
    return stream.getvalue()


def test_the_archive_it_writes_by_hand_is_read_as_torch_writes_it() -> None:
    """The control for the refusals below: the hand-made pickle of a 6-float tensor reads."""
    archive = _rewritten(_archive(torch.arange(6.0)), {"data.pkl": _tensor_pickle(6, (2, 3))})
    _same(_read_itself(_placed(archive), _PAD, len(archive)), torch.arange(6.0).reshape(2, 3))


def _outcome(read: Any, archive: bytes) -> Any:
    """What `read` gives for `archive`, placed anew (torch's reader byteswaps a big-endian one where it lies): the
    tensor's bytes, or its error's type."""
    try:
        found = read(_placed(archive), _PAD, len(archive))
    except Exception as exc:
        return type(exc)
    return found.dtype, found.shape, found.stride(), bytes(found.contiguous().untyped_storage())


@pytest.mark.parametrize(
    ("numel", "size", "offset"),
    [(6, (7,), 0), (6, (2, 3), 1), (7, (7,), 0), (-1, (0,), 0)],
    ids=["shape-past-storage", "offset-past-storage", "storage-past-record", "negative-storage"],
)
def test_a_tensor_reaching_past_its_bytes_is_not_read_here(numel: int, size: tuple[int, ...], offset: int) -> None:
    """Torch's reader decides on it (a storage past its record, into the archive's next bytes, it reads)."""
    archive = _rewritten(_archive(torch.arange(6.0)), {"data.pkl": _tensor_pickle(numel, size, offset)})
    data = _placed(archive)
    with pytest.raises((_NotReadHereError, RuntimeError)):
        _read_itself(data, _PAD, len(archive))
    by_torch = _outcome(training.tensor_archive._read_by_torch, archive)
    assert _outcome(saved_tensor, archive) == by_torch
    assert (by_torch is RuntimeError) == (numel == 6)


@pytest.mark.parametrize("change", ["compressed", "comment", "big-endian", "truncated"])
def test_an_archive_laid_out_otherwise_goes_to_torch_s_reader(change: str) -> None:
    tensor = torch.arange(1000, dtype=torch.int32)
    archive = _archive(tensor)
    if change == "compressed":
        archive = _rewritten(archive, {}, compression=zipfile.ZIP_DEFLATED)
    elif change == "comment":
        with zipfile.ZipFile(stream := io.BytesIO(archive), "a") as appended:
            appended.comment = b"a comment"
        archive = stream.getvalue()
    elif change == "big-endian":
        archive = _rewritten(archive, {"byteorder": b"big", "data/0": tensor.numpy().byteswap().tobytes()})
    else:
        archive = archive[:-1]
    data = _placed(archive)
    with pytest.raises(_NotReadHereError):
        _read_itself(data, _PAD, len(archive))
    by_torch = _outcome(training.tensor_archive._read_by_torch, archive)
    assert _outcome(saved_tensor, archive) == by_torch
    if change in {"comment", "big-endian"}:  # torch's reader reads them
        assert by_torch == _outcome(lambda *_: tensor, archive)

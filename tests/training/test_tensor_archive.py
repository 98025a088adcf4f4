"""training/tensor_archive.py reads what torch's reader reads, from the same bytes, or leaves it to torch's reader."""

from __future__ import annotations

import argparse
import collections
import copyreg
import io
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.serialization import config as serialization_config
from training_helpers import Payload

import training.tensor_archive
from training.tensor_archive import RefusedError, _NotReadHereError, _read_itself, saved

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
    assert (found.is_conj(), found.is_neg(), found.requires_grad) == (
        expected.is_conj(),
        expected.is_neg(),
        expected.requires_grad,
    )
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
    assert saved(data, _PAD, len(archive)).untyped_storage().data_ptr() == pointer


def test_an_archive_of_more_than_a_plain_tensor_is_read_by_torch_s_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter, a tensor with an attribute of its own, one with its grad flag, a conjugate and a negative view
    (their bits are metadata), and a dtype torch saves with another rebuild: torch's weights-only reader takes
    each as before."""
    noted = torch.ones(3)
    noted.note = 7  # type: ignore[attr-defined]
    complex_ = torch.randn(3, dtype=torch.complex64)
    values = [
        torch.nn.Parameter(torch.ones(2, 2)),
        noted,
        torch.ones(2, requires_grad=True),
        complex_.conj(),
        complex_.conj().imag,
        torch.zeros(5, dtype=torch.uint16),
    ]
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
        found = saved(data, _PAD, len(archive))
        expected = torch.load(io.BytesIO(archive), weights_only=True)
        _same(found, expected)
        assert getattr(found, "note", None) == getattr(value, "note", None)
    assert len(by_torch) == len(values)


def test_a_planted_archive_runs_no_code_and_is_refused_by_torch_s_reader(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    archive = _archive(Payload(marker))
    data = _placed(archive)
    with pytest.raises(_NotReadHereError):
        _read_itself(data, _PAD, len(archive))
    with pytest.raises(pickle.UnpicklingError, match=r"WeightsUnpickler error: .*exec"):
        saved(data, _PAD, len(archive))
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


def _tensor_pickle(numel: int, size: tuple[int, ...], offset: int = 0, *, key: Any = "0", state: Any = None) -> bytes:
    """A tensor's pickle as torch writes it, with a storage of `numel` floats named `key`, the shape and offset
    given, and a BUILD of `state` after the rebuild where it is not None (torch writes none)."""

    class Rebuilt:
        def __reduce__(self) -> tuple[Any, ...]:
            stride = tuple(int(torch.tensor(size[i + 1 :]).prod()) for i in range(len(size)))
            rebuild = torch._utils._rebuild_tensor_v2  # type: ignore[no-untyped-call]
            arguments = (storage, offset, size, stride, False, collections.OrderedDict())
            return (rebuild, arguments) if state is None else (rebuild, arguments, state)

    storage = _Storage(numel)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("storage", torch.FloatStorage, key, "cpu", obj.numel) if isinstance(obj, _Storage) else None

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
    assert _outcome(saved, archive) == by_torch
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
    assert _outcome(saved, archive) == by_torch
    if change in {"comment", "big-endian"}:  # torch's reader reads them
        assert by_torch == _outcome(lambda *_: tensor, archive)


@pytest.mark.parametrize(
    "state",
    [(True, None, collections.OrderedDict()), (False, None, collections.OrderedDict([(0, collections.OrderedDict)]))],
    ids=["grad-flag", "hook"],
)
def test_a_build_after_the_rebuild_is_not_read_here(state: Any) -> None:
    """A BUILD reaches the tensor's own __setstate__ (its grad flag and hooks), which torch's reader refuses."""
    archive = _rewritten(_archive(torch.arange(6.0)), {"data.pkl": _tensor_pickle(6, (6,), state=state)})
    with pytest.raises(_NotReadHereError):
        _read_itself(_placed(archive), _PAD, len(archive))
    refused = _outcome(saved, archive)
    assert refused == _outcome(training.tensor_archive._read_by_torch, archive)
    assert isinstance(refused, type) and issubclass(refused, Exception)


@pytest.mark.parametrize(
    ("name", "value"), [("__defaults__", b"\x88\x85"), ("planted", b"\x88")], ids=["defaults", "attribute"]
)
def test_a_build_on_the_rebuild_it_names_changes_nothing_for_later_archives(name: str, value: bytes) -> None:
    """A pickle that sets attributes of the rebuild it names (pickle's BUILD on a global) changes nothing but what
    it was handed: the function torch's tensors are rebuilt with here keeps its own, and archives read later are
    read here as before. (With ``__defaults__ = (True,)``, every later tensor would have gone to torch's reader.)"""
    rebuild = training.tensor_archive._rebuild
    before = (rebuild.__defaults__, dict(vars(rebuild)))
    gadget = (
        b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}X"
        + len(name).to_bytes(4, "little")
        + name.encode()
        + value
        + b"sb0"
    )
    planted = gadget + _tensor_pickle(6, (6,))[2:]  # then the tensor's own pickle, after its protocol
    archive = _rewritten(_archive(torch.arange(6.0)), {"data.pkl": planted})
    try:
        _outcome(saved, archive)
        after = (rebuild.__defaults__, dict(vars(rebuild)))
    finally:
        rebuild.__defaults__ = before[0]
        for added in set(vars(rebuild)) - set(before[1]):
            delattr(rebuild, added)
    assert after == before
    plain = _archive(torch.arange(6.0))
    _same(_read_itself(_placed(plain), _PAD, len(plain)), torch.arange(6.0))


def test_with_an_extension_registered_in_copyreg_it_reads_nothing_itself() -> None:
    """The C unpickler resolves an EXT opcode from copyreg's registry without asking find_class."""
    archive = _archive(torch.arange(6.0))
    _read_itself(_placed(archive), _PAD, len(archive))
    copyreg.add_extension("collections", "OrderedDict", 240)
    try:
        with pytest.raises(_NotReadHereError):
            _read_itself(_placed(archive), _PAD, len(archive))
        _same(saved(_placed(archive), _PAD, len(archive)), torch.arange(6.0))
    finally:
        copyreg.remove_extension("collections", "OrderedDict", 240)


@pytest.mark.parametrize("key", [("0",), "0" * 21, 0], ids=["tuple", "long", "int"])
def test_a_storage_named_as_torch_never_names_one_is_refused_by_both_readers(
    key: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused without torch's reader, which hashes whatever the key is (a deep tuple crashes it)."""
    archive = _rewritten(_archive(torch.arange(6.0)), {"data.pkl": _tensor_pickle(6, (6,), key=key)})
    monkeypatch.setattr(training.tensor_archive, "_read_by_torch", lambda *_: pytest.fail("torch's reader was asked"))
    with pytest.raises(RefusedError, match=r"names a storage as torch\.save never does"):
        saved(_placed(archive), _PAD, len(archive))


def _refiled(archive: bytes, change: str) -> bytes:
    """`archive` without its version record, with a second data record of the same name, or with one record
    in another folder."""
    source, target = zipfile.ZipFile(io.BytesIO(archive)), io.BytesIO()
    with zipfile.ZipFile(target, "w") as rewritten, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of the duplicate name
        for info in source.infolist():
            inner = info.filename.partition("/")[2]
            if change == "no-version" and inner == "version":
                continue
            name = f"other/{inner}" if change == "two-folders" and inner == "byteorder" else info.filename
            rewritten.writestr(name, source.read(info))
            if change == "duplicate" and inner == "data/0":
                rewritten.writestr(info.filename, bytes(len(source.read(info))))
    return target.getvalue()


@pytest.mark.parametrize("change", ["no-version", "duplicate", "two-folders"])
def test_records_torch_s_reader_would_read_otherwise_are_not_read_here(change: str) -> None:
    archive = _refiled(_archive(torch.arange(6.0)), change)
    with pytest.raises(_NotReadHereError):
        _read_itself(_placed(archive), _PAD, len(archive))
    assert _outcome(saved, archive) == _outcome(training.tensor_archive._read_by_torch, archive)


def test_bytes_outside_the_buffer_are_refused() -> None:
    archive = _archive(torch.arange(6.0))
    data = _placed(archive)
    for offset, length in [(-1, len(archive)), (_PAD, len(data))]:
        with pytest.raises(ValueError, match="are not all in the"):
            saved(data, offset, length)


def _written(tensor: torch.Tensor) -> bytes:
    stream = io.BytesIO()
    training.tensor_archive.write(tensor, stream)
    return stream.getvalue()


def _to_write() -> list[torch.Tensor]:
    return [
        *_tensors(),
        torch.randn(3, requires_grad=True),
        torch.nn.Parameter(torch.randn(2)),
        torch.randn(3).to(torch.float8_e4m3fn),
        torch.arange(9).to(torch.uint16),
        torch.randn(training.tensor_archive._LAYOUT_BYTES // 4),  # as large as a learnt layout's tensors may not be
    ]


@pytest.mark.parametrize("crc32", [False, True])
def test_it_writes_each_tensor_as_torch_save_does_byte_for_byte(monkeypatch: pytest.MonkeyPatch, crc32: bool) -> None:
    monkeypatch.setattr(training.tensor_archive, "_LAYOUTS", {})
    with serialization_config.patch({"save.compute_crc32": crc32}):
        for tensor in _to_write() + _to_write():  # the first of a layout learns it; the second has other values
            assert _written(tensor) == _archive(tensor)
    # Plain tensors that are all of their storage, without CRC-32s: a layout for each dtype and shape.
    assert len(training.tensor_archive._LAYOUTS) == (0 if crc32 else 12)


def test_it_runs_torch_s_writer_once_for_each_layout_and_three_times_to_learn_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(training.tensor_archive, "_LAYOUTS", {})
    tensors = [torch.randn(768) for _ in range(20)] + [torch.randn(3, 4) for _ in range(5)]
    with serialization_config.patch({"save.compute_crc32": False}):
        expected = [_archive(tensor) for tensor in tensors]
        calls = []
        save = torch.save
        monkeypatch.setattr(torch, "save", lambda value, stream: calls.append(value.shape) or save(value, stream))
        assert [_written(tensor) for tensor in tensors] == expected
    # The tensor's, then as many 0x00 bytes and as many 0xFF bytes.
    assert calls == [torch.Size([768])] * 3 + [torch.Size([3, 4])] * 3


def test_a_layout_whose_bytes_around_the_storage_depend_on_its_values_is_not_learnt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should torch ever write a record that depends on a tensor's values (as a CRC-32 does), the archive of as
    many zeros differs around the storage, and each tensor of that layout goes to torch's writer."""
    monkeypatch.setattr(training.tensor_archive, "_LAYOUTS", {})
    save = torch.save

    def save_with_a_sum(value: torch.Tensor, stream: Any) -> None:
        save({"tensor": value, "sum": float(value.sum())}, stream)

    monkeypatch.setattr(torch, "save", save_with_a_sum)
    with serialization_config.patch({"save.compute_crc32": False}):
        for tensor in (torch.zeros(16), torch.randn(16), torch.randn(16)):  # a first of zeros proves nothing
            expected = io.BytesIO()
            save_with_a_sum(tensor, expected)
            assert _written(tensor) == expected.getvalue()
    assert training.tensor_archive._LAYOUTS == {}


@pytest.mark.parametrize("crc32", [False, True])
@pytest.mark.parametrize("index", range(len(_tensors())))
def test_an_archive_laid_out_as_one_read_before_is_read_as_that_one_was_on_its_own_bytes(
    index: int, crc32: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CRC-32s, as a checkpoint saves its items, archives of one layout differ only in their storage's
    bytes: the first is unpickled, the rest are not. With them, only an archive the same in every byte is."""
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {}, raising=False)  # none read yet
    first, other = _tensors()[index], _tensors()[index]  # the random ones differ
    with serialization_config.patch({"save.compute_crc32": crc32}):
        archives = [_archive(tensor) for tensor in (first, other, first)]
    unpickled = []
    load = training.tensor_archive._TensorUnpickler.load
    monkeypatch.setattr(
        training.tensor_archive._TensorUnpickler, "load", lambda self: unpickled.append(1) or load(self)
    )
    for archive in archives:
        data = _placed(archive)
        found = saved(data, _PAD, len(archive))
        _same(found, torch.load(io.BytesIO(archive), weights_only=True))
        start = data.data_ptr() + _PAD
        pointer = found.untyped_storage().data_ptr()
        assert start <= pointer and pointer + found.untyped_storage().nbytes() <= start + len(archive)  # no copy
    assert len(unpickled) == (len(set(archives)) if crc32 else 1)


def test_an_archive_that_differs_from_one_read_before_outside_its_storage_is_read_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {})
    with serialization_config.patch({"save.compute_crc32": False}):
        archive = _archive(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    saved(_placed(archive), _PAD, len(archive))
    (layout,) = training.tensor_archive._READ_LAYOUTS[len(archive)]
    # The same bytes but for the shape in the pickle, (2, 4) not (3, 4); then for the central directory's end.
    pickled = archive.index(b"K\x03K\x04")
    reshaped = archive[:pickled] + b"K\x02K\x04" + archive[pickled + 4 :]
    found = saved(_placed(reshaped), _PAD, len(reshaped))
    assert found.shape == (2, 4) and torch.equal(found, torch.arange(8, dtype=torch.float32).reshape(2, 4))
    comment = archive[: len(archive) - 2] + b"\x01\x00"  # the directory's comment length: not read here
    with pytest.raises(_NotReadHereError):
        _read_itself(_placed(comment), _PAD, len(comment))
    assert training.tensor_archive._read_by_layout(_placed(comment), _PAD, len(comment)) is None
    assert len(training.tensor_archive._READ_LAYOUTS[len(archive)]) == 2  # the reshaped one's, learnt
    assert training.tensor_archive._READ_LAYOUTS[len(archive)][0] == layout


def test_archives_with_crc32s_are_read_in_full_and_learnt_up_to_a_few_a_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each archive with CRC-32s of other values differs around its storage: a load of many compares each with
    at most a few read before, not with all of them."""
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {})
    archives = [_archive(torch.full((16,), float(i))) for i in range(12)]
    for index, archive in enumerate(archives):
        assert torch.equal(saved(_placed(archive), _PAD, len(archive)), torch.full((16,), float(index)))
    learnt = training.tensor_archive._READ_LAYOUTS
    assert list(learnt) == [len(archives[0])]
    assert len(learnt[len(archives[0])]) == training.tensor_archive._LAYOUTS_A_LENGTH


def test_tensors_of_one_shape_whose_strides_differ_are_written_as_torch_save_writes_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A contiguous tensor's stride along a dimension of one element can be anything, and torch.save writes it."""
    monkeypatch.setattr(training.tensor_archive, "_LAYOUTS", {})
    column, row_turned = torch.zeros(4, 1), torch.randn(1, 4).t()
    assert column.is_contiguous() and row_turned.is_contiguous() and column.stride() != row_turned.stride()
    with serialization_config.patch({"save.compute_crc32": False}):
        for tensor in (column, row_turned, column, row_turned):
            assert _written(tensor) == _archive(tensor)


def test_a_quantized_tensor_is_written_by_torch_save() -> None:
    tensor = torch.quantize_per_tensor(torch.randn(8), 0.1, 0, torch.qint8)
    with serialization_config.patch({"save.compute_crc32": False}):
        assert _written(tensor) == _archive(tensor)
        assert _written(tensor) == _archive(tensor)


def test_no_layout_is_learnt_of_an_archive_whose_storage_shares_bytes_with_another_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bytes of the storage's record that another record, a local header or the central directory also holds
    are read as more than the storage: an archive differing only there may hold another thing."""
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {})
    with serialization_config.patch({"save.compute_crc32": False}):
        archive = _archive(torch.arange(16, dtype=torch.uint8))
    view = memoryview(archive)
    records = training.tensor_archive._records(view)
    start, size = records["data/0"]
    loaded = _read_itself(_placed(archive), _PAD, len(archive))
    monkeypatch.setattr(training.tensor_archive, "_READ_LAYOUTS", {})
    unpickler = argparse.Namespace(loaded={"0": None})
    overlapping = [("extra", start + size - 1, start + size + 2), ("extra", start - 30, start + 1)]
    for name, header, end in overlapping:
        shared = training.tensor_archive._records(view)
        shared[name], shared.headers[name] = (header + 30, end - header - 30), header
        training.tensor_archive._learn(view, shared, unpickler, loaded)  # type: ignore[arg-type]
    shared = training.tensor_archive._records(view)
    shared.directory = start + 1
    training.tensor_archive._learn(view, shared, unpickler, loaded)  # type: ignore[arg-type]
    assert training.tensor_archive._READ_LAYOUTS == {}
    training.tensor_archive._learn(view, records, unpickler, loaded)  # type: ignore[arg-type]
    assert len(training.tensor_archive._READ_LAYOUTS[len(archive)]) == 1

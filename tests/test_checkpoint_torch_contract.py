"""What torch's own serialization tests ask of save and load that pyfastensor once did otherwise:
files whose CRC-32s were never computed or went stale, torch's CRC option, file-likes, the
weights-only environment variables."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from mmap import MAP_PRIVATE, MAP_SHARED

import pytest
import torch

import pyfastensor
from pyfastensor import _torch


def _data_offset(path, name: str) -> int:
    """Where record ``name``'s bytes start in the zip at ``path`` (after its local header)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + name_len + extra_len


@pytest.mark.skipif(not hasattr(torch.serialization, "skip_data"), reason="torch.serialization.skip_data() is "
                    "torch 2.5 and later")
def test_a_file_written_under_skip_data_loads_once_its_bytes_are_filled_in(tmp_path):
    """torch's documented workflow: save the metadata only (records' CRC-32 fields 0, bytes not
    written), then fill each storage's bytes in place; torch.load reads them, and so must we. The
    records that carry a CRC-32 (the pickle) are still checked."""
    state = {"w": torch.randn(64, 8), "b": torch.arange(10.0)}
    path = tmp_path / "meta.pt"
    with torch.serialization.skip_data():
        _torch.torch_save(state, path)
    with zipfile.ZipFile(path) as z:
        records = {i.filename: i.CRC for i in z.infolist()}
    prefix = next(iter(records)).split("/")[0]
    data = [n for n in records if "/data/" in n]
    assert data and all(records[n] == 0 for n in data) and records[f"{prefix}/data.pkl"] != 0
    with open(path, "r+b") as f:  # fill the storages' records, as a program of this workflow does
        for key, t in (("0", state["w"]), ("1", state["b"])):
            f.seek(_data_offset(path, f"{prefix}/data/{key}"))
            f.write(t.numpy().tobytes())
    for mmap in (False, True):
        got = pyfastensor.load(path, mmap=mmap)
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    # The pickle's record carries a CRC-32: damage there is still caught.
    pkl = _data_offset(path, f"{prefix}/data.pkl")
    with open(path, "r+b") as f:
        f.seek(pkl + 40)
        byte = f.read(1)
        f.seek(pkl + 40)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(pyfastensor.CorruptFileError, match="data.pkl"):
        pyfastensor.load(path)


@pytest.mark.skipif(not hasattr(torch.serialization, "set_crc32_options"),
                    reason="torch.serialization.set_crc32_options is torch 2.6 and later")
def test_set_crc32_options_false_writes_no_crc32_and_loads(tmp_path):
    state = {"w": torch.randn(300, 300), "b": torch.ones(3)}  # one record large enough to go direct
    torch.serialization.set_crc32_options(False)
    try:
        pyfastensor.save(state, tmp_path / "nocrc.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(tmp_path / "nocrc.pt") as z:
        assert {i.CRC for i in z.infolist()} == {0}
    for load in (pyfastensor.load, _torch.torch_load):
        got = load(tmp_path / "nocrc.pt")
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    pyfastensor.save(state, tmp_path / "crc.pt")
    with zipfile.ZipFile(tmp_path / "crc.pt") as z:
        assert all(i.CRC != 0 for i in z.infolist() if i.file_size)


@pytest.fixture
def shared_mmap():
    torch.serialization.set_default_mmap_options(MAP_SHARED)
    yield
    torch.serialization.set_default_mmap_options(MAP_PRIVATE)


def test_a_file_changed_through_a_shared_mapping_loads_mapped_with_a_warning(tmp_path, shared_mmap):
    """torch's mmap test: a load mapped shared, changed in place, then loaded mapped again shows
    the change. The CRC-32 no longer matches: the mapped load says so in a warning and loads; a
    load that copies refuses, naming the record and the way to take the bytes as they are."""
    path = tmp_path / "m.pt"
    pyfastensor.save(torch.nn.Linear(3, 5).state_dict(), path)
    first = pyfastensor.load(path, mmap=True)
    first["weight"][0][0] = 0
    with pytest.warns(UserWarning, match="mapped shared"):
        again = pyfastensor.load(path, mmap=True)
    assert again["weight"][0][0].item() == 0 and torch.equal(again["weight"], first["weight"])
    with pytest.raises(pyfastensor.CorruptFileError, match=r"archive/data/\d.*edited in place.*tensor \['weight'\]"):
        pyfastensor.load(path, mmap=False)
    assert pyfastensor.load(path, verify=False)["weight"][0][0].item() == 0


def test_a_changed_file_mapped_privately_still_raises(tmp_path):
    path = tmp_path / "m.pt"
    pyfastensor.save({"w": torch.ones(1000)}, path)
    with zipfile.ZipFile(path) as z:
        record = next(n for n in z.namelist() if n.endswith("/data/0"))
    with open(path, "r+b") as f:
        f.seek(_data_offset(path, record) + 8)
        f.write(b"\x00\x00\x00\x00")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(pyfastensor.CorruptFileError, match=record):
            pyfastensor.load(path, mmap=True)


def test_a_file_like_without_a_callable_write_is_refused_as_torch_refuses_it(tmp_path):
    x = torch.rand(10)
    with pytest.raises(AttributeError):
        pyfastensor.save("foo", x)  # a tensor: no write at all
    x.write = "bar"
    with pytest.raises(TypeError, match="callable 'write'"):
        pyfastensor.save("foo", x)
    x.write = str.__add__  # callable, but not a writer
    with pytest.raises(TypeError):
        pyfastensor.save("foo", x)


class _Unseekable:
    def __init__(self, data: bytes) -> None:
        self._b = io.BytesIO(data)
        self.read = self._b.read


def test_an_unseekable_file_like_gets_torchs_error():
    buf = io.BytesIO()
    pyfastensor.save(torch.ones(2), buf)
    with pytest.raises(AttributeError, match="seekable"):
        pyfastensor.load(_Unseekable(buf.getvalue()))


def test_a_file_like_is_read_through_readinto_where_it_has_one():
    buf = io.BytesIO()
    pyfastensor.save({"a": torch.arange(10)}, buf)
    calls: dict[str, list[int]] = {"read": [], "readinto": []}

    class ReadInto(io.BytesIO):
        def readinto(self, b):  # noqa: ANN001
            n = super().readinto(b)
            calls["readinto"].append(n)
            return n

        def read(self, size=-1):  # noqa: ANN001
            out = super().read(size)
            calls["read"].append(len(out))
            return out

    assert torch.equal(pyfastensor.load(ReadInto(buf.getvalue()))["a"], torch.arange(10))
    assert sum(calls["readinto"]) == len(buf.getvalue()), calls
    assert max(calls["read"], default=0) <= 4, "read() carried more than the zip magic"


class _Unsafe:
    """A class the weights-only unpickler refuses."""

    def __init__(self) -> None:
        self.x = 1


def test_torch_force_no_weights_only_load_warns_and_loads_as_torch_does(tmp_path, monkeypatch):
    path = tmp_path / "unsafe.pt"
    pyfastensor.save({"o": _Unsafe()}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected"):
        assert pyfastensor.load(path)["o"].x == 1
    with pytest.raises(Exception, match="Weights only load"):  # an explicit weights_only wins
        pyfastensor.load(path, weights_only=True)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(RuntimeError, match="Only one of"):
        pyfastensor.load(path)

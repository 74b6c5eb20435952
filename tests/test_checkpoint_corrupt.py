"""Verified loads: damage gives CorruptFileError naming file and record, never wrong tensors."""

from __future__ import annotations

import io
import shutil
import zipfile

import pytest
import torch
from checkpoint_helpers import assert_same

import pyfastensor
from pyfastensor import CorruptFileError


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"model": {"a": torch.randn(1000, generator=g), "b": torch.randn(64, 64, generator=g)},
            "step": torch.tensor(5), "big": torch.randn(600_000, generator=g)}


def data_span(path, name: str) -> tuple[int, int]:
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        h = f.read(30)
    start = info.header_offset + 30 + int.from_bytes(h[26:28], "little") + int.from_bytes(h[28:30], "little")
    return start, info.file_size


def flip(path, off: int) -> None:
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ck.pt"
    pyfastensor.save(state(), path)
    return path


@pytest.mark.parametrize("record,key", [("archive/data/1", "['model']['b']"), ("archive/data/3", "['big']")])
def test_flipped_data_byte(saved, record, key):
    start, size = data_span(saved, record)
    flip(saved, start + size // 2)
    with pytest.raises(CorruptFileError) as e:
        pyfastensor.load(saved)
    msg = str(e.value)
    assert str(saved) in msg and record in msg and key in msg and "CRC-32" in msg
    # verify=False is the opt-out: it loads (with the damaged value).
    got = pyfastensor.load(saved, verify=False)
    assert got["step"] == 5


@pytest.mark.parametrize("opened", ["BytesIO", "open file"])
def test_damage_in_a_file_like_names_it_not_a_copy(saved, opened):
    start, size = data_span(saved, "archive/data/3")
    flip(saved, start + size // 2)
    f = io.BytesIO(saved.read_bytes()) if opened == "BytesIO" else open(saved, "rb")  # noqa: SIM115
    with f, pytest.raises(CorruptFileError) as e:
        pyfastensor.load(f)
    msg = str(e.value)
    assert ("<_io.BytesIO>" if opened == "BytesIO" else repr(str(saved))) in msg
    assert "archive/data/3" in msg and "['big']" in msg and "spooled" not in msg


def test_damage_found_by_a_lazy_load_names_the_key(saved):
    start, size = data_span(saved, "archive/data/3")
    flip(saved, start + size // 2)
    with pyfastensor.open(saved) as ck:
        assert torch.equal(ck.load(["step"])["step"], torch.tensor(5)), "an intact record still loads"
        with pytest.raises(CorruptFileError) as e:
            ck.load(["big"])
    msg = str(e.value)
    assert str(saved) in msg and "archive/data/3" in msg and "['big']" in msg


def test_flipped_data_byte_mapped(saved):
    """mmap=True checks CRC-32s too (torch's does not): the damaged record is named."""
    start, size = data_span(saved, "archive/data/3")
    flip(saved, start + size - 1)
    with pytest.raises(CorruptFileError) as e:
        pyfastensor.load(saved, mmap=True)
    msg = str(e.value)
    assert str(saved) in msg and "archive/data/3" in msg and "['big']" in msg and "CRC-32" in msg
    got = pyfastensor.load(saved, mmap=True, verify=False)  # the opt-out maps it as torch does
    assert torch.equal(got["model"]["b"], state()["model"]["b"])
    assert not torch.equal(got["big"], state()["big"])


def test_flipped_pickle_byte(saved):
    start, size = data_span(saved, "archive/data.pkl")
    flip(saved, start + 10)
    with pytest.raises(CorruptFileError, match="archive/data.pkl"):
        pyfastensor.load(saved)


def test_flipped_central_directory_bytes(saved, tmp_path):
    with zipfile.ZipFile(saved) as z:
        infos = z.infolist()
    last = infos[-1]
    cd_start = data_span(saved, last.filename)[0] + last.file_size + 16
    size = saved.stat().st_size
    for off in range(cd_start, size, 3):
        victim = tmp_path / "v.pt"
        shutil.copy(saved, victim)
        flip(victim, off)
        with pytest.raises(CorruptFileError) as e:
            pyfastensor.load(victim)
        assert str(victim) in str(e.value)
    # A flip in one entry's fields names that entry's record.
    entry = cd_start  # first entry: archive/data.pkl, its CRC field at +16
    victim = tmp_path / "v.pt"
    shutil.copy(saved, victim)
    flip(victim, entry + 16)
    with pytest.raises(CorruptFileError, match='"archive/data.pkl"'):
        pyfastensor.load(victim)


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("record", ["archive/data/0", "archive/data/3"])
def test_truncated_file_names_record(saved, record, mmap):
    start, size = data_span(saved, record)
    with open(saved, "r+b") as f:
        f.truncate(start + size // 2)
    with pytest.raises(CorruptFileError) as e:
        pyfastensor.load(saved, mmap=mmap)
    assert "truncated" in str(e.value) and record in str(e.value) and str(saved) in str(e.value)


def test_truncated_at_every_region(saved, tmp_path):
    size = saved.stat().st_size
    for cut in (0, 1, 30, 100, 5000, size // 2, size - 100, size - 1):
        victim = tmp_path / "v.pt"
        shutil.copy(saved, victim)
        with open(victim, "r+b") as f:
            f.truncate(cut)
        if cut == 0:
            for mmap in (False, True):  # an EOFError as torch's, that says what is wrong and where
                with pytest.raises(pyfastensor.EndOfFileError, match=f"cannot load {victim}: the file is empty"):
                    pyfastensor.load(victim, mmap=mmap)
            with pytest.raises(pyfastensor.EndOfFileError, match="cannot load from <_io.BytesIO>: nothing to read"):
                pyfastensor.load(io.BytesIO())
            continue
        if cut < 4:
            # Not recognisably a zip: handed to torch.load, which refuses it.
            with pytest.raises(Exception):  # noqa: B017
                pyfastensor.load(victim)
            continue
        with pytest.raises(CorruptFileError):
            pyfastensor.load(victim)


def test_intact_file_still_loads(saved):
    assert_same(pyfastensor.load(saved), state())

"""pyfastensor.safetensors: files the safetensors package reads and validates, and vice versa."""

from __future__ import annotations

import json
import struct

import pytest
import safetensors.torch as st
import torch
from checkpoint_helpers import assert_same
from safetensors import safe_open

import pyfastensor
from pyfastensor import CorruptFileError, UnsupportedError


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(pyfastensor.safetensors.DTYPES.values()):
        raw = torch.randint(0, 256, (3 * 5 * torch.empty(0, dtype=dtype).element_size(),),
                            dtype=torch.uint8, generator=g)
        out[f"t{i}"] = raw.view(dtype).reshape(3, 5).clone()
    out["big"] = torch.randn(700_001, generator=g)
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 4)
    return out


def test_round_trips_with_the_safetensors_package(tmp_path):
    t = tensors()
    pyfastensor.safetensors.save_file(t, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    with safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert sorted(f.keys()) == sorted(t)
    theirs = st.load_file(tmp_path / "ours.safetensors")
    for k in t:
        assert_same(theirs[k], t[k])
    st.save_file(t, tmp_path / "theirs.safetensors")
    ours = pyfastensor.safetensors.load_file(tmp_path / "theirs.safetensors")
    for k in t:
        assert_same(ours[k], t[k])
    with open(tmp_path / "ours.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    assert (8 + n) % 4096 == 0
    assert [p.name for p in tmp_path.iterdir() if "pyfastensor-tmp" in p.name] == []


def test_refuses_what_safetensors_refuses(tmp_path):
    base = torch.zeros(10)
    with pytest.raises(RuntimeError, match="share memory"):
        pyfastensor.safetensors.save_file({"a": base, "b": base[2:5]}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        pyfastensor.safetensors.save_file({"a": torch.zeros(4, 4).t()}, tmp_path / "x.safetensors")
    # Disjoint views of one storage are fine, as in safetensors.
    pyfastensor.safetensors.save_file({"a": base[:5], "b": base[5:]}, tmp_path / "y.safetensors")
    assert torch.equal(st.load_file(tmp_path / "y.safetensors")["b"], base[5:])


def test_damaged_files(tmp_path):
    path = tmp_path / "x.safetensors"
    pyfastensor.safetensors.save_file(tensors(), path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(CorruptFileError, match="truncated"):
        pyfastensor.safetensors.load_file(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(CorruptFileError):
        pyfastensor.safetensors.load_file(path)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu") or not hasattr(torch, "float4_e2m1fn_x2"),
                    reason="torch 2.8 and later have float8_e8m0fnu and float4_e2m1fn_x2")
def test_mxfp8_scales_and_fp4_round_trip_with_the_safetensors_package(tmp_path):
    g = torch.Generator().manual_seed(1)
    t = {"scale": torch.randint(0, 256, (4, 2), dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu),
         "q": torch.randint(0, 256, (2, 3), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2),
         "none": torch.zeros(5, 0, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
         "w": torch.randn(3, generator=g)}
    st.save_file(t, tmp_path / "theirs.safetensors")
    pyfastensor.safetensors.save_file(t, tmp_path / "ours.safetensors")
    for path in (tmp_path / "theirs.safetensors", tmp_path / "ours.safetensors"):
        for got in (pyfastensor.safetensors.load_file(path), st.load_file(path)):
            for k, v in t.items():
                assert (got[k].dtype, got[k].shape) == (v.dtype, v.shape), (path.name, k)
                assert torch.equal(_as_bytes(got[k]), _as_bytes(v)), (path.name, k)
        with safe_open(path, "np") as f:  # F4 counts elements in the header: twice torch's last dimension
            assert f.get_slice("q").get_shape() == [2, 6] and f.get_slice("q").get_dtype() == "F4"
            assert f.get_slice("scale").get_dtype() == "F8_E8M0"
    with pytest.raises(ValueError, match="Key `s`: a 0-dim torch.float4_e2m1fn_x2 tensor has no safetensors shape"):
        pyfastensor.safetensors.save_file({"s": torch.tensor(7, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)},
                                          tmp_path / "s.safetensors")


def _handwritten(path, dtype: str, shape: list[int], nbytes: int) -> None:
    header = {"ok": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "w": {"dtype": dtype, "shape": shape, "data_offsets": [1, 1 + nbytes]}}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(1 + nbytes))


@pytest.mark.parametrize("dtype,shape,nbytes,says", [
    ("F3_NEW", [2], 2, r'tensor "w": unknown dtype "F3_NEW"'),
    ("F6_E2M3", [4], 3, r"tensor 'w' has dtype F6_E2M3, which torch .* has no dtype for"),
    ("F4", [2, 3], 3, r"tensor 'w' of dtype F4 has shape \[2, 3\]: .* the last dimension must be even"),
])
def test_dtypes_it_cannot_load_are_unsupported_not_corrupt(tmp_path, dtype, shape, nbytes, says):
    if dtype == "F4" and not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch 2.8 and later have float4_e2m1fn_x2")
    path = tmp_path / "new.safetensors"
    _handwritten(path, dtype, shape, nbytes)
    if dtype != "F3_NEW":
        with safe_open(path, "np") as f:  # a valid file, as the safetensors package sees it
            assert sorted(f.keys()) == ["ok", "w"]
    with pytest.raises(UnsupportedError, match=f"{path}.*{says}") as e:
        pyfastensor.safetensors.load_file(path)
    assert not isinstance(e.value, CorruptFileError)


@pytest.mark.parametrize("n", [205, 214, 220, 252])
def test_saves_to_names_up_to_name_max(tmp_path, n):
    path = tmp_path / ("c" * n + ".st")  # at most 255 bytes: legal, and torch.save writes it
    t = {"w": torch.arange(6.0), "i": torch.arange(3)}
    pyfastensor.safetensors.save_file(t, path)
    got = st.load_file(path)
    assert torch.equal(got["w"], t["w"]) and torch.equal(got["i"], t["i"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    with pytest.raises(pyfastensor.FastensorError, match=r"cannot write .*/c{256}\.st: file name too long"):
        pyfastensor.safetensors.save_file(t, tmp_path / ("c" * 256 + ".st"))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_load_reads_the_file_whose_header_it_parsed_while_a_save_replaces_it(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    old = tensors()
    new = {"other": torch.arange(10.0), "big": torch.full((300_000,), 3.0)}
    pyfastensor.safetensors.save_file(old, path)
    real = pyfastensor.safetensors._files.read_raw

    def replace_then(*args, **kwargs):
        pyfastensor.safetensors.save_file(new, path)  # a rename, mid-load
        return real(*args, **kwargs)

    monkeypatch.setattr(pyfastensor.safetensors._files, "read_raw", replace_then)
    got = pyfastensor.safetensors.load_file(path)
    assert_same({k: got[k] for k in old}, old)  # not the new file's bytes at the old offsets
    assert got.keys() == old.keys()
    monkeypatch.undo()
    got = pyfastensor.safetensors.load_file(path)
    assert_same({k: got[k] for k in new}, new)


def test_a_load_to_cuda_goes_through_the_pinned_ring(tmp_path, monkeypatch):
    from cuda_fakes import FakeCuda

    from pyfastensor import _device
    from pyfastensor.checkpoint import _native

    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", "1M")  # 4 slots of 256 KiB: "big" in 11 pieces
    t = tensors()
    st.save_file(t, tmp_path / "theirs.safetensors")
    reads: list[int] = []
    real = _native.RingRead.of_file.__func__

    def spy(cls, path, slots, slot_bytes, fills, parts, **kw):
        reads.append(len(fills))
        # as in the file, modulo the memory alignment: O_DIRECT moves the middle in place
        assert all((at - off) % 4096 == 0 for _, off, _, at in parts)
        assert any(off % 4096 for _, off, _, _ in parts), "safetensors' own layout: not page-aligned"
        return real(cls, path, slots, slot_bytes, fills, parts, **kw)

    monkeypatch.setattr(_native.RingRead, "of_file", classmethod(spy))
    fake = FakeCuda()  # its side-stream copies land only once their event is waited for
    with _device.using(fake):
        got = pyfastensor.safetensors.load_file(tmp_path / "theirs.safetensors", device="cuda:1")
        again = pyfastensor.safetensors.load_file(tmp_path / "theirs.safetensors", device=1)
    assert list(got) == list(st.load_file(tmp_path / "theirs.safetensors"))
    for k in t:
        assert_same(got[k], t[k])
        assert_same(again[k], t[k])
    assert len(reads) == 2 and reads[0] > 4, "one ring read a load, more fills than slots"
    assert {loc for _, loc in fake.empties} == {"cuda:1"}
    assert fake.pinned_calls == [1 << 20], "the ring is pinned once per process"

"""pyfastensor.dcp: torch.distributed.checkpoint storage through our engines.

Single-process saves and loads (no process group) check the format, the
checksums and the commit; spawned gloo groups of 2 and 4 ranks check
resharding (save with 4, load with 2 into Shard(1)/Replicate, and with none
into plain tensors), async_save, an optimizer through the state_dict
helpers, and the shared dictionaries.
"""

from __future__ import annotations

import errno
import json
import pickle
import random
import re
import signal
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from dcp_helpers import (
    async_and_optimizer,
    dictionaries,
    full_state,
    load_resharded,
    save_sharded,
    spawn,
)
from torch.distributed.checkpoint.api import CheckpointException

from pyfastensor import CorruptFileError, UnsupportedError, _torch
from pyfastensor.dcp import Reader, Record, Writer, _staging, _writer
from pyfastensor.dcp._reader import byte_runs

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state() -> dict[str, Any]:
    base = torch.arange(4000, dtype=torch.float32)
    return {
        "w": torch.randn(64, 33),
        "bf": torch.randn(9, 7).to(torch.bfloat16),
        "i64": torch.randint(-(2**50), 2**50, (77,), dtype=torch.int64),
        "i8": torch.randint(-128, 127, (5000,), dtype=torch.int8),
        "mask": torch.rand(100) > 0.5,
        "t": torch.randn(30, 20).t(),        # not contiguous
        "view": base[1000:1500],             # a view into a larger storage
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "meta": {"step": 11, "lr": [0.1, 0.01], "name": "run"},
    }


def blank(sd: dict[str, Any]) -> dict[str, Any]:
    out = {k: torch.zeros_like(v.contiguous()) if isinstance(v, torch.Tensor) else None for k, v in sd.items()}
    out["meta"] = {"step": 0, "lr": [], "name": ""}
    return out


def assert_loaded(got: dict[str, Any], sd: dict[str, Any]) -> None:
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype, k
            assert torch.equal(got[k], v), k
        else:
            assert got[k] == v, k


def metadata(path: Path) -> Any:
    with open(path / ".metadata", "rb") as f:
        return pickle.load(f)


def data_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.suffix == ".pfd")


def test_round_trip_without_process_group(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    got = blank(sd)
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, sd)


def test_async_save_without_process_group(tmp_path):
    sd = state()
    dcp.async_save(sd, storage_writer=Writer(tmp_path)).result()
    got = blank(sd)
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, sd)


def test_checkpoint_of_filesystemwriter_is_refused_by_name(tmp_path):
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(tmp_path))
    with pytest.raises(CheckpointException, match="not a checkpoint of pyfastensor.dcp.Writer"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=Reader(tmp_path))


def test_records_are_raw_aligned_and_checksummed(tmp_path):
    """Each item's bytes lie in the rank's data file as they are in memory, on a 4 KiB
    boundary, with the CRC-32 and page sums of exactly those bytes."""
    sd = state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    files = data_files(tmp_path)
    assert len(files) == 1 and files[0].startswith("__0_0_")
    raw = (tmp_path / files[0]).read_bytes()
    md = metadata(tmp_path)
    seen = set()
    for index, rec in md.storage_data.items():
        assert isinstance(rec, Record)
        assert rec.relative_path == files[0]
        assert rec.offset % 4096 == 0
        data = raw[rec.offset:rec.offset + rec.length]
        assert zlib.crc32(data) == rec.crc32, index.fqn
        pages = np.frombuffer(rec.pages, dtype="<u4")
        assert list(pages) == [zlib.crc32(data[k:k + 4096]) for k in range(0, len(data), 4096)]
        if rec.dtype != "bytes":
            t = sd[index.fqn].contiguous()
            assert data == t.reshape(-1).view(torch.uint8).numpy().tobytes(), index.fqn
            assert rec.dtype == str(t.dtype) and rec.shape == tuple(t.shape)
        seen.add(index.fqn)
    assert {"w", "bf", "t", "view", "meta.step", "meta.name"} <= seen


def test_resave_replaces_the_data_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    dcp.save(state(), storage_writer=Writer(tmp_path))
    first = data_files(tmp_path)
    sd = state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    second = data_files(tmp_path)
    assert len(second) == 1 and second != first
    assert (tmp_path / "notes.txt").read_text() == "mine"
    got = blank(sd)
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, sd)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_damaged_item_names_file_item_and_offset(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    md = metadata(tmp_path)
    rec = next(r for i, r in md.storage_data.items() if i.fqn == "w")
    f = tmp_path / rec.relative_path
    _flip(f, rec.offset + 5000)
    with pytest.raises(CheckpointException) as ei:  # DCP's wrapper of each rank's exception
        dcp.load(blank(sd), storage_reader=Reader(tmp_path))
    msg = str(ei.value)
    assert CorruptFileError.__name__ in msg
    assert str(f) in msg and 'record "w' in msg and f"at offset {rec.offset}" in msg and "CRC-32" in msg
    # Unchecked, the damaged bytes arrive as they are.
    got = blank(sd)
    dcp.load(got, storage_reader=Reader(tmp_path, verify=False))
    assert not torch.equal(got["w"], sd["w"])
    assert torch.equal(got["bf"], sd["bf"])


def test_truncated_data_file(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    f = tmp_path / data_files(tmp_path)[0]
    with open(f, "r+b") as fh:
        fh.truncate(8192)
    with pytest.raises(CheckpointException, match="truncated"):
        dcp.load(blank(sd), storage_reader=Reader(tmp_path))


def test_missing_checkpoint_is_named(tmp_path):
    if not _torch.DCP_HIDES_METADATA_ERRORS:
        with pytest.raises(CheckpointException, match=r"no checkpoint here \(no \.metadata"):
            dcp.load({"w": torch.zeros(1)}, storage_reader=Reader(tmp_path))
        return
    # torch 2.9 to 2.11 swallow the reader's error and fail on the missing metadata (2.9's
    # "assert metadata is not None", later ones' "metadata is None"): it is said in a warning
    with pytest.warns(RuntimeWarning, match=r"no checkpoint here \(no \.metadata"):
        with pytest.raises(CheckpointException, match="metadata is (not )?None"):
            dcp.load({"w": torch.zeros(1)}, storage_reader=Reader(tmp_path))


@pytest.mark.parametrize("damage,what,cause", [
    ("empty", "empty", "EOFError: Ran out of input"),
    ("half", "truncated or unreadable", "UnpicklingError"),
    ("garbage", "truncated or unreadable", ""),
])
def test_damaged_metadata_is_named(tmp_path, damage, what, cause):
    dcp.save(state(), storage_writer=Writer(tmp_path))
    p = tmp_path / ".metadata"
    raw = p.read_bytes()
    p.write_bytes({"empty": b"", "half": raw[:len(raw) // 2], "garbage": b"\x80\x05not a pickle"}[damage])
    expected = re.escape(f"{p}: {what} checkpoint metadata") + ".*" + re.escape(cause)
    with pytest.raises(CorruptFileError, match=expected) as ei:
        Reader(tmp_path).read_metadata()
    assert str(ei.value.__cause__) in str(ei.value), "the unpickler's own words are kept"
    if not _torch.DCP_HIDES_METADATA_ERRORS:
        with pytest.raises(CheckpointException, match=expected):
            dcp.load(blank(state()), storage_reader=Reader(tmp_path))
        return
    with pytest.warns(RuntimeWarning, match=expected):  # torch 2.9 to 2.11 swallow the reader's error
        with pytest.raises(CheckpointException):
            dcp.load(blank(state()), storage_reader=Reader(tmp_path))


@pytest.mark.parametrize("shape,offsets,lengths", [
    ((8, 6), (2, 0), (3, 6)),          # rows: one run
    ((8, 6), (0, 2), (8, 3)),          # columns: one run per row
    ((4, 5, 6), (1, 0, 0), (2, 5, 6)),
    ((4, 5, 6), (1, 2, 0), (2, 3, 6)),  # a block of rows of the inner matrix per outer index
    ((4, 5, 6), (0, 1, 2), (4, 3, 3)),
    ((7,), (2,), (4,)),
    ((), (), ()),
    ((3, 4), (0, 0), (0, 4)),
])
def test_byte_runs_cover_exactly_the_box(shape, offsets, lengths):
    t = torch.arange(int(np.prod(shape)) if shape else 1, dtype=torch.int32).reshape(shape)
    raw = t.numpy().tobytes()
    starts, run = byte_runs(shape, offsets, lengths, 4)
    got = b"".join(raw[s:s + run] for s in starts)
    box = t[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))] if shape else t
    assert got == box.contiguous().numpy().tobytes()


def test_byte_runs_join_whole_inner_dimensions():
    starts, run = byte_runs((10, 4, 8), (3, 0, 0), (5, 4, 8), 2)
    assert list(starts) == [3 * 4 * 8 * 2] and run == 5 * 4 * 8 * 2
    starts, run = byte_runs((10, 8), (0, 4), (10, 4), 4)
    assert len(starts) == 10 and run == 16


@pytest.mark.parametrize("op,after,loads", [
    ("reserve", 0, "old"),   # the data file cannot be made: disk full
    ("rename", 0, "old"),    # the data file's rename
    ("sync", 1, "old"),      # the metadata's fsync
    ("rename", 1, "old"),    # the metadata's rename
    ("syncdir", 1, "new"),   # renamed, the directory's fsync failed: the new one is in place
])
def test_injected_faults_leave_a_whole_checkpoint(tmp_path, inject, op, after, loads):
    old = state()
    dcp.save(old, storage_writer=Writer(tmp_path))
    new = state()
    inject(commit={"op": op, "errno": errno.ENOSPC if op == "reserve" else errno.EIO, "after": after})
    with pytest.raises(CheckpointException) as ei:
        dcp.save(new, storage_writer=Writer(tmp_path))
    assert ("no space left" in str(ei.value) or "input/output error" in str(ei.value)), str(ei.value)
    inject()
    got = blank(old)
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, old if loads == "old" else new)
    assert not [p for p in tmp_path.iterdir() if ".pyfastensor-tmp-" in p.name]


CHILD = r"""
import sys, warnings, torch, torch.distributed.checkpoint as dcp
from pyfastensor.dcp import Writer
warnings.simplefilter("ignore")
path, v = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
while True:
    v += 1
    dcp.save({"w": torch.full((400_000,), float(v)), "i": torch.full((3000,), v), "v": v}, storage_writer=Writer(path))
"""


#: Kills in the SIGKILL test: a fixed number, however fast the machine saves.
KILLS = 6


def test_sigkill_during_saves_leaves_a_whole_checkpoint(tmp_path):
    """Kill a process saving checkpoints in a loop at random points: the directory
    always loads as one whole version, and no newer save ever goes back."""
    rng = random.Random(99)
    dcp.save({"w": torch.zeros(400_000), "i": torch.zeros(3000, dtype=torch.int64), "v": 0},
             storage_writer=Writer(tmp_path))
    version, kills = 0, 0
    for _ in range(KILLS):
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(version)], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.8))  # a random point of the save loop; nothing waits on it
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        kills += 1
        got: dict[str, Any] = {"w": torch.empty(400_000), "i": torch.empty(3000, dtype=torch.int64), "v": -1}
        dcp.load(got, storage_reader=Reader(tmp_path))
        v = got["v"]
        assert torch.equal(got["w"], torch.full((400_000,), float(v)))
        assert torch.equal(got["i"], torch.full((3000,), v))
        assert v >= version
        version = v
    assert kills == KILLS
    print(f"{kills} kills; version reached {version}")


class FakeStaging(_staging.Staging):
    """Staging that takes every tensor for a device tensor, with counted fakes for
    pinned allocation and synchronization."""

    allocs: list[tuple[tuple[int, ...], torch.dtype]] = []
    syncs: list[torch.device] = []

    def __init__(self) -> None:
        super().__init__(empty_pinned=self._alloc, synchronize=FakeStaging.syncs.append)

    @staticmethod
    def _alloc(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        FakeStaging.allocs.append((tuple(shape), dtype))
        return torch.empty(shape, dtype=dtype)

    def on_device(self, t: torch.Tensor) -> bool:
        return True


def test_device_tensors_pass_through_pinned_memory(tmp_path, monkeypatch):
    from pyfastensor.dcp import _reader

    monkeypatch.setattr(_writer, "Staging", FakeStaging)
    monkeypatch.setattr(_reader, "Staging", FakeStaging)
    FakeStaging.allocs, FakeStaging.syncs = [], []
    sd = {"w": torch.randn(50, 20), "b": torch.arange(7), "t": torch.randn(6, 4).t()}
    dcp.save(sd, storage_writer=Writer(tmp_path))
    assert sorted(FakeStaging.allocs) == sorted((tuple(v.shape), v.dtype) for v in sd.values())
    assert FakeStaging.syncs == [torch.device("cpu")], "one wait for all the copies of a save, on their device"
    FakeStaging.allocs, FakeStaging.syncs = [], []
    got = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, sd)
    assert len(FakeStaging.allocs) == 3 and FakeStaging.syncs == [torch.device("cpu")]


def test_waves_bound_the_staged_bytes_and_keep_the_order():
    sizes = {"a": 400, "h1": 0, "b": 500, "c": 200, "big": 5000, "h2": 0, "d": 100}
    got = _staging.waves(list(sizes), sizes.__getitem__, 1000)
    assert got == [["a", "h1", "b"], ["c"], ["big", "h2"], ["d"]], "items in order; an item over the bound alone"
    assert [x for w in got for x in w] == list(sizes)
    assert _staging.waves([], sizes.__getitem__, 1000) == []
    assert _staging.waves(["h1", "h2"], sizes.__getitem__, 1) == [["h1", "h2"]], "host items stage nothing"


class CountingStaging(FakeStaging):
    """FakeStaging that also records the bytes allocated between two waits: what one wave pins."""

    waves: list[int] = []

    @staticmethod
    def _alloc(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        t = FakeStaging._alloc(shape, dtype)
        CountingStaging.waves[-1] += t.numel() * t.element_size()
        return t

    def wait(self) -> None:
        super().wait()
        CountingStaging.waves.append(0)


def test_device_tensors_go_in_waves_of_the_staging_bound(tmp_path, monkeypatch):
    from pyfastensor.dcp import _reader

    monkeypatch.setenv("PYFASTENSOR_DCP_STAGING", "1M")
    monkeypatch.setattr(_writer, "Staging", CountingStaging)
    monkeypatch.setattr(_reader, "Staging", CountingStaging)
    FakeStaging.allocs, FakeStaging.syncs, CountingStaging.waves = [], [], [0]
    g = torch.Generator().manual_seed(5)
    sd = {f"w{i}": torch.randn(100_000, generator=g) for i in range(6)}  # 400 KB each: two a wave
    sd["big"] = torch.randn(300_000, generator=g)  # 1.2 MB: over the bound, alone
    dcp.save(sd, storage_writer=Writer(tmp_path))
    pinned = [n for n in CountingStaging.waves if n]
    assert len(pinned) == 4 and max(n for n in pinned if n < 1 << 20) == 800_000 and 1_200_000 in pinned
    files = sorted(p.name for p in tmp_path.glob("__0_*.pfd"))
    assert [f.split("_")[3] for f in files] == ["0", "1", "2", "3"], "a data file per wave"
    CountingStaging.waves = [0]
    got = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(got, storage_reader=Reader(tmp_path))
    assert_loaded(got, sd)
    pinned = [n for n in CountingStaging.waves if n]
    assert len(pinned) == 4 and max(n for n in pinned if n < 1 << 20) == 800_000, "the load stages as much"
    monkeypatch.setenv("PYFASTENSOR_DCP_STAGING", "12K")
    for cls in (Writer, Reader):
        with pytest.raises(ValueError, match="PYFASTENSOR_DCP_STAGING='12K': expected at least 1M"):
            cls(tmp_path)


def test_staging_of_host_tensors_copies_only_views():
    s = _staging.Staging(empty_pinned=lambda *a: pytest.fail("no pinned memory for host tensors"),
                         synchronize=lambda device: pytest.fail("nothing to wait for"))
    t = torch.randn(4, 5)
    assert s.to_host(t) is t
    v = t.t()
    h = s.to_host(v)
    assert h.is_contiguous() and torch.equal(h, v)
    s.wait()
    with pytest.raises(ValueError, match="meta device"):
        s.to_host(torch.empty(3, device="meta"))


def _resolved(t: torch.Tensor) -> torch.Tensor:
    return t.resolve_conj().resolve_neg()


@pytest.mark.parametrize("device", [False, True], ids=["host", "staged"])
def test_conj_and_neg_views_are_saved_as_their_values(tmp_path, monkeypatch, device):
    """A conj or neg view's memory holds the conjugate (negation) of its values, and it counts as
    contiguous: what is written is its values, as FileSystemWriter writes them."""
    if device:
        from pyfastensor.dcp import _reader

        monkeypatch.setattr(_writer, "Staging", FakeStaging)
        monkeypatch.setattr(_reader, "Staging", FakeStaging)
    c = torch.tensor([[1 + 2j, 3 - 4j], [-5 + 0.5j, 7j]], dtype=torch.complex64)
    f = torch.tensor([1.0, -2.0, 3.5])
    sd = {"conj": c.conj(), "neg": torch._neg_view(f), "conj_t": c.conj().t(),
          "neg_conj": torch._neg_view(c.conj())}
    assert all(v.is_conj() or v.is_neg() for v in sd.values())
    dcp.save(sd, storage_writer=Writer(tmp_path))
    raw = (tmp_path / data_files(tmp_path)[0]).read_bytes()
    for index, rec in metadata(tmp_path).storage_data.items():
        want = _resolved(sd[index.fqn]).contiguous()
        assert raw[rec.offset:rec.offset + rec.length] == want.view(torch.uint8).numpy().tobytes(), index.fqn
    got = {k: torch.zeros_like(_resolved(v)) for k, v in sd.items()}
    dcp.load(got, storage_reader=Reader(tmp_path))
    for k, v in sd.items():
        assert not got[k].is_conj() and not got[k].is_neg()
        assert torch.equal(got[k], _resolved(v)), k


@pytest.mark.parametrize("device", [False, True], ids=["host", "staged"])
def test_conj_and_neg_destinations_read_as_the_saved_values(tmp_path, monkeypatch, device):
    """A load into a conj or neg view leaves it reading as the saved values (its memory holding
    their conjugate or negation), as FileSystemReader's ``copy_`` does: not read in place."""
    if device:
        from pyfastensor.dcp import _reader

        monkeypatch.setattr(_writer, "Staging", FakeStaging)
        monkeypatch.setattr(_reader, "Staging", FakeStaging)
    sd = {"c": torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64),
          "f": torch.tensor([1.0, -2.0, 3.5]), "cn": torch.tensor([2 - 1j, -1j], dtype=torch.complex128)}
    dcp.save(sd, storage_writer=Writer(tmp_path))
    mem = {k: torch.zeros_like(v) for k, v in sd.items()}
    got = {"c": mem["c"].conj(), "f": torch._neg_view(mem["f"]), "cn": torch._neg_view(mem["cn"].conj())}
    dcp.load(got, storage_reader=Reader(tmp_path))
    for k, v in sd.items():
        assert torch.equal(_resolved(got[k]), v), k
    assert torch.equal(mem["c"], sd["c"].conj()) and torch.equal(mem["f"], -sd["f"])
    assert torch.equal(mem["cn"], -sd["cn"].conj())


#: Every dtype of the running torch, once (aliases such as ``torch.float`` dropped).
ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)

#: Dtypes a save must take and a load give back (those of a newer torch skipped where absent).
ROUND_TRIP = [d for d in (getattr(torch, n, None) for n in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
    "uint64", "bool", "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2")) if d is not None]


def _random_of(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` whose bytes are random (0 or 1 for bool)."""
    n = int(np.prod(shape)) * dtype.itemsize
    raw = torch.randint(0, 2 if dtype == torch.bool else 256, (n,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).view(shape)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_or_is_refused_at_save(tmp_path, dtype):
    """Whatever torch's dtype, a save either writes what a load gives back bit for bit, or refuses
    it before writing anything, naming the item and the dtype: never a checkpoint that cannot load."""
    g = torch.Generator().manual_seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental" complex32, "deprecated" quantized dtypes
        quantized = torch.empty(0, dtype=dtype).is_quantized
        x = torch.empty((6, 8), dtype=dtype) if quantized else _random_of(dtype, (6, 8), g)
    ck = tmp_path / "ck"
    try:
        dcp.save({"x": x}, storage_writer=Writer(ck))
    except CheckpointException as e:
        assert dtype not in ROUND_TRIP, str(e)
        msg = str(e)
        assert UnsupportedError.__name__ in msg, msg
        assert f"item x@[0, 0]: pyfastensor.dcp cannot save a tensor of dtype {dtype}: " in msg, msg
        assert not quantized or "quantized" in msg, msg
        assert not list(ck.iterdir()), "refused before anything is written"
        return
    assert not quantized, "a quantized tensor's scale and zero point are not in its bytes"
    got = {"x": torch.zeros((6, 8 * dtype.itemsize), dtype=torch.uint8).view(dtype)}
    dcp.load(got, storage_reader=Reader(ck))
    assert got["x"].dtype == dtype
    assert torch.equal(_bytes_of(got["x"]), _bytes_of(x))


@pytest.mark.parametrize("dtype", ROUND_TRIP, ids=str)
def test_views_of_each_dtype_round_trip_into_views(tmp_path, dtype):
    """Non-contiguous saves and loads into views: the copies of each dtype, bit for bit."""
    g = torch.Generator().manual_seed(8)
    x = _random_of(dtype, (6, 8), g)
    sd = {"t": x.t(), "cols": x[:, 2:5], "rows": x[1:4]}
    dcp.save(sd, storage_writer=Writer(tmp_path))
    got = {"t": _random_of(dtype, (6, 8), g).t(), "cols": _random_of(dtype, (6, 8), g)[:, 1:4],
           "rows": _random_of(dtype, (3, 8), g)}
    dcp.load(got, storage_reader=Reader(tmp_path))
    for k, v in sd.items():
        assert got[k].dtype == dtype and torch.equal(_bytes_of(got[k]), _bytes_of(v)), k


def test_engine_argument(tmp_path):
    sd = state()
    w = Writer(tmp_path, engine="posix")
    dcp.save(sd, storage_writer=w)
    assert w.engine_mode == "tool" and set(w.last_stats["engines"]) == {"posix"}
    w = Writer(tmp_path, engine="dictionaries")
    dcp.save(sd, storage_writer=w)
    assert w.engine_mode == "own"
    r = Reader(tmp_path, engine="dictionaries")
    got = blank(sd)
    dcp.load(got, storage_reader=r)
    assert r.engine_mode == "own"
    assert_loaded(got, sd)
    with pytest.raises(TypeError, match="expected None, an engine name"):
        Writer(tmp_path, engine=3)
    with pytest.raises(TypeError, match="expected None, an engine name"):
        Reader(tmp_path, engine=["posix"])


def _ranks(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_save_with_4_ranks_load_with_2_resharded_and_with_none(tmp_path):
    ck, out4, out2 = tmp_path / "ck", tmp_path / "o4", tmp_path / "o2"
    out4.mkdir()
    out2.mkdir()
    spawn(save_sharded, 4, str(ck), str(out4), None)
    assert len(data_files(ck)) == 4, "one data file per rank"
    spawn(load_resharded, 2, str(ck), str(out2), None)
    for r in _ranks(out2, 2):
        assert all(r["same"].values()), r["same"]
        assert all(r["local"].values()), r["local"]
        assert r["step"] == 7 and r["names"] == ["a", "b"]
        st = r["stats"]
        # Shard(1) of row-major shards: one run per row, read as whole pages around them.
        assert st["requested_bytes"] <= st["data_bytes"]
    # No process group: plain full tensors.
    full = full_state()
    got: dict[str, Any] = {k: torch.zeros_like(v) for k, v in full.items()}
    got["step"], got["names"] = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, storage_reader=Reader(ck))
    for k, v in full.items():
        assert torch.equal(got[k], v), k
    assert got["step"] == 7


def test_async_save_and_optimizer_state_with_2_ranks(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    spawn(async_and_optimizer, 2, str(tmp_path / "ck"), str(out))
    for r in _ranks(out, 2):
        assert r["model"] and r["optim"], r
        assert r["steps"] and all(s == 2.0 for s in r["steps"])


@pytest.mark.skipif(not _torch.DCP_PASSES_RANK, reason="DCP tells a storage writer its rank from torch 2.9")
@pytest.mark.parametrize("differ", [False, True])
def test_dictionaries_are_broadcast_where_nodes_are_alike(tmp_path, differ):
    out = tmp_path / "o"
    out.mkdir()
    spawn(dictionaries, 2, str(tmp_path / "ck"), str(out), differ)
    modes = [r["engine_mode"] for r in _ranks(out, 2)]
    if differ:
        assert modes == ["per rank (nodes differ)"] * 2
    else:
        assert modes[0] == "broadcast from rank 0" and modes[1].startswith("broadcast from rank 0")


@pytest.mark.skipif(_torch.DCP_PASSES_RANK, reason="torch 2.9 and later tell a storage writer its rank")
def test_without_the_rank_each_rank_uses_its_own_dictionaries(tmp_path):
    """Before torch 2.9 DCP does not say which rank of its group a writer is: no collective of
    pyfastensor's own is run (it could not know the group), each rank measures for itself."""
    out = tmp_path / "o"
    out.mkdir()
    spawn(dictionaries, 2, str(tmp_path / "ck"), str(out), False)
    assert [r["engine_mode"] for r in _ranks(out, 2)] == ["own", "own"]

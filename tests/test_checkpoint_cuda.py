"""pyfastensor.load to CUDA (checkpoint/_cuda.py), driven on CPU: a fake CUDA backend
(tests/cuda_fakes.py) whose side-stream copies only happen when their events are waited
for, and the fake libcufile for the cuFile route (in a child process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_helpers import evict
from cuda_fakes import FakeCuda, fake_cufile_env, run_child

import pyfastensor
from pyfastensor import _device
from pyfastensor.checkpoint import _cuda
from pyfastensor.checkpoint._native import Archive
from pyfastensor.errors import CorruptFileError, EngineUnavailableError

POOL = 1 << 20  # 4 slots of 256 KiB


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "pinned")


def state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(300, 300, generator=g)  # 360,000 bytes: more than a slot, read in pieces
    return {
        "big": base,
        "view": base[10:20, 5:],  # shares big's storage
        "t": base.t(),  # not contiguous
        "half": torch.randn(1000, generator=g).half(),
        "ints": torch.randint(-(2**40), 2**40, (513,), generator=g),
        "bool": torch.rand(77, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
        **{f"small{i}": torch.randn(i * 37 + 1, generator=g) for i in range(40)},  # share slots
        "bf16": torch.randn(65536 + 3, generator=g).bfloat16(),  # just over half a slot
    }


def assert_bit_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape, g.stride(), g.storage_offset()) == (w.dtype, w.shape, w.stride(),
                                                                       w.storage_offset()), k
        assert bytes(g.untyped_storage().cpu()) == bytes(w.untyped_storage()), f"{k}: bytes differ"
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()


@pytest.mark.parametrize("writer", ["pyfastensor", "torch"])
def test_pinned_ring_load_is_bit_identical_to_torch_load(tmp_path: Path, small_pool: None, writer: str) -> None:
    path = tmp_path / "s.pt"
    (pyfastensor.save if writer == "pyfastensor" else torch.save)(state(), path)
    fake = FakeCuda()
    with _device.using(fake):
        got = pyfastensor.load(path, map_location="cuda")
    assert_bit_identical(got, torch.load(path, map_location="cpu"))
    assert _cuda.last_route["route"] == "pinned"
    assert fake.pinned_calls == [POOL], "one pinned buffer, of the pool's size, for the whole load"
    n_storages = len({v.untyped_storage().data_ptr() for v in state().values() if v.numel()}) + 1
    assert len(fake.empties) == n_storages and all(loc == "cuda" for _, loc in fake.empties)
    side = [n for s, n in fake.copies if s != "compute"]
    assert side and max(side) <= POOL // 4, "every host-to-device copy is one slot at most, on a side stream"
    assert sum(side) == sum(n for n, _ in fake.empties)


def test_pinned_slab_is_allocated_once_across_loads(tmp_path: Path, small_pool: None) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    fake = FakeCuda()
    with _device.using(fake):
        for _ in range(3):
            pyfastensor.load(path, map_location=torch.device("cuda", 1))
    assert fake.pinned_calls == [POOL]
    assert _device.slab(fake).allocations == 1
    assert {loc for _, loc in fake.empties} == {"cuda:1"}


def test_a_slot_is_reused_only_after_its_copy_completed(tmp_path: Path, small_pool: None) -> None:
    # The fake runs a side-stream copy only when its event is waited for: a slot read into
    # again before that would overwrite bytes not yet copied, and the load would differ.
    path = tmp_path / "s.pt"
    tensors = {f"w{i}": torch.full((60_000,), float(i)) for i in range(12)}  # 240 KB each: a slot each
    pyfastensor.save(tensors, path)
    fake = FakeCuda()
    with _device.using(fake):
        got = pyfastensor.load(path, map_location="cuda")
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    assert sum(1 for e in fake.log if e[0] == "sync") >= 12 - 4, "slots were waited for before reuse"


def ring_reads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record each ring read a load starts: its slots' addresses, the fills' slots, the parts."""
    reads: list[dict[str, Any]] = []
    real = _cuda.RingRead.of_archive.__func__

    def spy(cls: Any, archive: Any, slots: Any, slot_bytes: int, fill_slots: Any, parts: Any, **kw: Any) -> Any:
        reads.append({"slots": list(slots), "fill_slots": list(fill_slots), "parts": list(parts), **kw})
        return real(cls, archive, slots, slot_bytes, fill_slots, parts, **kw)

    monkeypatch.setattr(_cuda.RingRead, "of_archive", classmethod(spy))
    return reads


def test_a_record_larger_than_the_ring_goes_through_it_in_one_native_read(
    tmp_path: Path, small_pool: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "s.pt"
    big = torch.randn(400_000)  # 1.6 MB: 7 pieces of a 256 KiB slot, through 4 slots
    pyfastensor.save({"big": big, "small": torch.arange(5)}, path)
    reads = ring_reads(monkeypatch)
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda")
    assert torch.equal(got["big"], big) and torch.equal(got["small"], torch.arange(5))
    assert len(reads) == 1, "every fill in one native read"
    assert len(reads[0]["slots"]) == 4 and reads[0]["fill_slots"] == [0, 1, 2, 3, 0, 1, 2, 3], "slots in turn"
    assert [p[2] for p in reads[0]["parts"][:7]] == [k * (POOL // 4) for k in range(7)], "big's pieces in order"


def mixed_checkpoint(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """A checkpoint whose storages say they were saved on cuda:0 (the large ones) and the CPU."""
    tensors = {"a": torch.randn(1000), "b": torch.arange(10), "c": torch.randn(50, 50)}
    real = torch.serialization.location_tag
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag",
                  lambda s: "cuda:0" if s.nbytes() > 100 else real(s))
        torch.save(tensors, path)
    return tensors


def test_dict_map_location_places_each_storage_where_torch_would(
    tmp_path: Path, small_pool: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "mixed.pt"
    tensors = mixed_checkpoint(path, monkeypatch)
    fake = FakeCuda()
    with _device.using(fake):
        got = pyfastensor.load(path, map_location={"cuda:0": "cuda:1"})
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    assert sorted(n for n, _ in fake.empties) == [4000, 10000], "the cuda:0 storages, on the device"
    assert {loc for _, loc in fake.empties} == {"cuda:1"}
    assert got["b"].device.type == "cpu"


def test_which_map_locations_take_the_cuda_path() -> None:
    assert _cuda.wants("cuda") and _cuda.wants("cuda:1") and _cuda.wants(torch.device("cuda", 0))
    assert _cuda.wants({"cpu": "cuda:0"}) and _cuda.wants({"cuda:1": torch.device("cuda:0")})
    assert not _cuda.wants("cpu") and not _cuda.wants(None) and not _cuda.wants({"cuda:0": "cpu"})
    assert not _cuda.wants(lambda s, loc: s.cuda()), "a callable gets torch's host storages"
    assert not _cuda.wants("nonsense")


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def record_offset(path: Path, name: str) -> int:
    with Archive(path) as a:
        return next(e.offset for e in a.entries if e.name.endswith(name))


@pytest.mark.parametrize(("record", "at"), [("data/0", 3), ("data/0", POOL // 4 + 7), ("data/3", 3)],
                         ids=["first-piece", "later-piece", "shared-slot"])
def test_a_corrupt_record_is_caught_on_the_host_side_of_the_ring(
    tmp_path: Path, small_pool: None, record: str, at: int,
) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)  # data/0 is big's storage (pieces), data/3 a small one
    flip(path, record_offset(path, record) + at)
    with _device.using(FakeCuda()), pytest.raises(CorruptFileError, match=f'record "archive/{record}"') as ei:
        pyfastensor.load(path, map_location="cuda")
    assert "(tensor [" in str(ei.value), "the message names the tensors stored in the record"
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda", verify=False)  # the check is what caught it
    assert not torch.equal(got["big"], state()["big"]) or record != "data/0"


def test_weights_only_refusal_keeps_its_message(tmp_path: Path, small_pool: None) -> None:
    path = tmp_path / "obj.pt"
    torch.save({"w": torch.ones(3), "f": Path("x")}, path)
    with _device.using(FakeCuda()), pytest.raises(Exception, match="Weights only load failed"):
        pyfastensor.load(path, map_location="cuda")


def test_forcing_cufile_where_it_cannot_work_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if pyfastensor.info(tmp_path)["engines"]["cufile"]["available"]:
        pytest.skip("GPUDirect Storage works on this machine")
    path = tmp_path / "s.pt"
    pyfastensor.save({"w": torch.ones(10)}, path)
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "cufile")
    with _device.using(FakeCuda()), pytest.raises(EngineUnavailableError, match="PYFASTENSOR_CUDA_LOAD=cufile, but"):
        pyfastensor.load(path, map_location="cuda")
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "auto")
    monkeypatch.setattr(_cuda, "NVFS", str(tmp_path))  # as if GPUDirect Storage's driver were loaded
    evict(path)  # a warm file takes the pinned ring before cuFile is tried
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda")
    assert torch.equal(got["w"], torch.ones(10))
    assert _cuda.last_route["route"] == "pinned" and _cuda.last_route["reason"].startswith("cuFile unavailable: ")
    monkeypatch.setattr(_cuda, "NVFS", str(tmp_path / "missing"))
    with _device.using(FakeCuda()):
        assert torch.equal(pyfastensor.load(path, map_location="cuda")["w"], torch.ones(10))
    assert _cuda.last_route["route"] == "pinned"
    assert _cuda.last_route["reason"].startswith("no GPUDirect Storage driver"), "auto leaves compatibility mode"


def test_an_engine_name_takes_the_pinned_ring_through_that_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "auto")  # engine= decides, not the setting
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    engines: list[Any] = []
    real_read = _cuda.Archive.read

    def read(self: Any, reads: Any, **kw: Any) -> Any:
        engines.append(kw.get("engine"))
        return real_read(self, reads, **kw)

    monkeypatch.setattr(_cuda.Archive, "read", read)
    rings = ring_reads(monkeypatch)
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda", engine="posix")
    assert_bit_identical(got, torch.load(path, map_location="cpu"))
    assert _cuda.last_route["route"] == "pinned" and _cuda.last_route["reason"] == "engine='posix'"
    # the pickle first, as on the CPU path (default choice); then every storage read through posix
    assert engines == [None] and [r["engine"] for r in rings] == ["posix"], (engines, rings)


def test_engine_cufile_where_it_cannot_work_says_why(tmp_path: Path) -> None:
    if pyfastensor.info(tmp_path)["engines"]["cufile"]["available"]:
        pytest.skip("GPUDirect Storage works on this machine")
    path = tmp_path / "s.pt"
    pyfastensor.save({"w": torch.ones(10)}, path)
    with _device.using(FakeCuda()), pytest.raises(EngineUnavailableError,
                                                  match=r"engine='cufile', but cuFile cannot read .*s\.pt"):
        pyfastensor.load(path, map_location="cuda", engine="cufile")


@pytest.mark.parametrize("progress", [True, False])
def test_a_long_cuda_load_shows_a_progress_bar(
    tmp_path: Path, small_pool: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    progress: bool,
) -> None:
    from pyfastensor.checkpoint import _progress

    monkeypatch.setattr(_progress, "DELAY", 0.0)  # every load is long enough
    monkeypatch.setattr(_progress, "MIN_BYTES", 0)
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda", progress=progress)
    assert_bit_identical(got, torch.load(path, map_location="cpu"))
    err = capsys.readouterr().err
    if not progress:
        assert "load s.pt" not in err
        return
    assert "load s.pt" in err and "100%" in err, err


def test_a_bad_cuda_load_setting_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save({"w": torch.ones(10)}, path)
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "gds")
    with _device.using(FakeCuda()), pytest.raises(ValueError, match="PYFASTENSOR_CUDA_LOAD='gds'"):
        pyfastensor.load(path, map_location="cuda")


# The cuFile route, in child processes: the probe needs an NVIDIA driver library to
# load (a stand-in here) and reads PYFASTENSOR_CUFILE_LIB once, as the process starts.

def test_cufile_route_reads_into_device_memory_and_checks_crcs(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile, PYFASTENSOR_PINNED_POOL=str(POOL)))
    assert out.get("error") is None, out
    assert out["route"] == "cufile" and out["reason"] == "" and out["equal"]
    assert out["cufile_reads"] >= 40, "each record read by cuFileRead"
    assert out["copies"] > 0, "records read back through the ring for their CRC-32s"
    assert out["reads_before_pending_work"] == 0, "cuFile reads wait for the work queued on the current stream"


def test_a_file_in_the_page_cache_takes_the_pinned_ring_where_cufile_works(tmp_path: Path, fake_cufile: Path) -> None:
    """GPUDirect Storage reads the disk whatever the page cache holds: a warm file is read from
    memory through the pinned ring, bit for bit the same, and the route says why."""
    path = tmp_path / "s.pt"
    pyfastensor.save({**state(), "large": torch.randn(1 << 20)}, path)  # 4.7 MB, read from disk or cache
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile), warm=True)
    assert out.get("error") is None, out
    assert out["route"] == "pinned" and out["equal"]
    assert "100% of the file is in the page cache" in out["reason"], out["reason"]
    assert out["load_cufile_reads"] == 0, "no cuFile read"
    cold = run_child(path, "cuda", fake_cufile_env(fake_cufile))  # the same file, its pages dropped
    assert cold.get("error") is None, cold
    assert cold["route"] == "cufile" and cold["equal"] and cold["load_cufile_reads"] > 0


def test_cufile_route_catches_a_corrupt_record(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    flip(path, record_offset(path, "data/5") + 3)
    out = run_child(path, "cuda:1", fake_cufile_env(fake_cufile))
    assert out["error"].startswith("CorruptFileError: ") and 'record "archive/data/5"' in out["error"]


def test_missing_libcufile_falls_back_to_the_pinned_ring(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    env = fake_cufile_env(fake_cufile)
    env["PYFASTENSOR_CUFILE_LIB"] = str(tmp_path / "nowhere" / "libcufile.so.0")
    out = run_child(path, "cuda", env)
    assert out.get("error") is None, out
    assert out["route"] == "pinned" and out["equal"]
    assert "libcufile not found" in out["reason"]
    env["PYFASTENSOR_CUDA_LOAD"] = "cufile"
    out = run_child(path, "cuda", env)
    assert out["error"].startswith("EngineUnavailableError: PYFASTENSOR_CUDA_LOAD=cufile, but cuFile cannot read")
    assert "libcufile not found" in out["error"]


def test_engine_cufile_takes_the_cufile_route_whatever_the_setting(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    env = fake_cufile_env(fake_cufile, PYFASTENSOR_CUDA_LOAD="pinned", PFT_TEST_ENGINE="cufile")
    out = run_child(path, "cuda", env)
    assert out.get("error") is None, out
    assert out["route"] == "cufile" and out["equal"] and out["cufile_reads"] >= 40
    env["PYFASTENSOR_CUFILE_LIB"] = str(tmp_path / "nowhere" / "libcufile.so.0")
    out = run_child(path, "cuda", env)
    assert out["error"].startswith("EngineUnavailableError: engine='cufile', but cuFile cannot read"), out


def test_a_failed_cufile_read_falls_back_to_the_pinned_ring(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile), fail_read=True)
    assert out.get("error") is None, out
    assert out["route"] == "pinned" and out["equal"]
    assert out["reason"].startswith("cuFile read failed, the load went through the pinned ring: ")
    assert "CU_FILE_INTERNAL_ERROR" in out["reason"]
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile, PYFASTENSOR_CUDA_LOAD="cufile"), fail_read=True)
    assert "CU_FILE_INTERNAL_ERROR" in out["error"], "forced, the failure is the load's"


@pytest.mark.parametrize("writer", ["pyfastensor", "torch"])
def test_each_part_lies_in_its_slot_as_in_the_file_modulo_the_memory_alignment(
    tmp_path: Path, small_pool: None, monkeypatch: pytest.MonkeyPatch, writer: str,
) -> None:
    # O_DIRECT moves a part's aligned middle in place only where memory and file agree modulo
    # the alignment: our records are page-aligned in the file, torch's only 64-byte aligned.
    path = tmp_path / "s.pt"
    (pyfastensor.save if writer == "pyfastensor" else torch.save)(state(), path)
    reads = ring_reads(monkeypatch)
    fake = FakeCuda()
    with _device.using(fake):
        got = pyfastensor.load(path, map_location="cuda")
        with _device.slab(fake).hold() as buf:
            base = buf.data_ptr()
    assert_bit_identical(got, torch.load(path, map_location="cpu"))
    align = pyfastensor._lib.settings()["memory_alignment"]
    assert _device.memory_alignment() == align
    (read,) = reads
    assert all((a - base) % align == 0 for a in read["slots"]), "each slot starts on the core's memory alignment"
    with Archive(path) as a:
        file_at = [a.entries[rec].offset + off for _, rec, off, _, _ in read["parts"]]
    slot_at = [at for _, _, _, _, at in read["parts"]]
    assert len(slot_at) > 40 and any(slot_at), "several records share a slot"
    assert all((s - f) % align == 0 for s, f in zip(slot_at, file_at, strict=True))
    if writer == "torch":
        assert any(f % align for f in file_at), "torch's records are not all page-aligned"


def test_a_failed_read_stops_the_ring_read_before_the_ring_is_given_back(
    tmp_path: Path, small_pool: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save({f"w{i}": torch.full((60_000,), float(i)) for i in range(6)}, path)
    fake = FakeCuda()
    seen: dict[str, Any] = {"nexts": 0, "held_at_close": None}
    real_next, real_close = _cuda.RingRead.next, _cuda.RingRead.close

    def next_(self: Any, release: int = -1) -> int:
        seen["nexts"] += 1
        if seen["nexts"] == 2:
            raise OSError(5, "injected read error")
        return real_next(self, release)

    def close(self: Any) -> None:
        if seen["held_at_close"] is None:
            seen["held_at_close"] = _device.slab(fake).held
        real_close(self)

    with _device.using(fake):
        pyfastensor.load(path, map_location="cuda")
        monkeypatch.setattr(_cuda.RingRead, "next", next_)
        monkeypatch.setattr(_cuda.RingRead, "close", close)
        with pytest.raises(OSError, match="injected read error"):
            pyfastensor.load(path, map_location="cuda")
        assert seen["held_at_close"] is True, "the reads into the ring stopped before the load gave it back"
        assert not _device.slab(fake).held
        monkeypatch.undo()
        monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
        monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", "pinned")
        assert torch.equal(pyfastensor.load(path, map_location="cuda")["w5"], torch.full((60_000,), 5.0))
    assert fake.pinned_calls == [POOL], "the ring is allocated once, failure or not"


class Summed:
    """An object whose ``__setstate__`` reads its tensor, as unpickling runs it."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.total = t, float(t.sum())

    def __getstate__(self) -> dict[str, Any]:
        return {"t": self.t}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.t, self.total = state["t"], float(state["t"].sum())


def test_an_object_that_reads_its_tensor_while_unpickled_sees_the_loaded_bytes(
        tmp_path: Path, small_pool: None) -> None:
    """Where torch's unpickler rebuilds the object, each record is in device memory before
    the storage is handed to it, as with torch.load; the usual state dict still has every
    storage made first and every record read in one pass after."""
    path = tmp_path / "s.pt"
    want = Summed(torch.arange(100_000, dtype=torch.float32))
    pyfastensor.save({"s": want, "w": torch.ones(10)}, path)
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda", weights_only=False)
    assert got["s"].total == want.total
    assert torch.equal(got["s"].t, want.t) and torch.equal(got["w"], torch.ones(10))


def test_sparse_tensors_are_checked_once_their_records_are_in_device_memory(
        tmp_path: Path, small_pool: None) -> None:
    path = tmp_path / "s.pt"
    i = torch.tensor([[0, 1, 2, 5], [3, 0, 4, 1]])
    sp = torch.sparse_coo_tensor(i, torch.arange(4.0), (6, 6)).coalesce()  # torch checks is_coalesced
    pyfastensor.save({"sp": sp}, path)
    with _device.using(FakeCuda()):
        got = pyfastensor.load(path, map_location="cuda")  # weights_only: torch's check runs
    assert torch.equal(got["sp"].to_dense(), sp.to_dense())

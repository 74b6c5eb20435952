"""async_save of CUDA tensors through the pinned slab, driven on CPU by the fake CUDA backend.

``_from_device.on_device`` is patched to stage chosen CPU storages as CUDA ones
would be staged; the fake runs a side-stream copy only when its event is
waited for (or a stream waits for it), so a snapshot that let the writer read
the slab before its copies ran would write the slab's garbage.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda

import pyfastensor
from pyfastensor import _device
from pyfastensor.checkpoint import _from_device, _snapshot
from pyfastensor.checkpoint._skeleton import pickle_skeleton

POOL = 1 << 20


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    monkeypatch.setenv("PYFASTENSOR_SNAPSHOT_POOL", str(POOL))
    f = FakeCuda()

    def on_device(storage: torch.UntypedStorage) -> bool:
        # The tiny ones stay CPU storages (a mixed state); the snapshot's copies are host memory.
        return storage.nbytes() > 64 and not f.is_pinned(storage.data_ptr())
    monkeypatch.setattr(_from_device, "on_device", on_device)
    with _device.using(f):
        yield f


def state(total: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out: dict[str, torch.Tensor] = {"tiny": torch.arange(4), "half": torch.randn(1000, generator=g).half()}
    i = 0
    while sum(t.numel() * t.element_size() for t in out.values()) < total:
        out[f"w{i}"] = torch.randn(40_000 + 1000 * i, generator=g)
        i += 1
    return out


def assert_loads_as(path: Path, want: dict[str, torch.Tensor]) -> None:
    got = torch.load(path)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v) and got[k].dtype == v.dtype, k


def test_a_state_that_fits_is_copied_into_the_slab_and_written_from_it(tmp_path: Path, fake: FakeCuda) -> None:
    tensors = state(POOL // 3)
    want = {k: v.clone() for k, v in tensors.items()}
    fake.gate.clear()  # the copies cannot land yet: a wait for one on this thread would fail
    before = len(fake.syncs)
    fut = pyfastensor.async_save(tensors, tmp_path / "a.pt")
    during = fake.syncs[before:]  # the background write's waits may be in it too: only threads tell
    assert not fut.done(), "the call returned before the write"
    for v in tensors.values():
        v.zero_()  # the caller goes on at once: the file holds the values as of the call
    fake.gate.set()
    fut.result()
    assert_loads_as(tmp_path / "a.pt", want)
    assert threading.main_thread() not in during, "the caller's thread never waited for a copy"
    need = sum(-(-v.untyped_storage().nbytes() // 4096) * 4096 for v in tensors.values() if v.untyped_storage().nbytes() > 64)
    slab = _device.slab(fake, "snapshot")
    assert len(fake.pinned_calls) == 1 and need <= fake.pinned_calls[0] < 2 * need, "the state's size, not more"
    assert not slab.held, "given back after the write"
    assert ("wait", "compute", "side1") in fake.log, "later kernels wait for the copies"
    for _ in range(2):
        pyfastensor.async_save(tensors, tmp_path / "a.pt").result()
    assert len(fake.pinned_calls) == 1 and slab.allocations == 1, "allocated once, kept for the next saves"


def test_the_slab_is_held_until_the_write_ends(tmp_path: Path, fake: FakeCuda) -> None:
    snap = _snapshot.snapshot(pickle_skeleton(state(POOL // 4)), str(tmp_path / "x.pt"))
    slab = _device.slab(fake, "snapshot")
    assert snap.waves == 1 and slab.held
    snap.write()
    assert slab.held
    snap.release()
    assert not slab.held
    snap.release()  # idempotent


def test_a_larger_state_goes_in_waves_written_through_a_bounded_slab(
    tmp_path: Path, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensors = state(3 * POOL)
    want = {k: v.clone() for k, v in tensors.items()}
    host_allocs: list[int] = []
    real_empty = torch.empty

    def spy_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = real_empty(*args, **kwargs)
        host_allocs.append(t.numel() * t.element_size())
        return t
    with monkeypatch.context() as m:
        m.setattr(_snapshot.torch, "empty", spy_empty)
        snap = _snapshot.snapshot(pickle_skeleton(tensors), str(tmp_path / "b.pt"))
    assert snap.waves >= 3, "the slab was filled again and again"
    assert max(host_allocs, default=0) < 4096, "no host copy of the state: waves go from the slab to the file"
    assert snap.staged is not None and snap.drain is not None
    assert 0 < len(snap.drain.filled) + (snap.drain.open is not None) <= 4, "the last slots are left for the write"
    snap.write()
    snap.release()
    assert not _device.slab(fake, "snapshot").held
    assert_loads_as(tmp_path / "b.pt", want)
    for _ in range(2):
        before = {k: v.clone() for k, v in tensors.items()}
        fut = pyfastensor.async_save(tensors, tmp_path / "c.pt")
        for v in tensors.values():
            v.add_(1)  # after the call: not in the file
        fut.result()
        assert_loads_as(tmp_path / "c.pt", before)
    assert fake.pinned_calls == [POOL], "allocated once, never more than the setting"
    assert _device.slab(fake, "snapshot").allocations == 1
    assert len(fake.copies) > 3 * 12, "the saves after the first went through the slab too"
    side = [n for s, n in fake.copies if s != "compute"]
    assert max(side) <= POOL // 4
    assert pyfastensor.load(tmp_path / "b.pt")["w0"].equal(want["w0"])


def test_a_failed_wave_save_leaves_nothing_and_frees_the_slab(tmp_path: Path, fake: FakeCuda) -> None:
    snap = _snapshot.snapshot(pickle_skeleton(state(3 * POOL)), str(tmp_path / "d.pt"))
    snap.release()  # the background write never ran (an error before it, say)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the temporary file is removed"
    assert not _device.slab(fake, "snapshot").held


def test_a_staged_file_has_the_records_of_a_plain_save(tmp_path: Path, fake: FakeCuda) -> None:
    import zipfile

    tensors = state(3 * POOL)
    pyfastensor.async_save(tensors, tmp_path / "w.pt").result()  # waves
    pyfastensor.save(tensors, tmp_path / "p.pt")
    with zipfile.ZipFile(tmp_path / "w.pt") as a, zipfile.ZipFile(tmp_path / "p.pt") as b:
        def layout(z: zipfile.ZipFile) -> list[tuple[str, int, int]]:
            return [(i.filename, i.header_offset, i.file_size) for i in z.infolist()]
        assert layout(a) == layout(b), "the same records at the same offsets: the core lays out both"
        assert a.testzip() is None


def test_cpu_only_states_do_not_touch_pinned_memory(tmp_path: Path) -> None:
    f = FakeCuda()
    with _device.using(f):
        pyfastensor.async_save({"w": torch.ones(1000)}, tmp_path / "c.pt").result()
    assert f.pinned_calls == [] and f.copies == []
    assert_loads_as(tmp_path / "c.pt", {"w": torch.ones(1000)})


def test_copies_in_the_slab_start_on_the_cores_memory_alignment(tmp_path: Path, fake: FakeCuda) -> None:
    align = pyfastensor._lib.settings()["memory_alignment"]
    assert _device.memory_alignment() == align
    with _device.slab(fake, "snapshot").hold() as buf:  # all of it: the waves' size
        base = buf.data_ptr()
    tensors = state(POOL // 2)
    snap = _snapshot.snapshot(pickle_skeleton(tensors), str(tmp_path / "f.pt"))
    try:
        assert snap.waves == 1
        staged = [s for s in snap.skeleton.storages.values() if s.nbytes() > 64]
        assert len(staged) > 2 and any(s.nbytes() % align for s in staged), "sizes that need padding"
        assert all((s.data_ptr() - base) % align == 0 for s in staged)
    finally:
        snap.release()
    snap = _snapshot.snapshot(pickle_skeleton(state(3 * POOL)), str(tmp_path / "g.pt"))
    try:
        assert snap.waves > 1 and snap.drain is not None and snap.drain.filled
        parts = [t for slot in snap.drain.filled for _, _, t in slot.parts]
        assert parts and all((t.data_ptr() - base) % align == 0 for t in parts), "ring slots too"
    finally:
        snap.release()

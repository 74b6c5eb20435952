"""async_save of CUDA tensors through the pinned slab, driven on CPU by the fake CUDA backend.

``async_save._on_device`` is patched to stage chosen CPU storages as CUDA ones
would be staged; the fake runs a side-stream copy only when its event is
waited for (or a stream waits for it), so a snapshot that let the writer read
the slab before its copies ran would write the slab's garbage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda

import pyfastensor
from pyfastensor import _device
from pyfastensor.checkpoint import _snapshot
from pyfastensor.checkpoint._skeleton import pickle_skeleton

POOL = 1 << 20


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    def on_device(storage: torch.UntypedStorage) -> bool:
        return storage.nbytes() > 64  # the tiny ones stay CPU storages: a mixed state
    monkeypatch.setattr(_snapshot, "_on_device", on_device)
    f = FakeCuda()
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
    tensors = state(POOL // 2)
    want = {k: v.clone() for k, v in tensors.items()}
    fut = pyfastensor.async_save(tensors, tmp_path / "a.pt")
    for v in tensors.values():
        v.zero_()  # the caller goes on at once: the file holds the values as of the call
    fut.result()
    assert_loads_as(tmp_path / "a.pt", want)
    slab = _device.slab(fake, "save")
    assert fake.pinned_calls == [POOL] and not slab.held, "one slab, given back after the write"
    assert ("wait", "compute", "side1") in fake.log, "later kernels wait for the copies"


def test_the_slab_is_held_until_the_write_ends(tmp_path: Path, fake: FakeCuda) -> None:
    snap = _snapshot.snapshot(pickle_skeleton(state(POOL // 4)), str(tmp_path / "x.pt"))
    slab = _device.slab(fake, "save")
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
    assert snap.staged is not None and len(snap.pending) <= 4, "the last wave is left for the background write"
    snap.write()
    snap.release()
    assert not _device.slab(fake, "save").held
    assert_loads_as(tmp_path / "b.pt", want)
    for _ in range(2):
        before = {k: v.clone() for k, v in tensors.items()}
        fut = pyfastensor.async_save(tensors, tmp_path / "c.pt")
        for v in tensors.values():
            v.add_(1)  # after the call: not in the file
        fut.result()
        assert_loads_as(tmp_path / "c.pt", before)
    assert fake.pinned_calls == [POOL], "allocated once, never more than the setting"
    assert len(fake.copies) > 3 * 12, "the saves after the first went through the slab too"
    side = [n for s, n in fake.copies if s != "compute"]
    assert max(side) <= POOL // 4
    assert pyfastensor.load(tmp_path / "b.pt")["w0"].equal(want["w0"])


def test_a_failed_wave_save_leaves_nothing_and_frees_the_slab(tmp_path: Path, fake: FakeCuda) -> None:
    snap = _snapshot.snapshot(pickle_skeleton(state(3 * POOL)), str(tmp_path / "d.pt"))
    snap.release()  # the background write never ran (an error before it, say)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the temporary file is removed"
    assert not _device.slab(fake, "save").held


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
    with _device.slab(fake, "save").hold() as buf:
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
        assert snap.waves > 1 and snap.pending
        assert all((part.data_ptr() - base) % align == 0 for _, part, _, _ in snap.pending), "ring slots too"
    finally:
        snap.release()

"""pyfastensor._device: the backend switch and the pinned pools, on the fake CUDA backend."""

from __future__ import annotations

import threading

import pytest
import torch
from cuda_fakes import FakeCuda

import pyfastensor
from pyfastensor import _device


def test_using_swaps_the_backend_for_the_block_only() -> None:
    before = _device.backend()
    fake = FakeCuda()
    with _device.using(fake):
        assert _device.backend() is fake
    assert _device.backend() is before
    assert isinstance(before, _device.CudaBackend)


def test_fake_event_is_not_complete_while_its_copy_runs_on_another_thread() -> None:
    """The fake models a GPU event: complete once the copies before it have run, not once one
    has started. (A copy that counted as done when it began let the pinned pool hand out, and
    unpack read, a buffer still being filled by another thread under CPU load.)"""
    fake = FakeCuda()
    side = fake.side_stream(torch.device("cpu"))
    started, release = threading.Event(), threading.Event()
    side.ops.append(lambda: (started.set(), release.wait(timeout=60)))
    done = fake.event()
    done.record(side)
    waiter = threading.Thread(target=done.synchronize)
    waiter.start()
    try:
        assert started.wait(timeout=60), "the waiting thread did not run the copy"
        assert not done.query(), "the event completed while its copy was still running"
    finally:
        release.set()
        waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert done.query()


def test_pool_reuses_a_buffer_once_every_view_of_it_is_gone() -> None:
    fake = FakeCuda()
    pool = _device.PinnedPool(fake, limit=10_000)
    a = pool.take(4000)
    view = a.view(torch.int32)[10:]
    del a
    b = pool.take(4000)
    assert pool.allocations == 2, "a view still uses the first buffer"
    del view, b
    pool.take(4000)
    assert pool.allocations == 2 and pool.reserved == 8000


def test_pool_past_its_limit_hands_out_buffers_of_its_own() -> None:
    fake = FakeCuda()
    pool = _device.PinnedPool(fake, limit=10_000)
    held = [pool.take(4000), pool.take(4000)]
    extra = pool.take(4000)
    assert pool.overflows == 1 and pool.reserved == 8000 and extra.numel() == 4000
    del held, extra
    assert pool.take(4000).numel() == 4000 and pool.overflows == 1


def test_ring_waits_for_a_slot_copy_before_handing_it_out_again() -> None:
    fake = FakeCuda()
    ring = _device.Ring(fake.pinned(4 * 8192), 4, align=4096)
    assert ring.slot_bytes == 8192
    side = fake.side_stream(torch.device("cpu"))
    src = torch.arange(8192, dtype=torch.int64).to(torch.uint8)
    dst = torch.zeros(8192, dtype=torch.uint8)
    i, slot = ring.take()
    slot.copy_(src)
    with fake.use(side):
        fake.copy(dst, slot)
        ev = fake.event()
        ev.record(side)
    ring.used(i, ev)
    for _ in range(3):
        ring.take()
    assert not torch.equal(dst, src), "the copy has not run: its event was not waited for"
    again, _ = ring.take()
    assert again == i and torch.equal(dst, src) and ring.waits == 1


def test_slabs_per_purpose_are_allocated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", "2M")
    fake = FakeCuda()
    load, save = _device.slab(fake, "load"), _device.slab(fake, "save")
    assert load is not save and _device.slab(fake, "load") is load
    with load.hold():
        pass
    with load.hold():
        assert load.held
    assert not load.held and load.allocations == 1 and fake.pinned_calls == [2 << 20]


def test_pinned_pool_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", "12K")
    with pytest.raises(ValueError, match="PYFASTENSOR_PINNED_POOL='12K': expected at least 1M"):
        _device.PinnedSlab()


def test_load_to_cuda_without_a_gpu_fails_as_torch_load_does(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = tmp_path / "w.pt"
    pyfastensor.save({"w": torch.ones(3)}, path)
    with pytest.raises(Exception) as theirs:  # noqa: B017 - torch 2.4 wraps it in an UnpicklingError
        torch.load(path, map_location="cuda")
    with pytest.raises(RuntimeError) as ours:
        pyfastensor.load(path, map_location="cuda")
    assert "torch.cuda.is_available() is False" in str(ours.value)
    assert str(ours.value) in str(theirs.value)


def test_a_rings_slots_start_on_the_cores_memory_alignment_by_default() -> None:
    align = _device.memory_alignment()
    settings = pyfastensor._lib.settings()
    assert align == settings["memory_alignment"] and settings["alignment"] % align == 0
    fake = FakeCuda()
    buf = fake.pinned(3 * align + align // 2)
    ring = _device.Ring(buf, 3)
    assert ring.align == align and ring.slot_bytes == align
    assert [s.data_ptr() - buf.data_ptr() for s in ring.slots] == [0, align, 2 * align]

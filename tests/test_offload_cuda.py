"""Offload of CUDA activations, driven on CPU through the fake CUDA backend (tests/cuda_fakes.py).

The offload object's ``_device_staging`` set to a fake makes it stage every
saved tensor as it stages a CUDA one: a device-to-host copy into a pooled
pinned buffer on a side stream, which the fake runs only when the copy's
event is waited for, and the store's write handed to the store's thread
(SpillStore.put_after) to start once that event completes.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import torch
from cuda_fakes import FakeCuda, fake_offload
from offload_models import assert_same_grads, inputs, loss_of, open_handles, train


def test_staged_gradients_are_bit_identical_and_the_pool_is_reused(tmp_path: Path) -> None:
    model, batch_of = inputs("transformer")
    want = train(model, batch_of, steps=3)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, pool_limit=64 << 20)
    pool = off._device_staging.pool
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    assert_same_grads(want, got)
    per_step = off.summary().offloaded_tensors  # packs of one step; each may also need a read-back buffer
    assert per_step > 0
    # Without reuse, three steps would allocate a buffer per pack and per read-back, each step
    # (up to 6 per tensor); reused across steps, the pool holds at most one step's worth (how
    # many writes overlap within a step varies with timing, hence no exact count).
    assert pool.allocations <= 2 * per_step + 2, (pool.allocations, per_step)
    assert pool.overflows == 0 and pool.reserved <= pool.limit
    assert fake.pinned_calls and sum(fake.pinned_calls) == pool.reserved
    off.close()
    assert open_handles() == 0


def test_pack_returns_before_the_copy_event_completes(tmp_path: Path) -> None:
    model, batch_of = inputs("mlp")
    want = train(model, batch_of, steps=1)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, pool_limit=64 << 20)
    model = copy.deepcopy(model)
    x, y = batch_of(0)
    fake.gate.clear()  # every device-to-host copy stays in flight
    with off:
        loss = loss_of(model, x, y)  # every pack has returned
        store = off._store
        assert store is not None and store._deferred, "CUDA packs hand their writes to the store's thread"
        assert not any(d.issued.is_set() for d in store._deferred.values()), \
            "no write starts before its copy's event has completed"
        assert not any(e[0] == "sync" for e in fake.log), "pack never waited for a copy"
        fake.gate.set()
        loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    assert_same_grads(want[:1], [got])
    off.close()
    assert open_handles() == 0


def test_unpack_before_the_write_started_uploads_the_pinned_copy(tmp_path: Path) -> None:
    # Backward right after forward, copies in flight until the first unpack waits on the side
    # stream: the payload goes back up from its pinned copy, after the copy into it.
    model, batch_of = inputs("mlp")
    want = train(model, batch_of, steps=1)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, pool_limit=64 << 20)
    model = copy.deepcopy(model)
    x, y = batch_of(0)
    with off:
        loss_of(model, x, y).backward()
    assert_same_grads(want[:1], [[p.grad.clone() for p in model.parameters()]])
    off.close()
    assert open_handles() == 0


def test_put_after_orders_the_write_after_ready(tmp_path: Path) -> None:
    from pyfastensor.offload._store import SpillStore

    store = SpillStore("ssd", str(tmp_path))
    buf = torch.zeros(1 << 16, dtype=torch.uint8)
    go = threading.Event()

    def ready() -> None:
        go.wait(30)
        buf.fill_(7)  # the bytes land only now

    slot = store.put_after(ready, buf.data_ptr(), buf.numel())
    assert store.poll(slot) is False
    go.set()
    store.wait(slot)
    back = torch.empty_like(buf)
    store.get(slot, back.data_ptr(), back.numel())
    assert torch.equal(back, torch.full_like(buf, 7))
    assert slot in store.completed() or store.poll(slot)
    store.free(slot)

    def fails() -> None:
        raise OSError("copy failed")

    bad = store.put_after(fails, buf.data_ptr(), buf.numel())
    try:
        store.wait(bad)
    except OSError as e:
        assert str(e) == "copy failed"
    else:
        raise AssertionError("the ready() error must reach wait()")
    store.free(bad)
    store.close()


def test_a_failed_deferred_put_keeps_no_frame_of_those_who_waited(tmp_path: Path) -> None:
    # The store outlives steps: a failed put's error kept with the traceback of a wait would keep
    # that caller's frames (in an unpack hook: the step's autograd graph) until the slot is freed.
    import gc
    import weakref

    from pyfastensor.errors import NoSpaceError
    from pyfastensor.offload._store import SpillStore

    store = SpillStore("ssd", str(tmp_path))
    buf = torch.zeros(1 << 12, dtype=torch.uint8)

    def full() -> None:
        raise NoSpaceError("spill file: no space left")

    bad = store.put_after(full, buf.data_ptr(), buf.numel())

    class Graph:  # stands for what a caller's frame holds
        pass

    def caller() -> weakref.ref[Graph]:
        graph = Graph()
        try:
            store.wait(bad)
        except NoSpaceError as e:
            assert e.strerror == "spill file: no space left" and e.errno == 28
        else:
            raise AssertionError("the put's error must reach wait()")
        return weakref.ref(graph)

    first, second = caller(), caller()  # raised again to a second waiter, as it was made
    gc.collect()
    assert first() is None and second() is None, "the kept error holds a waiter's frame"
    store.free(bad)
    store.close()

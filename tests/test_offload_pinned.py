"""CUDA offload's pinned staging over steps, on CPU through the fake CUDA backend (tests/cuda_fakes.py).

What is checked: the pinned pool grows in the first step and no pinned
memory is allocated after it; the host tier keeps a CUDA payload in its
pinned buffer (nothing written to the native store); pack never waits for a
copy on the caller's thread; gradients bit-identical to training without
offload.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda, fake_offload
from offload_models import assert_same_grads, inputs, open_handles, train

import pyfastensor

STEPS = 4


def watch_pack(off: pyfastensor.Offload, fake: FakeCuda) -> list[str]:
    """Wrap the offload's pack hook: the list returned gets a line for every pack that waited
    for a copy's event on the caller's thread."""
    waited: list[str] = []
    pack = off._pack

    def checked(t: torch.Tensor) -> Any:
        before = len(fake.syncs)
        out = pack(t)
        if any(th is threading.current_thread() for th in fake.syncs[before:]):
            waited.append(f"pack of {tuple(t.shape)} waited")
        return out

    off._pack = checked  # type: ignore[method-assign]
    return waited


def per_step(off: pyfastensor.Offload, fake: FakeCuda, log: list[dict[str, Any]]) -> Any:
    """A ``ctx`` for :func:`train` that notes, before each step, what the step before did."""
    def ctx() -> pyfastensor.Offload:
        if off.step:
            s = off.summary()
            log.append({"pinned_allocations": s.pinned_allocations, "pinned_calls": len(fake.pinned_calls),
                        "bytes_offloaded": dict(s.bytes_offloaded), "engines": dict(s.engines),
                        "offloaded": s.offloaded_tensors, "pinned_bytes": s.pinned_bytes})
        return off
    return ctx


def train_logged(tmp_path: Path, model_name: str, **options: Any) -> tuple[pyfastensor.Offload, FakeCuda,
                                                                          list[dict[str, Any]], list[str]]:
    """Train ``model_name`` for :data:`STEPS` steps under an offload on a fake device, check its
    gradients against training without one, and check that pinned memory was allocated in the
    first step only. Returns the offload, the fake, the per-step log and the packs that waited."""
    model, batch_of = inputs(model_name)
    want = train(model, batch_of, steps=STEPS)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, **options)
    waited = watch_pack(off, fake)
    log: list[dict[str, Any]] = []
    got = train(model, batch_of, steps=STEPS, ctx=per_step(off, fake, log))
    assert_same_grads(want, got)
    log.append({"pinned_allocations": off.summary().pinned_allocations, "pinned_calls": len(fake.pinned_calls)})
    assert log[0]["pinned_allocations"] > 0
    assert [s["pinned_allocations"] for s in log[1:]] == [0] * (STEPS - 1), log
    assert {s["pinned_calls"] for s in log} == {log[0]["pinned_calls"]}, "no pinned allocation after step 1"
    return off, fake, log, waited


@pytest.mark.parametrize("model_name", ["transformer", "mlp"])
def test_host_tier_keeps_pinned_copies_and_allocates_only_in_the_first_step(tmp_path: Path, model_name: str) -> None:
    off, fake, log, waited = train_logged(tmp_path, model_name, tier="host")
    assert log[0]["offloaded"] > 0
    # The pinned buffer is the stored copy: nothing goes through the native store.
    assert log[0]["engines"] == {} and set(log[0]["bytes_offloaded"]) == {"host"}
    assert off._store is not None and off._store.stats(off._account).get("bytes_written", 0) == 0
    assert fake.syncs == [], "neither pack nor unpack waited for a copy on the CPU"
    assert waited == []
    pool = off._device_staging.pool
    assert pool.overflows == 0 and pool.late == 0 and pool.reserved == log[0]["pinned_bytes"]
    off.close()
    assert open_handles() == 0


def test_host_tier_uploads_are_issued_ahead_and_joined_at_unpack(tmp_path: Path) -> None:
    model, batch_of = inputs("mlp")
    want = train(model, batch_of, steps=2)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, tier="host", stash_bytes=0)  # every tensor uploaded (no forward stash)
    got = train(model, batch_of, steps=2, ctx=lambda: off)
    assert_same_grads(want, got)
    log = fake.log
    joins = [i for i, e in enumerate(log) if e[:2] == ("wait_event", "compute")]
    assert joins, "the compute stream waits for each upload's event"
    assert not any(e[:2] == ("wait", "compute") for e in log), "never for the whole side stream"
    # An upload (a copy on the side stream) is issued before the unpack that joins it: each
    # join but the first finds more uploads issued than joins made.
    side = [i for i, (stream, _) in enumerate(fake.copies) if stream.startswith("side")]
    assert len(side) >= 2 * off.summary().offloaded_tensors
    off.close()


def test_ssd_tier_stops_allocating_after_the_first_step(tmp_path: Path) -> None:
    off, fake, log, waited = train_logged(tmp_path, "transformer", tier="ssd")
    assert set(log[0]["bytes_offloaded"]) == {"ssd"}, "the SSD tier writes from the pinned buffers"
    assert waited == [], "the copies' events are waited for by the store's thread, not pack"
    off.close()
    assert open_handles() == 0

"""The budget of ``policy="scheduled"`` and ``"planned"`` on CUDA, on CPU through the fake CUDA backend.

The budget and the summary's ``resident_peak_bytes`` are device memory:
the saved tensors kept resident and the copies brought back to the device.
The pinned host buffers a CUDA payload passes through (a write in flight,
a read-back) are host memory: they are not counted, and pack never waits
for a disk write to bring the count under the budget (a write frees no
device memory). What is checked, on a model whose saved tensors the test
counts: just before backward the count equals the bytes held on the device
(the entries kept resident plus the fake's live device allocations), with
every device-to-host copy still in flight (the fake blocks any wait for
one, so a pack that waited would fail); the peak stays within the budget;
under ``policy="all"`` (nothing kept, no forward stash) the peak equals the
fake's device peak;
gradients stay bit-identical. And the uploads of the tensors kept in pinned
memory are prefetched in every step after the profiling one (a pinned
read-back of the profiling step once stayed counted for good, and shut the
prefetch window).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda, fake_offload
from offload_models import assert_same_grads, inputs, loss_of, open_handles, train

import pyfastensor
from pyfastensor.offload._saved import Entry

SMALL = 16 << 10
STEPS = 4


def _peak_without_offload(model: torch.nn.Module, batch_of: Any) -> int:
    none = pyfastensor.offload(policy="none", min_size=SMALL, module=model)
    train(model, batch_of, steps=1, ctx=lambda: none)
    return none.summary().resident_peak_bytes


def _kept(off: pyfastensor.Offload) -> int:
    """Bytes of the step's entries kept resident (on the device)."""
    return sum(e.nbytes for r in off._entries if (e := r()) is not None and e.resident is not None)


def _train_watching(model: torch.nn.Module, batch_of: Any, off: pyfastensor.Offload, fake: FakeCuda,
                    gate_forward: bool) -> tuple[list[list[torch.Tensor]], list[dict[str, int]]]:
    """:func:`offload_models.train` with ``off``, noting per step (after the profiling one) the
    meter just before backward against what is held on the device, and the step's peaks.
    ``gate_forward``: every device-to-host copy stays in flight through forward."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    grads, seen = [], []
    issued = [0]
    prefetch = Entry.prefetch

    def counted(entry: Entry) -> int:
        n = prefetch(entry)
        issued[0] += bool(n)
        return n

    Entry.prefetch = counted  # type: ignore[method-assign]
    try:
        for i in range(STEPS):
            _one_step(model, opt, batch_of, off, fake, gate_forward, i, grads, seen, issued)
    finally:
        Entry.prefetch = prefetch  # type: ignore[method-assign]
    grads.append([p.detach().clone() for p in model.parameters()])
    return grads, seen


def _one_step(model: torch.nn.Module, opt: Any, batch_of: Any, off: pyfastensor.Offload, fake: FakeCuda,
              gate_forward: bool, i: int, grads: list[list[torch.Tensor]], seen: list[dict[str, int]],
              issued: list[int]) -> None:
    """Step ``i`` of :func:`_train_watching`."""
    x, y = batch_of(i)
    opt.zero_grad()
    fake.reset_device_peak()
    issued[0] = 0
    with off:
        if gate_forward and i > 0:
            fake.gate.clear()  # a pack that waited for a copy or a write would hang, then fail
        try:
            loss = loss_of(model, x, y)
            if i > 0:
                seen.append({"meter": off._meter.now, "held": _kept(off) + fake.device_live,
                             "kept": _kept(off), "pending": len(off._writes.pending)})
        finally:
            fake.gate.set()
        loss.backward()
    if i > 0:
        s = off.summary()
        seen[-1].update(peak=s.resident_peak_bytes, device_peak=fake.device_peak,
                        offloaded=s.offloaded_tensors + s.staged_tensors, prefetched=issued[0])
    grads.append([p.grad.clone() for p in model.parameters()])
    opt.step()


@pytest.mark.parametrize("policy,tier", [("scheduled", "ssd"), ("scheduled", "host"), ("planned", "auto")])
def test_resident_count_is_device_bytes_and_stays_within_the_budget(tmp_path: Path, policy: str, tier: str) -> None:
    model, batch_of = inputs("transformer")
    want = train(model, batch_of, steps=STEPS)
    budget = _peak_without_offload(model, batch_of) // 2
    fake = FakeCuda()
    extra = {"host_bytes": 1 << 30} if policy == "planned" else {}
    off = fake_offload(fake, tmp_path, model, policy=policy, tier=tier, budget=budget, **extra)
    got, seen = _train_watching(model, batch_of, off, fake, gate_forward=True)
    assert_same_grads(want, got)
    assert len(seen) == STEPS - 1
    for s in seen:
        assert s["offloaded"] > 0, s
        assert s["meter"] == s["held"], f"the count is not what the device holds: {s}"
        assert s["peak"] <= budget, (s, budget)
    if (policy, tier) == ("scheduled", "ssd"):
        # The writes were all still in flight before backward (pinned copies, not counted).
        assert all(s["pending"] > 0 for s in seen), seen
    if policy == "scheduled":
        assert all(s["kept"] > 0 for s in seen), "the scheduler keeps some tensors resident"
    if (policy, tier) == ("scheduled", "host"):
        assert all(s["prefetched"] == s["offloaded"] for s in seen), f"every upload issued ahead: {seen}"
    else:
        assert all(s["prefetched"] > 0 for s in seen), seen
    off.close()
    assert open_handles() == 0


@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_resident_peak_is_the_device_peak_of_the_copies_brought_back(tmp_path: Path, tier: str) -> None:
    model, batch_of = inputs("transformer")
    want = train(model, batch_of, steps=STEPS)
    fake = FakeCuda()
    # Without the forward stash (whose sources are the model's tensors, not the fake's device
    # allocations): the peak is that of the copies brought back alone. The stash's count:
    # tests/test_offload_stash.py.
    off = fake_offload(fake, tmp_path, model, policy="all", tier=tier, stash_bytes=0)
    got, seen = _train_watching(model, batch_of, off, fake, gate_forward=False)
    assert_same_grads(want, got)
    for s in seen:
        assert s["kept"] == 0 and s["offloaded"] > 0
        assert s["meter"] == s["held"], s
        assert s["peak"] == s["device_peak"] > 0, s
        assert s["prefetched"] > 0, s
    off.close()
    assert open_handles() == 0

"""The forward stash of CUDA offload under ``tier="host"``, on CPU through the fake CUDA backend.

What is checked: backward gets the tensors still stashed without a
host-to-device copy (counted in the fake: every upload allocates device
memory there) and the others through uploads; the stash never holds more
than its bound; ``resident_peak_bytes`` counts it; it is cleared when
backward ends; policies that place tensors by plan, the SSD tier and a
lossy codec do not stash; gradients bit-identical to training without
offload throughout.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda, fake_offload
from offload_models import assert_same_grads, inputs, loss_of, train

import pyfastensor
from pyfastensor.offload._stash import Stash

STEPS = 3


def per_step(off: pyfastensor.Offload, fake: FakeCuda, log: list[dict[str, Any]]) -> Any:
    """A ``ctx`` for :func:`train` that notes each step's uploads (device allocations: the fake's
    ``empty``, which only host-to-device copies call) and summary once the step is over. Between
    steps the fake runs every copy issued (a GPU has): a stashed tensor's pinned copy, which
    nothing waits for, is done by the next step, which may then reuse its buffer."""
    def ctx() -> pyfastensor.Offload:
        fake.catch_up()
        if off.step:
            s = off.summary()
            log[-1].update(hits=s.stash_hits, stash_bytes=s.stash_bytes, offloaded=s.offloaded_tensors,
                           raw=s.raw_bytes_offloaded, peak=s.resident_peak_bytes,
                           uploads=len(fake.empties) - log[-1]["uploads"],
                           upload_bytes=sum(n for n, _ in fake.empties) - log[-1]["upload_bytes"])
        log.append({"uploads": len(fake.empties), "upload_bytes": sum(n for n, _ in fake.empties)})
        return off
    return ctx


def run(tmp_path: Path, model_name: str, **options: Any) -> tuple[pyfastensor.Offload, list[dict[str, Any]]]:
    """Train under the fake with ``options``, check the gradients, return the offload and the steps' log."""
    model, batch_of = inputs(model_name)
    want = train(model, batch_of, steps=STEPS)
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, **options)
    log: list[dict[str, Any]] = []
    ctx = per_step(off, fake, log)
    got = train(model, batch_of, steps=STEPS, ctx=ctx)
    ctx()  # the last step's line
    log.pop()
    assert_same_grads(want, got)
    assert fake.syncs == [], "nothing waited for a copy on the CPU"
    return off, log


@pytest.mark.parametrize("model_name", ["transformer", "mlp", "cnn"])
def test_stashed_tensors_are_served_without_an_upload(tmp_path: Path, model_name: str) -> None:
    off, log = run(tmp_path, model_name, tier="host")
    for s in log:
        assert s["hits"] > 0 and s["stash_bytes"] > 0, log
        assert s["uploads"] == s["offloaded"] - s["hits"], log
        assert s["upload_bytes"] == s["raw"] - s["stash_bytes"], log
    assert off._stash.bytes == 0, "cleared when backward ended"
    off.close()


def test_without_the_stash_every_tensor_is_uploaded(tmp_path: Path) -> None:
    off, log = run(tmp_path, "transformer", tier="host", stash_bytes=0)
    for s in log:
        assert s["hits"] == 0 and s["uploads"] == s["offloaded"] > 0 and s["upload_bytes"] == s["raw"], log
    off.close()


@pytest.mark.parametrize("bound", [0, 40 << 10, 100 << 10, 1 << 30])
def test_the_stash_never_exceeds_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: int) -> None:
    seen: list[int] = []
    put = Stash.put

    def checked(self: Stash, entry: Any, source: torch.Tensor) -> bool:
        kept = put(self, entry, source)
        seen.append(self.bytes)
        assert self.bytes <= bound, f"stash holds {self.bytes} bytes, bound {bound}"
        return kept

    monkeypatch.setattr(Stash, "put", checked)
    off, log = run(tmp_path, "mlp", tier="host", stash_bytes=bound)
    assert seen, "the stash was offered the tensors"
    for s in log:
        assert s["stash_bytes"] <= bound, log
        assert (s["hits"] > 0) == (max(seen) > 0), log
    off.close()


@pytest.mark.parametrize("stash_bytes", [None, 0])
def test_resident_peak_counts_the_stash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       stash_bytes: int | None) -> None:
    most = [0]
    put = Stash.put

    def noted(self: Stash, entry: Any, source: torch.Tensor) -> bool:
        kept = put(self, entry, source)
        most[0] = max(most[0], self.bytes)
        return kept

    monkeypatch.setattr(Stash, "put", noted)
    model, batch_of = inputs("transformer")
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, tier="host", stash_bytes=stash_bytes)
    want = train(model, batch_of, steps=1)
    x, y = batch_of(0)
    model = copy.deepcopy(model)
    with off:
        loss = loss_of(model, x, y)
        # Forward is done: the only device memory held because of the offload is the stash.
        forward = off.summary()
        now, stashed = off._meter.now, off._stash.bytes
        loss.backward()
    assert forward.offloaded_tensors > 0
    assert now == stashed and forward.resident_peak_bytes == most[0], (now, stashed, forward, most)
    assert (stashed > 0) == (stash_bytes is None)
    assert off.summary().resident_peak_bytes >= most[0]
    for w, p in zip(want[0], model.parameters(), strict=True):
        assert torch.equal(w, p.grad)
    off.close()


def test_the_stash_is_cleared_when_backward_ends(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
    x = torch.randn(256, 64)

    def grads(ctx: Any) -> list[torch.Tensor]:
        for p in (*a.parameters(), *b.parameters()):
            p.grad = None
        with ctx:
            y = a(x).relu()
            z = b(y).relu()  # not in the first loss: its node does not run in that backward
            y.pow(2).sum().backward(retain_graph=True)
            stashed = off._stash.bytes if isinstance(ctx, pyfastensor.Offload) else 0
            z.pow(2).sum().backward()  # served from the pinned copies
        return [stashed] + [p.grad.clone() for p in (*a.parameters(), *b.parameters())]

    want = grads(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, torch.nn.ModuleList([a, b]), min_size=1 << 10, tier="host", stash_bytes=1 << 30)
    got = grads(off)
    assert got[0] == 0, "the first backward's end cleared the stash (z's tensors were in it)"
    for w, g in zip(want[1:], got[1:], strict=True):
        assert torch.equal(w, g)
    s = off.summary()
    assert 0 < s.stash_hits < s.offloaded_tensors, s
    off.close()


@pytest.mark.parametrize("options", [
    {"tier": "ssd"},
    {"tier": "host", "compression": "fp16"},
    {"tier": "host", "policy": "scheduled", "budget": 1 << 30},
], ids=["ssd", "fp16", "scheduled"])
def test_no_stash_where_it_does_not_apply(tmp_path: Path, options: dict[str, Any]) -> None:
    model, batch_of = inputs("mlp")
    fake = FakeCuda()
    off = fake_offload(fake, tmp_path, model, **options)
    train(model, batch_of, steps=STEPS, ctx=lambda: off)
    assert off.summary().stash_hits == 0 and off._stash.bytes == 0
    off.close()


def test_stash_bytes_must_be_a_number_of_bytes() -> None:
    with pytest.raises(ValueError, match=r"stash_bytes -1: expected None or a number of bytes >= 0"):
        pyfastensor.offload(tier="host", stash_bytes=-1)

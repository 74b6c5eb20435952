"""What autograd sees through pyfastensor.offload: params, dedupe, views, reuse, checkpoint."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.utils.checkpoint as cp
from offload_models import open_handles
from torch import nn

import pyfastensor
from pyfastensor.offload._store import SpillStore

KIB = 1 << 10


@pytest.fixture
def puts(monkeypatch):
    """Addresses and sizes of every put into a spill store."""
    seen: list[tuple[int, int]] = []
    real = SpillStore.put

    def spy(self, addr, n, account=0):
        seen.append((addr, n))
        return real(self, addr, n, account)

    monkeypatch.setattr(SpillStore, "put", spy)
    return seen


class Probe(torch.autograd.Function):
    """y = x * w; saves x and records what backward gets back."""

    seen: list[torch.Tensor] = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        Probe.seen.append(x)
        return g * w, (g * x).sum_to_size(w.shape)


def offload(tmp_path, **kw):
    kw.setdefault("min_size", 4 * KIB)
    return pyfastensor.offload(spill_dir=str(tmp_path), **kw)


@pytest.mark.parametrize("pass_module", [True, False], ids=["module=", "no-module"])
def test_parameters_and_buffers_never_offloaded(tmp_path, puts, pass_module):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(256, 256)
            self.frozen = nn.Parameter(torch.randn(256, 256), requires_grad=False)
            self.register_buffer("scale", torch.randn(64, 256))

        def forward(self, x):
            h = torch.relu(self.lin(x)) @ self.frozen
            return h * self.scale

    m = M()
    x = torch.randn(64, 256)
    hooks = nn.modules.module._global_forward_pre_hooks
    before = set(hooks)  # another test's objects may still await collection
    with offload(tmp_path, module=m if pass_module else None) as off:
        m(x).sum().backward()
    own = {t.untyped_storage().data_ptr() for t in [*m.parameters(), *m.buffers()]}
    assert puts, "activations were offloaded"
    assert not own & {addr for addr, _ in puts}
    assert off.summary().skipped_tensors >= 2
    assert len(set(hooks) - before) == (0 if pass_module else 1), "one watch, kept for the next step"
    off.close()
    assert set(hooks) <= before, "the module watch outlived close()"


def test_module_watch_is_one_hook_for_every_step_and_goes_with_its_object(tmp_path):
    """torch.compile guards on the global module hooks: the watch's hook stays the same from
    step to step (one added and removed per step recompiled a compiled model every step), and
    goes when the offload object is collected without close()."""
    m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    x = torch.randn(64, 256)
    hooks = nn.modules.module._global_forward_pre_hooks
    before = set(hooks)  # another test's objects may still await collection
    off = offload(tmp_path)
    seen = []
    for _ in range(3):
        with off:
            m(x).sum().backward()
        seen.append({k: v for k, v in hooks.items() if k not in before})
    assert len(seen[0]) == 1 and seen == [seen[0]] * 3
    del off, seen
    gc.collect()
    assert set(hooks) <= before, "the module watch outlived its offload object"


def test_same_storage_offloaded_once(tmp_path, puts):
    lin = nn.Linear(128, 128)
    x = torch.randn(64, 128)
    with offload(tmp_path) as off:
        y = torch.relu(lin(x))
        loss = (y * y).sum()  # relu saves y, mul saves y twice
        off.flush()  # writes done: backward reads the slot rather than the payload in memory
        loss.backward()
    s = off.summary()
    assert s.deduplicated >= 2
    addrs = [a for a, _ in puts]
    assert len(addrs) == len(set(addrs))
    # ...and read back once: the storage stays in memory between the nodes that unpack it
    assert s.bytes_read == s.bytes_offloaded["ssd"] > 0


def test_storage_unpacked_by_two_nodes_is_let_go_after_the_last(tmp_path):
    lin1, lin2 = nn.Linear(128, 128), nn.Linear(128, 128)
    x = torch.randn(64, 128)
    off = offload(tmp_path)
    with off:
        h = torch.relu(lin1(x))  # relu saves h, lin2 saves h: two handles, one slot
        loss = lin2(h).sum()
        del h
        off.flush()
        entries = [e for r in off._entries if (e := r()) is not None and e.stored]
        assert [e.waiting for e in entries if e.waiting > 1], "no entry with two handles"
        loss.backward()
    assert all(e.kept is None and e.waiting == 0 for e in entries), "a restored storage is still held"
    assert off.summary().bytes_read == off.summary().bytes_offloaded["ssd"]


@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_views_restored_exactly(tmp_path, tier):
    leaf = torch.randn(64, 96, requires_grad=True)
    views = {
        "transpose": lambda b: b.t(),
        "slice": lambda b: b[3:, 5::3],
        "expand": lambda b: b[:1].expand(64, 96),
        "dtype-strided": lambda b: b.double()[::2].t(),
    }
    for name, make in views.items():
        v = make(leaf * 1)  # a view of a non-leaf
        w = torch.randn(v.shape, requires_grad=True)
        Probe.seen.clear()
        with offload(tmp_path, tier=tier, min_size=1) as off:
            y = Probe.apply(v, w).sum()
            off.flush()  # the bytes come back from the store, not from v's memory
            y.backward()
        got = Probe.seen[0]
        assert got.shape == v.shape, name
        assert got.stride() == v.stride(), name
        assert got.storage_offset() == v.storage_offset(), name
        assert got.dtype == v.dtype and got.device == v.device, name
        assert torch.equal(got, v), name
        assert got.untyped_storage().data_ptr() != v.untyped_storage().data_ptr() or name == "expand"


def test_small_tensors_stay_in_memory(tmp_path, puts):
    x = torch.randn(16, 16) * 1
    w = torch.randn(16, 16, requires_grad=True)
    Probe.seen.clear()
    with offload(tmp_path, min_size=1 << 20) as off:
        Probe.apply(x, w).sum().backward()
    # the tensor itself (torch 2.4 hands back another Python object over the same tensor)
    got = Probe.seen[0]
    assert got.data_ptr() == x.data_ptr() and got.shape == x.shape and got.stride() == x.stride()
    assert not puts
    assert off.summary().offloaded_tensors == 0


def test_unpack_twice_with_retain_graph(tmp_path):
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(128, 256), nn.Linear(256, 8)
    x = torch.randn(64, 128)
    off = offload(tmp_path)
    first: list[int] = []

    def run(ctx):
        with ctx:
            loss = lin2(torch.relu(lin1(x))).square().sum()
            if ctx is off:
                off.flush()  # writes done: the first backward reads every slot too
            g1 = torch.autograd.grad(loss, [lin1.weight, lin2.weight], retain_graph=True)
            if ctx is off:
                first.append(off.summary().bytes_read)
            gc.collect()
            g2 = torch.autograd.grad(loss, [lin1.weight, lin2.weight])
        return g1, g2

    (a1, a2), (b1, b2) = run(torch.enable_grad()), run(off)
    for want, got in zip([*a1, *a2], [*b1, *b2], strict=True):
        assert torch.equal(want, got)
    s = off.summary()
    assert s.offloaded_tensors > 0
    assert first == [s.bytes_offloaded["ssd"]], "the first backward reads every slot once"
    assert s.bytes_read >= 2 * s.bytes_offloaded["ssd"], "the second reads them again"


def test_double_backward(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(64, 64)
    x = torch.randn(128, 64, requires_grad=True)

    def run(ctx):
        lin.zero_grad()
        with ctx:
            y = torch.tanh(lin(x)).sum()
            (gx,) = torch.autograd.grad(y, x, create_graph=True)
            gx.square().sum().backward()
        return lin.weight.grad.clone()

    off = offload(tmp_path)
    assert torch.equal(run(torch.enable_grad()), run(off))
    assert off.summary().offloaded_tensors > 0


def test_checkpoint_inside_and_around(tmp_path):
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.GELU()) for _ in range(3)])
    x = torch.randn(64, 128)
    inner, outer = offload(tmp_path), offload(tmp_path)

    def run(mode):
        blocks.zero_grad()
        if mode == "plain":
            blocks(x).sum().backward()
        elif mode == "checkpoint-inside":
            with outer:
                h = cp.checkpoint(blocks[0], x, use_reentrant=False)
                blocks[2](blocks[1](h)).sum().backward()
            assert outer.summary().offloaded_tensors > 0
        else:  # offload inside a checkpointed function: the innermost hooks save its tensors
            def fn(t):
                with inner:
                    return blocks[1](blocks[0](t))
            blocks[2](cp.checkpoint(fn, x, use_reentrant=False)).sum().backward()
            assert inner.summary().offloaded_tensors > 0
        return [p.grad.clone() for p in blocks.parameters()]

    want = run("plain")
    for mode in ("checkpoint-inside", "offload-inside-checkpoint"):
        for w, g in zip(want, run(mode), strict=True):
            assert torch.equal(w, g), mode
    inner.close()
    outer.close()
    gc.collect()
    assert open_handles() == 0


def test_inplace_ops_autograd_allows(tmp_path):
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(64, 128), nn.Linear(128, 64)
    x = torch.randn(256, 64)

    def run(ctx):
        lin1.zero_grad()
        lin2.zero_grad()
        with ctx:
            h = lin1(x)
            h.relu_()  # relu_ saves its result; h is not saved by lin1
            h2 = lin2(h)
            h2.mul_(2)  # lin2 does not save its output
            h2.sum().backward()
        return [lin1.weight.grad.clone(), lin2.weight.grad.clone()]

    off = offload(tmp_path)
    for w, g in zip(run(torch.enable_grad()), run(off), strict=True):
        assert torch.equal(w, g)
    assert off.summary().offloaded_tensors > 0


TORCH_INPLACE_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"


@pytest.mark.parametrize("tier", ["ssd", "host"])
@pytest.mark.parametrize("size,flush", [(256, False), (256, True), (8, False)],
                         ids=["stored, write in flight", "stored, written", "kept (small)"])
def test_inplace_change_of_a_saved_tensor_raises_torchs_error(tmp_path, tier, size, flush):
    """Saved-tensor hooks switch torch's version check off; offload keeps it. Without it the
    gradient would depend on whether the spill write had read the bytes before the change."""
    w = torch.randn(size, size, requires_grad=True)
    x = torch.randn(size, size)

    def run(ctx):
        with ctx:
            y = (x @ w).sigmoid()  # sigmoid saves its output
            if flush and hasattr(ctx, "flush"):
                ctx.flush()
            y[0].mul_(2)  # through a view: the base's counter moves
            with pytest.raises(RuntimeError, match=TORCH_INPLACE_ERROR) as e:
                y.sum().backward()
        return str(e.value)

    assert "is at version 1; expected version 0 instead" in run(torch.enable_grad())
    off = offload(tmp_path, tier=tier)
    msg = run(off)
    assert f"[torch.float32 [{size}, {size}]] is at version 1; expected version 0 instead" in msg
    assert "pyfastensor.offload" in msg
    assert off.summary().offloaded_tensors == (2 if size == 256 else 0)  # x (for mm) and y
    off.close()


def test_slot_freed_when_autograd_drops_it(tmp_path):
    lin = nn.Linear(256, 256)
    off = offload(tmp_path)
    with off:
        loss = torch.relu(lin(torch.randn(64, 256))).sum()
        live = off._store.stats()["live_slots"]
        assert live > 0
        store = off._store
    assert store.stats()["live_slots"] == live, "exit does not free what the graph still holds"
    loss.backward()  # backward outside the context still works, then frees the slots
    gc.collect()
    assert store.stats()["live_slots"] == 0
    del store, off  # the store closes with its last reference
    gc.collect()
    assert open_handles() == 0

"""Training under pyfastensor.offload gives bit-identical gradients on small real models."""

from __future__ import annotations

import json

import pytest
import torch
from offload_models import assert_same_grads, inputs, open_handles, train

import pyfastensor

SMALL = 16 << 10  # offload tensors of 16 KiB and more


@pytest.mark.parametrize("model_name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_gradients_bit_identical(tmp_path, model_name, tier):
    model, batch_of = inputs(model_name)
    want = train(model, batch_of, steps=3)
    off = pyfastensor.offload(tier=tier, spill_dir=str(tmp_path), min_size=SMALL, module=model)
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    assert_same_grads(want, got)
    s = off.summary()
    assert s.offloaded_tensors > 0
    assert s.bytes_offloaded[tier] > 0
    assert s.tier == tier
    off.close()
    assert open_handles() == 0
    assert list(tmp_path.iterdir()) == []


def test_one_store_kept_across_steps(tmp_path):
    model, batch_of = inputs("mlp")
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, module=model)
    stores, files, written = [], [], []
    for step in range(4):
        train(model, batch_of, steps=1, ctx=lambda: off)
        stores.append(off._store)
        files.append(off._store.stats()["file_bytes"])
        written.append(off.summary().bytes_offloaded["ssd"])
        assert off.summary().step == step
    assert all(s is stores[0] for s in stores), "a step opened a new store"
    assert files[-1] == files[1], "the spill file grew after the first steps: freed space is not reused"
    assert len(set(written)) == 1 and written[0] > 0, f"per-step bytes, not totals: {written}"
    assert open_handles() > 0
    off.close()
    assert off._store is None and open_handles() == 0
    assert off.summary().bytes_offloaded["ssd"] == written[-1]
    train(model, batch_of, steps=1, ctx=lambda: off)  # entering again opens a new store
    assert off._store is not stores[0]
    off.close()
    assert open_handles() == 0


def test_close_before_backward_says_why(tmp_path):
    lin = torch.nn.Linear(256, 256)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4096)
    with off:
        loss = torch.relu(lin(torch.randn(128, 256))).sum()
    with pytest.raises(RuntimeError, match="inside the context"):
        with off:
            off.close()
    off.close()
    with pytest.raises(RuntimeError, match=r"Offload.close\(\) was called"):
        loss.backward()
    assert open_handles() == 0


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_sparse_compression_is_lossless(tmp_path, model_name):
    model, batch_of = inputs(model_name)
    want = train(model, batch_of, steps=2)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, compression="sparse")
    got = train(model, batch_of, steps=2, ctx=lambda: off)
    assert_same_grads(want, got)
    assert "sparse" in off.summary().compression
    assert off.summary().compression["sparse"] > 1


def test_fp16_compression_within_tolerance(tmp_path):
    model, batch_of = inputs("mlp")
    want = train(model, batch_of, steps=1)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, compression=("fp16", "sparse"))
    got = train(model, batch_of, steps=1, ctx=lambda: off)
    for x, y in zip(want[0], got[0], strict=True):
        torch.testing.assert_close(y, x, rtol=2e-2, atol=2e-3)
    assert set(off.summary().compression) <= {"fp16", "fp16+sparse", "raw"}
    assert max(off.summary().compression.values()) >= 2


def test_policy_none_measures_without_offloading(tmp_path):
    model, batch_of = inputs("mlp")
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, policy="none")
    train(model, batch_of, steps=1, ctx=lambda: off)
    s = off.summary()
    assert s.offloaded_tensors == 0
    assert s.resident_tensors > 0
    assert s.resident_peak_bytes > 0
    assert off._store is None and open_handles() == 0, "policy='none' opened a spill store"


@pytest.fixture
def prefetches(monkeypatch):
    """``watch(off)`` returns the list of (step, pack index) of every prefetch ``off`` asks for.

    Whether a prefetch is needed depends on timing (a tensor whose write is
    still in flight is served from memory), so tests check what the
    prefetcher asks for, not the hits.
    """
    from pyfastensor.offload._saved import Entry

    asked: list[tuple[int, int]] = []
    watched: list[pyfastensor.offload.Offload] = []
    real = Entry.prefetch

    def spy(entry: Entry) -> int:
        asked.append((watched[0].step, entry.index))
        return real(entry)

    monkeypatch.setattr(Entry, "prefetch", spy)

    def watch(off: pyfastensor.offload.Offload) -> list[tuple[int, int]]:
        watched.append(off)
        return asked

    return watch


def test_prefetch_follows_profiled_order(tmp_path, prefetches):
    model, batch_of = inputs("mlp", batch=256)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, budget=64 << 20)
    asked = prefetches(off)
    want = train(model, batch_of, steps=3)
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    assert_same_grads(want, got)
    assert off._order is not None and len(off._order) > 0
    assert asked, "no prefetch was asked for after the profiling step"
    for step in {s for s, _ in asked}:
        indices = [i for s, i in asked if s == step]
        positions = [off._order.index(i) for i in indices]
        assert positions == sorted(positions), f"step {step}: prefetches out of profiled order"


class _SavesTwo(torch.autograd.Function):
    """y = x * 2; saves two fresh tensors and unpacks them in the order saved."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x * 3, x * 5)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        first, second = ctx.saved_tensors  # unpacks in saving order: not the reverse of packing
        return g * 2 + (first - first) + (second - second)


def test_prefetch_order_is_recorded_not_assumed(tmp_path, prefetches):
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, budget=64 << 20)
    asked = prefetches(off)
    x = torch.randn(1 << 14, requires_grad=True)  # 64 KiB
    grads = []
    for _ in range(3):
        x.grad = None
        with off:
            loss = _SavesTwo.apply(_SavesTwo.apply(x)).sum()
            off.flush()  # writes done: backward reads every slot, prefetched after the first step
            loss.backward()
        grads.append(x.grad.clone())
        s = off.summary()
        if off.step > 1:
            assert s.prefetch_hits >= 3 and s.bytes_read == s.bytes_offloaded["ssd"], s
    # Packed 0, 1 (first function), 2, 3 (second); backward runs the second
    # function first and unpacks what it saved in saving order.
    assert off._order == [2, 3, 0, 1]
    for step in (1, 2):
        got = [i for s, i in asked if s == step]
        assert got and got == [i for i in off._order if i in got], f"step {step}: {got}"
        assert 0 in got or 1 in got, "prefetch never went past the second function's tensors"
    assert all(torch.equal(g, torch.full_like(g, 4.0)) for g in grads)
    off.close()


def test_scheduled_policy_plans_after_profiling(tmp_path, capsys):
    model, batch_of = inputs("cnn")
    want = train(model, batch_of, steps=3)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, policy="scheduled",
                              budget=256 << 10, compression="sparse", verbose=True)
    assert off.plan() is None
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    assert_same_grads(want, got)
    plan = off.plan_details
    assert plan is not None
    assert "offload plan" in capsys.readouterr().out
    decisions = plan["decisions"]
    assert any(d["offload"] for d in decisions)
    resident = sum(d["size"] for d in decisions if not d["offload"])
    assert resident == plan["resident_bytes"]
    assert resident <= 256 << 10 or not plan["fits_budget"]
    assert off.summary().resident_tensors == sum(1 for d in decisions if not d["offload"])
    # The profile measured every codec but the plan only uses the allowed one.
    tensors = plan["profile"]["tensors"]
    relu = [t for t in tensors if t["relu"]]
    assert relu and all(0 < t["measured_ratios"]["sparse"] for t in relu)
    assert any("fp16" in t["measured_ratios"] for t in tensors)  # max-pool indices (int64) have none
    assert not any("fp16" in c for t in tensors for c in t["ratios"]), "fp16 was not allowed"
    assert all(t["write_ns"] > 0 for t in tensors)
    unpacked = [t for t in tensors if t["bwd_gap_ns"] >= 0]
    assert len(unpacked) >= len(tensors) - 1 and sum(t["bwd_gap_ns"] for t in unpacked) > 0
    assert sum(t["bwd_gap_ns"] for t in unpacked) <= plan["profile"]["backward_ns"]
    assert all(t["codec_ns"]["sparse"] > 0 for t in tensors if "sparse" in t["ratios"]), "codec cost not measured"
    assert {d["codec"] for d in decisions if d["offload"]} <= {"raw", "sparse"}
    assert "offload to ssd" in off.plan()


class _SavesItsFactor(torch.autograd.Function):
    """``x * s``, saving ``s`` whatever its dtype (as ops that save indices do)."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return g * s.to(g.dtype), None


def test_scheduled_codecs_follow_the_tensor_at_a_pack_index_not_the_profiled_one(tmp_path, monkeypatch):
    """The plan is by pack index; a later step saving an int64 where the profiled step saved a
    float32 must not get the float32's fp16 codec (that would return other integers)."""
    from pyfastensor.offload import _policy

    real = _policy.schedule

    def all_fp16(prof):  # the scheduler's choice, made deterministic: fp16 for every tensor
        result = real(prof)
        for d in result["decisions"]:
            d["offload"], d["codec"] = True, "fp16"
        return result

    monkeypatch.setattr(_policy, "schedule", all_fp16)

    def step(s):
        x = torch.ones(s.numel(), requires_grad=True)
        _SavesItsFactor.apply(x, s).sum().backward()
        return x.grad

    n = SMALL
    off = pyfastensor.offload(policy="scheduled", compression="fp16", budget=1, spill_dir=str(tmp_path), min_size=1024)
    for _ in range(2):  # profiled, then planned: a float32 at pack index 0
        with off:
            step(torch.full((n,), 0.5))
    assert [(d["index"], d["codec"]) for d in off.plan_details["decisions"]] == [(0, "fp16")]
    ints = torch.arange(70_000, 70_000 + n, dtype=torch.int64)  # not exact in fp16
    want = step(ints)
    with off:
        got = step(ints)
    assert torch.equal(got, want)
    off.close()


def test_scheduled_policy_needs_a_budget():
    with pytest.raises(ValueError, match="budget"):
        pyfastensor.offload(policy="scheduled")


def _seed_spill_dictionary(spill_dir, fast_write: str, fast_read: str) -> None:
    """Write the spill dictionary file of ``spill_dir`` with measurements for 2 MiB
    transfers that make ``fast_write`` the best writer and ``fast_read`` the best reader."""
    from pyfastensor.dictionary import dictionary_path
    from pyfastensor.offload._store import _spill_engines

    main = dictionary_path(spill_dir)
    engines = _spill_engines(str(spill_dir))
    doc = json.loads(json.dumps(pyfastensor.dictionary.locate(spill_dir)))  # key and settings
    assert {fast_write, fast_read} <= set(engines)

    def table(best: str, second: str, seconds: float) -> list[dict]:
        times = {e: 1e-6 if e == best else seconds if e == second else 10.0 for e in engines}
        return [{"bucket": 21, "size": 2 << 20, "best": best, "engines": {
            e: {"seconds": t, "samples": 5} for e, t in times.items()}}]

    # Write+read sums: fast_write 2 s (its read), fast_read 1 s (its write): fast_read wins.
    body = {"schema": 1, "key": doc["key"], "updated": "2026-01-01T00:00:00Z",
            "settings": {"mode": "aware", "explore": 1, "refresh": 0, "alpha": 0.25,
                         "write_engines": engines, "read_engines": engines},
            "write": table(fast_write, fast_read, 1.0), "read": table(fast_read, fast_write, 2.0)}
    main.parent.mkdir(parents=True, exist_ok=True)
    main.with_name(main.stem + "-spill.json").write_text(json.dumps(body))


@pytest.mark.parametrize("dictionary, want", [("w", "posix"), ("r", "direct"), ("wr", "direct")])
def test_dictionary_picks_the_spill_engine(tmp_path, monkeypatch, dictionary, want):
    """The dictionary= option decides the spill engine: WDic or RDic answer both directions."""
    from pyfastensor.offload._store import _spill_engines

    monkeypatch.setenv("PYFASTENSOR_CACHE_DIR", str(tmp_path / "cache"))
    spill = tmp_path / "spill"
    spill.mkdir()
    if "direct" not in _spill_engines(str(spill)):
        pytest.skip("no O_DIRECT in the temporary directory")
    _seed_spill_dictionary(spill, fast_write="posix", fast_read="direct")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(3)])
    x = torch.randn(512, 1024)  # saved activations of 2 MiB
    off = pyfastensor.offload(spill_dir=str(spill), min_size=SMALL, module=model, dictionary=dictionary)
    with off:
        model(x).sum().backward()
    s = off.summary()
    assert s.dictionary == dictionary
    assert s.offloaded_tensors > 0
    assert set(s.engines) == {want}, s.engines


def test_profile_times_are_for_the_uncompressed_size():
    from pyfastensor.offload._profile import Recorder

    rec = Recorder(frozenset({"sparse"}))
    t = torch.relu(torch.randn(1 << 18))  # 1 MiB of float32, about half zeros
    rec.packed(0, slot=7, t=t, nbytes=1 << 20, relu=True, started=rec.start)
    # The profiling step wrote it sparse: 300 KiB in 1 ms.
    rec.measured(7, {"size": 300 << 10, "write_ns": 1_000_000, "read_ns": 500_000})
    r = rec.profile(budget=0)["tensors"][0]
    assert r["write_ns"] == int(1_000_000 * (1 << 20) / (300 << 10))
    assert r["read_ns"] == int(500_000 * (1 << 20) / (300 << 10))
    assert r["ratios"] == {"sparse": r["measured_ratios"]["sparse"]} and r["ratios"]["sparse"] > 1


def test_read_buffers_are_reused_across_steps(tmp_path):
    from pyfastensor.offload._pool import POOL_MIN, BufferPool

    pool = BufferPool()
    a = pool.take(POOL_MIN)
    addr = a.data_ptr()
    assert addr % 4096 == 0, "O_DIRECT needs page-aligned read-backs"
    b = pool.take(POOL_MIN)
    assert b.data_ptr() != addr, "a buffer in use was handed out again"
    view = a[10:]
    del a
    assert pool.take(POOL_MIN).data_ptr() != addr, "freed while a view of it was alive"
    del view
    pool.lend_idle()  # MADV_FREE: contents may go, the mapping stays usable
    c = pool.take(POOL_MIN)
    assert c.data_ptr() == addr
    c.fill_(7)
    assert int(c.sum()) == 7 * POOL_MIN
    assert pool.reserved == 3 * POOL_MIN
    pool.lend_idle()  # the third mapping went unused since the last call: dropped
    assert pool.reserved == 2 * POOL_MIN
    assert b.data_ptr() != c.data_ptr() and int(c.sum()) == 7 * POOL_MIN, "a mapping in use was dropped"

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    x = torch.randn(1024, 1024)  # 4 MiB activations: read back into pool buffers
    want = []
    for _ in range(3):
        model.zero_grad()
        model(x).square().mean().backward()
        want.append([p.grad.clone() for p in model.parameters()])
    off = pyfastensor.offload(spill_dir=str(tmp_path), module=model, budget=8 << 20)
    reserved = []
    for step in range(3):
        model.zero_grad()
        with off:
            loss = model(x).square().mean()
            off.flush()
            loss.backward()
        assert all(torch.equal(w, p.grad) for w, p in zip(want[step], model.parameters(), strict=True))
        s = off.summary()
        assert s.bytes_read > 0
        reserved.append(s.read_buffer_bytes)
    # The profiling step reads one at a time; later steps prefetch within the budget.
    assert 0 < reserved[0] <= reserved[1] == reserved[2] <= 8 << 20, f"read buffers not reused: {reserved}"
    off.close()
    assert off.summary().read_buffer_bytes == 0, "close() keeps read buffers"


def test_summaries_of_objects_sharing_a_store_are_their_own(tmp_path):
    # Two offload objects on one spill directory share the process's store;
    # each summary counts its own step's transfers, not the other's (their
    # steps interleave: each summary is read after the other's step ran).
    mlp, mlp_batch = inputs("mlp")
    cnn, cnn_batch = inputs("cnn")
    a = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, module=mlp)
    b = pyfastensor.offload(spill_dir=str(tmp_path), min_size=SMALL, module=cnn)
    for _ in range(3):
        train(mlp, mlp_batch, steps=1, ctx=lambda: a)
        train(cnn, cnn_batch, steps=1, ctx=lambda: b)
        assert a._store is b._store
        for off in (a, b):
            got = off.summary()
            written = got.bytes_offloaded["ssd"]
            # raw codec: what was written is exactly this object's own offloaded bytes
            assert written == got.raw_bytes_offloaded > 0, f"{got}"
            assert sum(got.engines.values()) == written
            assert 0 < got.bytes_read <= written
    assert a.summary().raw_bytes_offloaded != b.summary().raw_bytes_offloaded  # two different models
    a.close()
    b.close()

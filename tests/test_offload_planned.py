"""policy="planned": G10's migration plan applied to the saved tensors."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest
import torch
from cuda_fakes import FakeCuda
from offload_models import assert_same_grads, inputs, loss_of, open_handles, train

import pyfastensor
from pyfastensor import plan as g10
from pyfastensor.errors import InvalidArgumentError
from pyfastensor.offload import _planned, _staging
from pyfastensor.offload._order import PlannedPrefetcher

SMALL = 16 << 10


def _peak_without_offload(model: torch.nn.Module, batch_of) -> int:
    none = pyfastensor.offload(policy="none", min_size=SMALL, module=model)
    train(model, batch_of, steps=1, ctx=lambda: none)
    return none.summary().resident_peak_bytes


def _need(model: torch.nn.Module, batch_of, spill_dir) -> int:
    """The least feasible budget: the most saved-tensor bytes one op of the step's trace uses."""
    off = pyfastensor.offload(policy="planned", budget=1 << 40, min_size=SMALL, module=model, spill_dir=spill_dir)
    train(model, batch_of, steps=2, ctx=lambda: off)
    off.close()
    return _planned.need_bytes(off.plan_details["trace"].to_dict())[0]


class _Steps:
    """The context of every step, noting each finished step's summary."""

    def __init__(self, off: pyfastensor.offload.Offload) -> None:
        self.off, self.summaries = off, []

    def __call__(self) -> pyfastensor.offload.Offload:
        if self.off.step:
            self.summaries.append(self.off.summary())
        return self.off


@pytest.mark.parametrize("model_name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("budget_kind", ["fits", "half", "tight"])
def test_gradients_bit_identical_and_budget_held(tmp_path, model_name, budget_kind):
    model, batch_of = inputs(model_name)
    want = train(model, batch_of, steps=3)
    peak = _peak_without_offload(model, batch_of)
    budget = {"fits": 2 * peak, "half": peak // 2}.get(budget_kind) or _need(model, batch_of, str(tmp_path))
    off = pyfastensor.offload(policy="planned", budget=budget, min_size=SMALL, module=model, spill_dir=str(tmp_path))
    steps = _Steps(off)
    got = train(model, batch_of, steps=3, ctx=steps)
    assert_same_grads(want, got)
    steps.summaries.append(off.summary())
    plan = off.plan_details["plan"]
    # The chosen plan may be one made for less memory (it then runs within that).
    assert plan.capacity <= budget and plan.peak_bytes <= plan.capacity
    tiers = {d["tier"] for d in off.plan_details["decisions"]}
    for s in steps.summaries:
        assert s.resident_peak_bytes <= budget, (s.step, s.resident_peak_bytes, budget)
    planned = steps.summaries[1:]  # step 0 is the profiling step: everything offloaded
    if budget_kind == "fits":
        assert plan.migrations == () and tiers == {"stay"}
        for s in planned:
            assert s.offloaded_tensors == 0 and s.staged_tensors == 0 and s.bytes_offloaded == {}, s
            assert s.bytes_read == 0
    else:
        assert "ssd" in tiers and plan.demand_bytes > budget
        assert all(s.offloaded_tensors > 0 and s.bytes_offloaded["ssd"] > 0 for s in planned)
    off.close()
    assert open_handles() == 0
    assert list(tmp_path.iterdir()) == []


def _entries_after_forward(off, model, batch_of, step: int) -> dict[str, set[int]]:
    """Run one step; just before backward, say where each stored entry is (resident, ssd or host)."""
    x, y = batch_of(step)
    where: dict[str, set[int]] = {"stay": set(), "ssd": set(), "host": set()}
    with off:
        loss = loss_of(model, x, y)
        for ref in off._entries:
            e = ref()
            if e is None:
                continue
            if e.resident is not None:
                where["stay"].add(e.index)
            elif e.hosted is not None:
                where["host"].add(e.index)
            elif e.held is not None:
                where["ssd"].add(e.index)
        loss.backward()
    return where


def test_decisions_are_honoured_on_every_tier(tmp_path, monkeypatch):
    # A slow SSD (as the planner sees it) saturates, so G10 also uses the host tier; host memory
    # holds a quarter of the peak, so with half the peak on the device the SSD takes the rest.
    # Both speeds are fixed here, so the plan does not depend on this machine's timings.
    monkeypatch.setattr(_planned, "measured_bps", lambda profile, key: 2e7)
    monkeypatch.setattr(_planned, "link_bps", lambda device, nbytes: 1e10)
    model, batch_of = inputs("transformer")
    want = train(model, batch_of, steps=4)
    peak = _peak_without_offload(model, batch_of)
    off = pyfastensor.offload(policy="planned", tier="auto", host_bytes=peak // 4, budget=peak // 2, min_size=SMALL,
                              module=model, spill_dir=str(tmp_path))
    fake = FakeCuda()
    off._staging = _staging.Staging(fake)
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    decisions = off.plan_details["decisions"]
    planned = {t: {d["index"] for d in decisions if d["tier"] == t} for t in ("stay", "ssd", "host")}
    assert all(planned.values()), planned  # the plan uses every tier
    s = off.summary()
    assert (s.resident_tensors, s.offloaded_tensors, s.staged_tensors) == (
        len(planned["stay"]), len(planned["ssd"]), len(planned["host"]))
    assert s.bytes_offloaded["host"] == sum(d["bytes"] for d in decisions if d["tier"] == "host")
    # The host tier went through the staging: a copy on the side stream after compute, per tensor.
    assert sum(e[0] == "wait" and e[2] == "compute" for e in fake.log) >= len(planned["host"])
    assert any(e[:2] == ("wait_event", "compute") for e in fake.log), "uploads make compute wait for their events"
    # One more step, looked at between forward and backward: every entry is where the plan put it.
    where = _entries_after_forward(off, model, batch_of, 3)
    assert where == planned
    assert_same_grads(want[:3], got[:3])
    off.close()
    assert open_handles() == 0


def test_host_tier_on_cpu_without_a_fake_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(_planned, "measured_bps", lambda profile, key: 2e7)
    model, batch_of = inputs("cnn")
    want = train(model, batch_of, steps=3)
    peak = _peak_without_offload(model, batch_of)
    off = pyfastensor.offload(policy="planned", tier="auto", host_bytes=1 << 30, budget=peak // 2, min_size=SMALL,
                              module=model, spill_dir=str(tmp_path))
    got = train(model, batch_of, steps=3, ctx=lambda: off)
    assert_same_grads(want, got)
    s = off.summary()
    assert s.staged_tensors > 0 and s.resident_peak_bytes <= peak // 2
    off.close()


@pytest.mark.parametrize("tier", ["ssd", "auto"])
def test_no_host_tier_for_cpu_tensors_by_default(tmp_path, monkeypatch, tier):
    monkeypatch.setattr(_planned, "measured_bps", lambda profile, key: 2e7)  # G10 would use a host tier
    model, batch_of = inputs("cnn")
    peak = _peak_without_offload(model, batch_of)
    off = pyfastensor.offload(policy="planned", tier=tier, budget=peak // 2, min_size=SMALL, module=model,
                              spill_dir=str(tmp_path))
    train(model, batch_of, steps=2, ctx=lambda: off)
    assert off.plan_details["hardware"].host_bytes == 0
    assert {d["tier"] for d in off.plan_details["decisions"]} == {"stay", "ssd"}
    assert off.summary().staged_tensors == 0
    off.close()


def test_prefetches_start_at_the_planned_points(tmp_path, monkeypatch):
    # The window defers a due prefetch while the saved tensors in memory fill it; what is counted
    # in memory drops when a storage is freed, which for one in a reference cycle is when the
    # garbage collector runs: its timing is not this test's (the window's own test is below).
    real_init = PlannedPrefetcher.__init__
    monkeypatch.setattr(PlannedPrefetcher, "__init__",
                        lambda self, due, window, resident: real_init(self, due, 1 << 62, resident))
    model, batch_of = inputs("transformer")
    peak = _peak_without_offload(model, batch_of)
    off = pyfastensor.offload(policy="planned", budget=peak // 2, min_size=SMALL, module=model,
                              spill_dir=str(tmp_path))

    @contextlib.contextmanager
    def then_flush() -> Iterator[None]:
        yield
        off.flush()  # every write lands before backward: what is in memory at each plan point
        # (which a prefetch waits on) no longer depends on how fast the disk was just then
        gc.collect()  # nor on whether a tensor in a reference cycle is still alive (not refetched)

    train(model, batch_of, steps=3, ctx=lambda: off, forward_ctx=then_flush)
    placement = off.plan_details["placement"]
    migrated = {d["index"]: d["prefetch_at"] for d in off.plan_details["decisions"] if d["tier"] != "stay"}
    assert migrated and set(placement.prefetch) == set(migrated)
    for i, at in migrated.items():
        assert placement.fwd_pos[i] < at <= placement.bwd_pos[i], "a prefetch starts after the pack, by the unpack"
    issued = off._planned_pf.issued
    assert sorted(issued) == sorted(migrated), "every migrated tensor was prefetched"
    assert issued == sorted(issued, key=lambda i: (migrated[i], i)), "in the order of the plan's points"
    assert off.summary().prefetch_hits == len(migrated)
    off.close()


def test_infeasible_budget_raises_naming_budget_and_need(tmp_path):
    model, batch_of = inputs("cnn")
    need = _need(model, batch_of, str(tmp_path))
    off = pyfastensor.offload(policy="planned", budget=need - 1, min_size=SMALL, module=model,
                              spill_dir=str(tmp_path))
    train(model, batch_of, steps=1, ctx=lambda: off)  # the profiling step runs (everything offloaded)
    for _ in range(2):  # and every later entry raises, without profiling again
        with pytest.raises(InvalidArgumentError) as e:
            train(model, batch_of, steps=1, ctx=lambda: off)
        msg = str(e.value)
        assert f"budget={need - 1} bytes is infeasible" in msg and f"needs {need} bytes" in msg, msg
        assert f"give budget >= {need}" in msg
    assert isinstance(e.value, ValueError)
    del e

    def entry() -> None:
        mine = torch.empty(1)
        alive.append(weakref.ref(mine))
        with off:
            pass

    alive: list[weakref.ref[torch.Tensor]] = []
    with pytest.raises(InvalidArgumentError):
        entry()
    gc.collect()
    assert alive[0]() is None, "the error kept for later entries kept the frames it was raised through"
    off.close()
    assert open_handles() == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"policy": "planned"}, "policy='planned' needs budget="),
    ({"policy": "planned", "budget": 1, "tier": "host"}, "tier='ssd'"),
    ({"policy": "planned", "budget": 1, "compression": "sparse"}, "compression must be None"),
    ({"policy": "planned", "budget": 1, "host_bytes": 1 << 20}, "tier='auto' only"),
    ({"policy": "all", "tier": "auto", "host_bytes": 1 << 20}, "for policy='planned'"),
    ({"policy": "planned", "budget": 1, "tier": "auto", "host_bytes": -1}, "host_bytes -1"),
])
def test_options_are_checked(options, message):
    with pytest.raises(ValueError) as e:
        pyfastensor.offload(**options)
    assert message in str(e.value)


def _profile(sizes: list[int], gaps: list[int], forward_ns: int, backward_ns: int) -> dict:
    return {"tensors": [{"index": i, "size": s, "gap_ns": g, "bwd_gap_ns": 0, "write_ns": s, "read_ns": s}
                        for i, (s, g) in enumerate(zip(sizes, gaps, strict=True))],
            "forward_ns": forward_ns, "backward_ns": backward_ns}


def test_trace_of_a_profiled_step():
    # Three saves; backward: node 0 unpacks 2, node 1 unpacks 1 and 0 (0 saved twice: node 2 unpacks it again).
    prof = _profile([100, 200, 300], [10, 20, 30], forward_ns=100, backward_ns=1000)
    unpacks = [(2, 0, 0), (1, 1, 40), (0, 1, 5), (0, 2, 50)]
    d, pos = _planned.build_trace(prof, unpacks)
    t = g10.Trace.from_dict(d)  # valid for the Go parser
    names = [o.name for o in t.ops]
    assert names == ["fwd.start", "fwd.pack0", "fwd.pack1", "fwd.pack2", "bwd.start",
                     "bwd.node0", "bwd.node1", "bwd.node2"]
    assert [o.writes for o in t.ops[1:4]] == [(0,), (1,), (2,)]
    assert [o.reads for o in t.ops[5:]] == [(2,), (0, 1), (0,)]
    assert [o.time_ns for o in t.ops] == [10, 20, 30, 40, 0, 40 + 0, 50 + 5, 1000 - 40 - 55]
    assert t.total_ns == 100 + 1000
    assert pos.fwd_pos == {0: 1, 1: 2, 2: 3} and pos.bwd_pos == {2: 5, 1: 6, 0: 6} and pos.start_pos == 4
    assert _planned.need_bytes(d) == (300, "fwd.pack2")


def test_a_tensor_never_unpacked_is_read_by_a_last_op():
    d, pos = _planned.build_trace(_profile([100, 200], [0, 0], 10, 10), [(1, 0, 0)])
    assert d["ops"][-1] == {"name": "bwd.end", "time_ns": 0, "reads": [0], "writes": []}
    assert pos.bwd_pos[0] == len(d["ops"]) - 1


class _E:
    def __init__(self, index: int, n: int) -> None:
        self.index, self.payload_nbytes, self.seen, self.enc = index, n, False, object()


def test_planned_prefetcher_waits_for_room_and_keeps_order():
    now = [0]
    entries = [_E(i, 100) for i in range(4)]
    refs = [(lambda e=e: e) for e in entries]

    def issue(e: _E) -> int:
        now[0] += e.payload_nbytes
        return e.payload_nbytes

    pf = PlannedPrefetcher([(5, 2), (3, 0), (5, 1), (9, 3)], window=250, resident=lambda: now[0])
    pf.reached(2, refs, issue)
    assert pf.issued == []
    pf.reached(5, refs, issue)
    assert pf.issued == [0, 2], "due by position 5 (ties in the order given), within 250 bytes: two of them"
    now[0] = 0  # they were unpacked and freed
    entries[1].seen = True  # unpacked before its prefetch could go: nothing to fetch
    pf.reached(6, refs, issue)
    assert pf.issued == [0, 2]
    pf.reached(9, refs, issue)
    assert pf.issued == [0, 2, 3]
    pf2 = PlannedPrefetcher([(1, 0)], window=50, resident=lambda: 0)
    pf2.reached(1, refs, lambda e: e.payload_nbytes)
    assert pf2.issued == [0], "with nothing in memory a prefetch goes even above the window"

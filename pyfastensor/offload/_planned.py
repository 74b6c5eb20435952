"""``policy="planned"``: G10's migration plan applied to the saved tensors of a step.

After the profiling step (which offloads every eligible tensor, as
FlashNeuron's profiling iteration does, and so also measures the spill
store), :func:`make` turns what it recorded into a G10 trace
(:class:`pyfastensor.plan.Trace`, schema version 1) and hardware, calls the
Go planner (:func:`pyfastensor.plan.make_plan`) and maps its migrations
back onto the saved tensors by pack index.

The trace (one tensor per saved storage, kind ``activation``):

- op 0, ``fwd.start``: the forward compute before the first save;
- op ``1 + j`` for the j-th saved tensor in pack order, ``fwd.pack<i>``:
  writes tensor ``i`` (its pack), then the forward compute until the next
  save (the last one: until backward's first unpack);
- op ``1 + P``, ``bwd.start`` (P saved tensors): empty (the compute from the
  end of forward to the first unpack is already the last forward op's);
- op ``2 + P + g`` for the g-th backward node that unpacked saved tensors
  (in the profiling step's order), ``bwd.node<g>``: reads the tensors that
  node unpacked, and those a node before it unpacked that a node after it
  unpacks too (an entry saved twice keeps its restored copy for its other
  handles), then the backward compute until the next such node (the last
  one: until the step ended). Tensors never unpacked in the profiling step
  are read by a last op, ``bwd.end``.

So each saved tensor has one inactive period, from its pack to the first
node that unpacks it. The hardware: ``device_bytes`` is the budget (bytes of
saved tensors that may stay resident), ``host_bytes`` the host tier's
memory, the SSD's bandwidths those the profiling step measured on the spill
store (bytes over the store's write and read times), no latency (it is in
those times), and ``host_link_bps`` a copy measured on the tensors' device.

The plan's ``evict_after`` is the tensor's own pack (writes start there);
``prefetch_at`` is an op index, reached at run time at the pack (forward)
or at the first unpack of the node (backward) that starts that op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InvalidArgumentError

#: Bandwidth assumed for a direction the profiling step did not time (bytes/s).
UNMEASURED_BPS = 1e9


@dataclass
class Placement:
    """The plan mapped onto saved tensors (by pack index).

    Attributes:
        tier: pack index -> ``"stay"``, ``"ssd"`` or ``"host"``.
        prefetch: pack index -> the op index at which its prefetch starts
            (migrated tensors only).
        fwd_pos: pack index -> the op index of its pack.
        bwd_pos: pack index -> the op index of the node that unpacks it first.
        start_pos: the op index of ``bwd.start``.
    """

    tier: dict[int, str] = field(default_factory=dict)
    prefetch: dict[int, int] = field(default_factory=dict)
    fwd_pos: dict[int, int] = field(default_factory=dict)
    bwd_pos: dict[int, int] = field(default_factory=dict)
    start_pos: int = 0


def build_trace(profile: dict[str, Any], unpacks: list[tuple[int, int, int]]) -> tuple[dict[str, Any], Placement]:
    """The G10 trace of a profiled step (see the module docstring), as a dict, and the op positions.

    Args:
        profile: :meth:`Recorder.profile`'s result (sizes, forward gaps,
            forward and backward compute).
        unpacks: the profiling step's unpacks, ``(pack index, node number,
            compute before it in ns)``.
    """
    recs = {t["index"]: t for t in profile["tensors"]}
    packs = sorted(recs)
    pos = Placement()
    tensors = [{"id": i, "bytes": recs[i]["size"], "kind": "activation"} for i in packs]
    gaps = [max(recs[i]["gap_ns"], 0) for i in packs]
    ops: list[dict[str, Any]] = [{"name": "fwd.start", "time_ns": gaps[0] if gaps else 0, "reads": [], "writes": []}]
    for j, i in enumerate(packs):
        after = gaps[j + 1] if j + 1 < len(packs) else max(profile["forward_ns"] - sum(gaps), 0)
        pos.fwd_pos[i] = len(ops)
        ops.append({"name": f"fwd.pack{i}", "time_ns": after, "reads": [], "writes": [i]})
    pos.start_pos = len(ops)
    ops.append({"name": "bwd.start", "time_ns": 0, "reads": [], "writes": []})
    # Backward nodes in order: the tensors each unpacked, the compute before
    # its first unpack and between its own unpacks.
    nodes: list[tuple[list[int], int, int]] = []
    last = None
    for i, g, gap in unpacks:
        if i not in recs:
            continue
        if g != last:
            nodes.append(([], max(gap, 0), 0))
            last = g
        elif nodes:
            nodes[-1] = (nodes[-1][0], nodes[-1][1], nodes[-1][2] + max(gap, 0))
        nodes[-1][0].append(i)
    first: dict[int, int] = {}
    final: dict[int, int] = {}
    base = pos.start_pos + 1
    for n, (idx, _, _) in enumerate(nodes):
        for i in idx:
            first.setdefault(i, base + n)
            final[i] = base + n
    counted = 0
    for n, (_, _, inner) in enumerate(nodes):
        t = nodes[n + 1][1] + inner if n + 1 < len(nodes) else max(profile["backward_ns"] - counted, 0)
        counted += t
        # A tensor stays in memory from the first node that unpacks it to
        # the last (its other handles keep the restored copy): read by each.
        reads = [i for i in packs if i in first and first[i] <= base + n <= final[i]]
        ops.append({"name": f"bwd.node{n}", "time_ns": t, "reads": reads, "writes": []})
    pos.bwd_pos.update(first)
    unused = [i for i in packs if i not in first]
    if unused:
        for i in unused:
            pos.bwd_pos[i] = len(ops)
        ops.append({"name": "bwd.end", "time_ns": 0, "reads": unused, "writes": []})
    return {"version": 1, "tensors": tensors, "ops": ops}, pos


def need_bytes(trace: dict[str, Any]) -> tuple[int, str]:
    """The most saved-tensor bytes one op of ``trace`` uses at once, and that op's name."""
    size = {t["id"]: t["bytes"] for t in trace["tensors"]}
    best, name = 0, ""
    for op in trace["ops"]:
        b = sum(size[i] for i in set(op["reads"]) | set(op["writes"]))
        if b > best:
            best, name = b, op["name"]
    return best, name


def _describe(op: str) -> str:
    """An op of the trace in the user's words."""
    if op.startswith("fwd.pack"):
        return f"saving tensor {op[len('fwd.pack'):]} (pack order) in forward"
    if op.startswith("bwd.node"):
        return f"backward node {op[len('bwd.node'):]} (in unpack order)"
    return op


def measured_bps(profile: dict[str, Any], key: str) -> float:
    """Bytes per second of the store's transfers (``write_ns`` or ``read_ns``) over the profiled tensors."""
    timed = [t for t in profile["tensors"] if t.get(key, 0) > 0]
    ns = sum(t[key] for t in timed)
    return sum(t["size"] for t in timed) / ns * 1e9 if ns > 0 else UNMEASURED_BPS


def link_bps(device: torch.device, nbytes: int) -> float:
    """Bytes per second of a copy of ``nbytes`` (at most 64 MiB) from ``device`` to host memory (best of 3)."""
    n = max(min(nbytes, 64 << 20), 1 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty(n, dtype=torch.uint8, pin_memory=device.type != "cpu")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return n / max(best, 1e-9)


def make(profile: dict[str, Any], unpacks: list[tuple[int, int, int]], budget: int, host_bytes: int,
         device: torch.device) -> dict[str, Any]:
    """Plan the saved tensors of a profiled step; return the plan's record (see ``Offload.plan_details``).

    Raises:
        InvalidArgumentError: the planner finds the budget infeasible: below
            what one op of the step needs at once (the message names the
            budget, the need and the op).
    """
    from .. import plan as g10

    trace_d, pos = build_trace(profile, unpacks)
    trace = g10.Trace.from_dict(trace_d)
    largest = max((t["bytes"] for t in trace_d["tensors"]), default=0)
    hw = g10.Hardware(device_bytes=max(budget, 1), host_bytes=host_bytes,
                      ssd_read_bps=measured_bps(profile, "read_ns"),
                      ssd_write_bps=measured_bps(profile, "write_ns"), ssd_latency_ns=0,
                      host_link_bps=link_bps(device, largest) if host_bytes > 0 else UNMEASURED_BPS)
    try:
        mplan = g10.make_plan(trace, hw)  # the planner decides what is feasible
    except InvalidArgumentError as e:
        need, op = need_bytes(trace_d)
        if need <= budget or "does not fit the device" not in str(e):
            raise
        raise InvalidArgumentError(
            f"pyfastensor.offload(policy='planned'): budget={budget} bytes is infeasible: {_describe(op)} needs "
            f"{need} bytes of saved tensors in memory at once (the largest need of the profiled step); "
            f"give budget >= {need}, or use policy='all' (planner: {e})") from e
    for t in trace_d["tensors"]:
        pos.tier[t["id"]] = "stay"
    for m in mplan.migrations:
        pos.tier[m.tensor] = m.tier
        pos.prefetch[m.tensor] = m.prefetch_at
    decisions = [{"index": i, "bytes": t["bytes"], "tier": pos.tier[i], "prefetch_at": pos.prefetch.get(i),
                  "pack_op": pos.fwd_pos[i], "unpack_op": pos.bwd_pos[i]}
                 for t in trace_d["tensors"] for i in (t["id"],)]
    return {"policy": "planned", "budget": budget, "trace": trace, "hardware": hw, "plan": mplan,
            "decisions": decisions, "placement": pos, "text": _text(mplan, decisions, hw)}


def _text(mplan: Any, decisions: list[dict[str, Any]], hw: Any) -> str:
    mib = 1 << 20
    counts: dict[str, list[int]] = {}
    for d in decisions:
        c = counts.setdefault(d["tier"], [0, 0])
        c[0] += 1
        c[1] += d["bytes"]
    per = ", ".join(f"{t} {n} ({b / mib:.1f} MiB)" for t, (n, b) in sorted(counts.items()))
    return (f"offload plan (G10, policy='planned'): budget {hw.device_bytes / mib:.1f} MiB "
            f"(planned within {mplan.capacity / mib:.1f} MiB), saved-tensor demand "
            f"{mplan.demand_bytes / mib:.1f} MiB, planned peak {mplan.peak_bytes / mib:.1f} MiB; "
            f"SSD {hw.ssd_write_bps / 1e9:.2f}/{hw.ssd_read_bps / 1e9:.2f} GB/s write/read (measured), "
            f"host tier {hw.host_bytes / mib:.0f} MiB\n  tensors: {per}\n{mplan.table()}")

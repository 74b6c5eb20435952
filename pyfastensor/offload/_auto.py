"""``policy="auto"``: keep, move or recompute each saved tensor, within a budget, from measured costs.

Three phases, one per step until the plan is made:

1. a **warm-up** step offloads every eligible tensor as ``"all"`` does (the
   first step's one-time costs stay out of the profile);
2. the **profiling** step keeps what fits the budget and moves the rest,
   and one saved storage in :data:`PROFILE_SAMPLE` whatever the budget,
   while :class:`~._graph.GraphRecorder` records every aten op of forward
   and backward with its time, and the hooks mark each saved storage's
   pack and first unpack; the store's :class:`~._profile.Recorder`
   measures its write and read bandwidths on what was moved (a profiling
   step that moved everything would cost what ``"all"`` costs, several
   steps under a plan where the link is slow);
3. the plan: each saved storage (an entry) becomes a tensor of the Go
   planner's input (:func:`make`): its bytes, pack and first use on the
   timeline of measured compute, whether the store can take it, and its
   recipe's forward time, sources and temporaries. The planner
   (``offload/mix.go``) returns, for the budget, each entry's action:
   ``keep``, the store's tier (``host`` or ``ssd``), or ``recompute``; and
   the whole frontier of predicted step time against resident peak.

Later steps carry the plan out by pack index; each entry's size and the
autograd node that made a recomputed tensor are checked against the
profile first (:meth:`Auto.matches`): a step whose saved tensors differ is
not given the plan (its tensors are stored, as ``"all"`` would) and the
next step profiles again.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _lib
from ..errors import InvalidArgumentError
from ._graph import GraphRecorder, Recipe, maker_of
from ._order import PlannedPrefetcher, Prefetcher
from ._policy import Policy
from ._profile import Recorder
from ._saved import Entry

#: Bandwidth assumed for a direction the profiling step did not time (bytes/s).
UNMEASURED_BPS = 1e9
#: In the profiling step, one saved storage in this many, the first of them, is moved whatever
#: the budget (the store's speeds are measured on the moved ones); the others are moved only
#: where keeping them would exceed the budget.
PROFILE_SAMPLE = 4
#: The steps under the plan whose median measured time calibrates the profile's compute times:
#: the first ones still pay one-time costs (buffers and pinned pools sized), so the
#: :data:`CALIBRATION_SKIP` first are left out and the next :data:`CALIBRATION_STEPS` timed (a
#: median, so that one step slowed by something else does not scale the profile); and how far
#: the prediction may be off before the plan is made again from the scaled profile.
CALIBRATION_SKIP = 1
CALIBRATION_STEPS = 3
CALIBRATION_TOLERANCE = 0.05


class Auto(Policy):
    """``policy="auto"``: the mix planner's decision per saved storage.

    Args:
        budget: bytes of saved tensors that may be resident at once (as ``resident_peak_bytes``
            counts them).
        tier: the store's tier, the one moved tensors go to (``"host"`` or ``"ssd"``).
        verbose: print the plan when it is made.
    """

    def __init__(self, budget: int, tier: str, verbose: bool) -> None:
        super().__init__()
        self.budget, self.tier, self.verbose = budget, tier, verbose
        self.steps = 0  # steps begun
        self.profile_at = 1  # the step that profiles
        self.graph: GraphRecorder | None = None
        self.actions: dict[int, str] | None = None  # entry index -> keep, recompute, or the tier
        self.recipes: dict[int, Recipe] = {}
        self.expect: dict[int, tuple[int, str]] = {}  # entry index -> (bytes, maker) in the profile
        self.sources: dict[int, int] = {}  # entry index -> reads of it by the plan's recipes
        self.kept_sources: dict[int, int] = {}  # pack call number of a small saved tensor -> reads
        self.params: dict[int, Any] = {}  # parameters' storages -> weak references, from the profile
        self.pack_event: dict[int, int] = {}
        self.use_event: dict[int, int] = {}
        self.due: list[tuple[int, int]] = []  # (event, entry index) of the moved entries' reads
        self.error: str | None = None
        self.diverged: str | None = None  # why the last step did not follow the plan
        self._planned: Any = None  # (mix, entries, recipes, graph): the profile the plan is made from
        self.hook_ns: int | None = None  # a moved tensor's pack and unpack, from the warm-up step
        self._calibration = 0  # steps under the plan until the calibration
        self._kept_bytes = 0  # the profiling step's kept entries' bytes
        self._kept: set[int] = set()  # the entries the profiling step kept (movable all the same)
        self._timed: list[float] = []  # the calibrating steps' times

    # ------------------------------------------------------------------ phases

    def begin_step(self) -> None:
        """A step begins (the context is entered)."""
        if self.diverged is not None and self.actions is not None:  # the graph changed: profile again
            self.actions, self.profile_at, self.diverged = None, self.steps, None
        self.steps += 1
        self._kept_bytes, self._kept = 0, set()

    def profiles(self) -> bool:
        return self.actions is None and self.steps - 1 == self.profile_at

    def check(self) -> None:
        if self.error is not None:
            raise InvalidArgumentError(self.error)

    def op_recorder(self, registered: set[int]) -> GraphRecorder | None:
        self.graph = GraphRecorder(registered) if self.profiles() else None
        return self.graph

    def learn(self, rec: Recorder, *, tier: str, device: torch.device | None) -> None:
        graph, self.graph = self.graph, None
        if graph is None:
            return
        started = time.perf_counter()
        mix, entries, recipes = make(graph, rec, self.budget or 1, tier, self.hook_ns, kept=self._kept)
        self._planned = (mix, entries, recipes, graph)
        self._calibration, self._timed = CALIBRATION_SKIP + CALIBRATION_STEPS, []
        self._adopt(started)

    def _adopt(self, started: float, *, calibrating: bool = False) -> None:
        """Plan over the profile kept in ``self._planned`` and take the plan for the next steps.
        ``calibrating``: a budget the scaled profile no longer fits keeps the plan it has, its
        step and reads' points simulated again over the scaled profile."""
        mix, entries, recipes, graph = self._planned
        try:
            plan = plan_mix(mix)
        except InvalidArgumentError as e:
            if not calibrating or self.result is None:
                self.error = str(e)
                raise
            plan = plan_mix(dict(mix, actions=[d["action"] for d in self.result["decisions"]]))
        self.actions = {entries[d["tensor"]]: d["action"] for d in plan["decisions"]}
        # The plan's events at run time: each entry's pack, its first unpack, and the moved ones'
        # reads, issued when the step reaches them (within the budget), as the plan has them.
        events = mix["_events"]
        self.pack_event = {e: events["pack"][e] for e in entries}
        self.use_event = dict(events["use"])
        due = [(d["prefetch_at"], entries[d["tensor"]]) for d in plan["decisions"] if d["prefetch_at"] >= 0]
        self.due = sorted(due, key=lambda d: (d[0], self.use_event.get(d[1], 0), d[1]))  # the first needed first
        self.recipes = {i: r for i, r in recipes.items() if self.actions.get(i) == "recompute"}
        self.expect = {i: (mix["tensors"][k]["bytes"], graph.makers.get(i, "-")) for k, i in enumerate(entries)}
        self.sources = {}
        self.kept_sources = {}
        for r in self.recipes.values():
            for lf in r.leaves.values():
                if lf.kind == "entry":
                    self.sources[lf.key] = self.sources.get(lf.key, 0) + 1
                elif lf.kind == "kept":
                    self.kept_sources[lf.key] = self.kept_sources.get(lf.key, 0) + 1
        self.params = graph.params
        plan["planning_seconds"] = time.perf_counter() - started
        plan["profile_step_ns"] = mix["_step_ns"]
        plan["calibration"] = mix.get("_scale", 1.0)
        plan["record_seconds"] = graph.record_ns / 1e9  # the recorder's own time in the profiling step
        plan["text"] = describe(plan, mix, self.budget)
        self.result = plan
        if self.verbose:
            print(plan["text"], end="")

    def stepped(self, summary: Any) -> None:
        """A step ended (its summary). The warm-up step's packs give a moved tensor's hook cost
        (the profiling step's also pay for the recording). Then: the planner's times are the profiling step's
        ops, each timed alone; the steps under the plan are the truth. Once, after the
        :data:`CALIBRATION_STEPS` steps that follow the :data:`CALIBRATION_SKIP` first ones under
        the plan, every compute time of the profile is scaled by their median measured time over
        the predicted one, where they differ by more than :data:`CALIBRATION_TOLERANCE`, and the
        plan made again from the scaled profile."""
        if self.steps == 1 and summary.offloaded_tensors:  # the warm-up step: packs as a moved tensor's
            self.hook_ns = int(2 * summary.pack_seconds / summary.offloaded_tensors * 1e9)
        if self.actions is None or self.diverged is not None or self._calibration <= 0 or self.result is None:
            return
        self._calibration -= 1
        if self._calibration < CALIBRATION_STEPS:
            self._timed.append(summary.step_seconds)
        if self._calibration:
            return
        ratio = statistics.median(self._timed) / max(self.result["step_ns"] / 1e9, 1e-9)
        if abs(ratio - 1) <= CALIBRATION_TOLERANCE:
            return
        mix = self._planned[0]
        mix["_scale"] = mix.get("_scale", 1.0) * ratio
        mix["compute_ns"] = [round(ns * ratio) for ns in mix["compute_ns"]]
        mix["hook_ns"] = round(mix["hook_ns"] * ratio)
        for t in mix["tensors"]:
            if t["recompute_ns"] >= 0:
                t["recompute_ns"] = round(t["recompute_ns"] * ratio)
        self._adopt(time.perf_counter(), calibrating=True)

    # ------------------------------------------------------------------ decisions

    def matches(self, entry: Entry, t: torch.Tensor) -> bool:
        """Whether ``entry`` (saved tensor ``t``) is the one the plan was made for."""
        want = self.expect.get(entry.index)
        why = None
        if want is None:
            why = f"the step saved more tensors than the profiled one ({entry.index + 1} or more)"
        elif entry.nbytes != want[0]:
            why = f"saved tensor {entry.index} has {entry.nbytes} bytes, the profiled step's had {want[0]}"
        elif self.actions is not None and self.actions.get(entry.index) == "recompute" and maker_of(t) != want[1]:
            why = f"saved tensor {entry.index} was made by {maker_of(t)}, the profiled one by {want[1]}"
        if why is None:
            return True
        self.diverged = why
        warnings.warn(f"pyfastensor.offload(policy='auto'): this step is not the profiled one ({why}): its saved "
                      "tensors are stored as they are, and the next step profiles again", UserWarning, stacklevel=4)
        return False

    def _action(self, entry: Entry, t: torch.Tensor) -> str | None:
        """What the plan does with ``entry``: keep, recompute, or the tier; None without a plan, or
        for a step that is not the profiled one (its tensors are stored as they are)."""
        if self.actions is None or self.diverged is not None or not self.matches(entry, t):
            return None
        return self.actions.get(entry.index)

    def recipe(self, entry: Entry, t: torch.Tensor) -> Recipe | None:
        return self.recipes.get(entry.index) if self._action(entry, t) == "recompute" else None

    def codec(self, entry: Entry, t: torch.Tensor) -> str | None:
        if self.profiles():  # keep within the budget; move the rest, and a sample
            if entry.index % PROFILE_SAMPLE and self._kept_bytes + entry.nbytes <= self.budget:
                self._kept_bytes += entry.nbytes
                self._kept.add(entry.index)
                return None
            return "raw"
        return None if self._action(entry, t) == "keep" else "raw"

    def source_entry(self, index: int) -> int:
        return self.sources.get(index, 0) if self.actions is not None else 0

    def source_kept(self, seq: int) -> int:
        return self.kept_sources.get(seq, 0) if self.actions is not None else 0

    def prefetchers(self, order: list[int] | None, window: int,
                    resident: Callable[[], int]) -> tuple[Prefetcher | None, PlannedPrefetcher | None]:
        if self.actions is None:
            return super().prefetchers(order, window, resident)
        return None, PlannedPrefetcher(self.due, self.budget, resident)

    def at_pack(self, index: int) -> int | None:
        return self.pack_event.get(index) if self.actions is not None else None

    def at_unpack(self, index: int) -> int | None:
        return self.use_event.get(index) if self.actions is not None else None

    def needs_hooks(self) -> bool:
        return self.actions is None or any(a != "keep" for a in self.actions.values())

    def predicted(self) -> tuple[float, int]:
        """The plan's predicted step (seconds) and resident peak (bytes); zeros before it."""
        if self.result is None:
            return 0.0, 0
        return self.result["step_ns"] / 1e9, int(self.result["peak_bytes"])


def plan_mix(mix: dict[str, Any]) -> dict[str, Any]:
    """The Go planner's plan for ``mix`` (``offload.MixInput``).

    Raises:
        InvalidArgumentError: the budget is below any mix; the message names the smallest feasible one.
    """
    return _lib.call_json("pft_plan_mix", json.dumps({k: v for k, v in mix.items() if not k.startswith("_")}).encode())


def make(graph: GraphRecorder, rec: Recorder, budget: int, tier: str,
         hook_ns: int | None = None,
         kept: set[int] | frozenset[int] = frozenset()) -> tuple[dict[str, Any], list[int], dict[int, Recipe]]:
    """The planner's input (``offload.MixInput``) from the profiling step, the entry index of each of
    its tensors, and the entries' recipes; ``hook_ns``: a moved tensor's hooks (None: from the
    profiling step's packs); ``kept``: the entries the profiling step kept by choice, which the
    store may take as it took the moved ones (an entry neither moved nor kept by choice, one the
    store refused, is not moved)."""
    graph.finish()
    events = graph.events
    backward = next((k for k, (kind, _) in enumerate(events) if kind == "unpack"), len(events))
    packs = {e: k for k, (kind, e) in enumerate(events) if kind == "pack" and k < backward}
    uses = {e: k for k, (kind, e) in enumerate(events) if kind == "unpack"}
    compute = [sum(graph.ops[o].ns for o in graph.ops_after[k + 1]) for k in range(len(events))]
    entries = sorted(packs)
    position = {e: k for k, e in enumerate(entries)}
    recipes: dict[int, Recipe] = {}
    tensors = []
    for e in entries:
        r = graph.recipe(e)
        if r is not None and all(s in position for s in r.sources):
            recipes[e] = r
        size = rec.tensors.get(e, {}).get("size") or graph.values[graph.entry_value[e]].nbytes
        tensors.append({
            "bytes": size, "pack": packs[e], "move": e in rec.tensors or e in kept,
            "uses": sorted({uses[e], graph.last_use.get(e, uses[e])}) if e in uses else [],
            "recompute_ns": r.ns if e in recipes else -1,
            "sources": [position[s] for s in r.sources] if e in recipes else [],
            "temp_bytes": r.temp_bytes if e in recipes else 0,
        })
    stored = [t for t in rec.tensors.values() if t.get("write_ns") and t.get("size")]
    written = sum(t["write_ns"] for t in stored)
    read = sum(t["read_ns"] for t in stored if t.get("read_ns"))
    nbytes = sum(t["size"] for t in stored)
    write_bps = nbytes / written * 1e9 if written else UNMEASURED_BPS
    read_bps = sum(t["size"] for t in stored if t.get("read_ns")) / read * 1e9 if read else write_bps
    # A moved tensor's hooks: its pack as measured, and as much again for its unpack (whose time in
    # the profiling step also holds the waits for reads, which the planner models itself).
    if hook_ns is None:
        hook_ns = int(2 * rec.forward_pack_time / max(len(rec.tensors), 1) * 1e9)
    before = sum(graph.ops[o].ns for o in graph.ops_after[0])
    mix = {
        "tensors": tensors, "compute_ns": compute, "backward": backward, "hook_ns": hook_ns,
        "tiers": {tier: {"write_bps": write_bps, "read_bps": read_bps}}, "budget": budget,
        "_step_ns": before + sum(compute), "_events": {"pack": packs, "use": uses},
    }
    return mix, entries, recipes


def describe(plan: dict[str, Any], mix: dict[str, Any], budget: int | None) -> str:
    """The plan as text: per action, tensors and bytes; the predicted step and peak against keeping
    everything; the smallest feasible budget."""
    frontier = plan["frontier"]
    base = frontier[0]
    lines = [f"pyfastensor.offload policy='auto': budget {_mib(budget or 0)}; smallest feasible "
             f"{_mib(plan['min_budget'])}",
             f"  predicted step {plan['step_ns'] / 1e6:.2f} ms (keeping everything: {base['step_ns'] / 1e6:.2f} ms), "
             f"resident peak {_mib(plan['peak_bytes'])} (keeping everything: {_mib(base['peak_bytes'])})"]
    if plan.get("wait_ns"):
        lines.append(f"  the forward waits {plan['wait_ns'] / 1e6:.2f} ms of it for writes to land (the link is "
                     "slower than the forward: a budget below "
                     f"{_mib(min(p['peak_bytes'] for p in frontier))} is met by waiting)")
    order = {"keep": 0, "recompute": 1}
    for action, c in sorted(plan["classes"].items(), key=lambda kv: (order.get(kv[0], 2), kv[0])):
        lines.append(f"  {action:<18} {c['tensors']:>5} tensors {_mib(c['bytes']):>12}")
    return "\n".join(lines) + "\n"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"

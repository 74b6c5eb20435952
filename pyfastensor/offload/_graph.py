"""The profiling step's op graph under ``policy="auto"``: what made each saved tensor, and how long.

During the profiling step a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
sees every aten op of forward and backward (on the thread that runs it,
and in autograd's device threads, which inherit the mode): its arguments,
its outputs, and its time (on the host's clock around the call for CPU
ops; for CUDA ops by two events around its kernels, read once the step is
over, so nothing waits per op). The offload object's hooks tell it where
the step's events fall: each saved storage's pack (forward) and first
unpack (backward). From that:

- the **timeline**: the compute between consecutive events, the sum of
  the op times between them;
- each saved storage's **recipe**: the ops that make its bytes again from
  values that are there in backward, the *sources*: other saved storages
  packed before it (kept, moved, or themselves recomputed), saved tensors
  too small to be stored (kept as they are), and parameters and buffers
  (as the step left them). A storage made by a random op, by an in-place
  op, by an op whose arguments are not plain values, or from a value
  outside the step (an input the step did not save) has no recipe.

Values are identified by object, never by address (a storage freed during
the step, a stored tensor's or a temporary's, and an allocation that
reuses its address must not be taken for each other): a tensor by its
Python object and the version it had when its value was made (an op's
output defines a value, an argument looks one up; changed in place since,
it is a value of its own), a storage by its Python object, which torch
keeps exactly as long as the storage. Weak references tell when either is
gone. No tensor is kept alive by the record: it holds ints and constants
only.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import (
    TorchDispatchMode,
    current_autograd_node,
    holds_no_data,
    tree_flatten,
    tree_unflatten,
)

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclass(frozen=True)
class Value:
    """A tensor value seen by the recorder: its op (-1 for a leaf) and output position, and the
    view it is of its storage."""

    op: int
    out: int
    storage: int  # the storage's number in the record
    address: int  # its address while the step ran
    nbytes: int  # the storage's size
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device
    version: int


@dataclass
class Op:
    """One aten op: the function, its arguments with tensors as value ids, its outputs' value ids,
    its time, and whether it may be run again (not random, not in place, plain arguments)."""

    func: Any
    args: Any  # (args, kwargs) with each tensor replaced by _Ref(value id)
    outs: list[int]
    replayable: bool
    ns: int = 0
    timing: Any = None  # CUDA events, read into ns at the end
    cuda: bool = False  # timed on a CUDA device (by events)


@dataclass(frozen=True)
class _Ref:
    value: int


@dataclass
class Leaf:
    """A recipe's source: a saved storage packed earlier (``entry``), a small saved tensor kept
    as it is (``seq``: its pack call), or a parameter or buffer (``param``); and the view of it
    the recipe reads."""

    kind: str  # "entry", "kept", "param"
    key: int  # entry index, pack call number, or the parameter's storage address
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    # A parameter that requires grad: where autograd has it from the saved tensor, the
    # next_functions indices from the saved tensor's node to the parameter's AccumulateGrad.
    path: tuple[int, ...] | None = None


@dataclass
class Recipe:
    """How to make a saved storage's bytes again: ``ops`` in order over ``leaves`` (by value id),
    whose ``target`` value owns the storage."""

    ops: list[Op]
    leaves: dict[int, Leaf]
    target: int
    ns: int  # the ops' forward time
    temp_bytes: int  # the intermediates' bytes
    sources: list[int] = field(default_factory=list)  # the entries among the leaves


class GraphRecorder(TorchDispatchMode):
    """Records the profiling step's ops and events (see the module docstring).

    Args:
        registered: the storages of parameters and buffers known now (more may be added).
    """

    def __init__(self, registered: set[int]) -> None:
        super().__init__()
        self.registered = registered
        self.params: dict[int, weakref.ref[torch.Tensor]] = {}  # storage -> a tensor over it
        self.values: list[Value] = []
        self.ops: list[Op] = []
        self.tensors: dict[int, tuple[int, int, Any]] = {}  # id(tensor) -> (value, its version, weakref)
        self.storages: dict[int, tuple[int, Any]] = {}  # id(storage) -> (its number, weakref)
        self.storage_count = 0
        self.made_by: dict[int, int] = {}  # storage -> the value whose op allocated it
        self.paused = 0  # > 0 inside the offload object's own hooks
        # The events: ("pack", entry index) or ("unpack", entry index), each with the ops after it.
        self.events: list[tuple[str, int]] = []
        self.ops_after: list[list[int]] = [[]]  # ops before the first event, then after each
        self.entry_value: dict[int, int] = {}  # entry index -> the saved value
        self.entry_storage: dict[int, int] = {}  # entry index -> its storage
        self.kept_value: dict[int, int] = {}  # pack call number -> value, for small saved tensors
        self.entry_of_storage: dict[int, int] = {}
        self.kept_of_storage: dict[int, int] = {}
        self.unpacked: set[int] = set()
        self.last_use: dict[int, int] = {}  # entry index -> the event of its last unpack
        self.makers: dict[int, str] = {}  # entry index -> the autograd node that made its tensor
        self.leaf_paths: dict[int, dict[int, tuple[int, ...]]] = {}  # entry -> storage -> path (Leaf.path)
        self.call_ns = _call_ns()  # what calling one op from Python costs, beyond its kernel
        self.record_ns = 0  # the time the recorder's own bookkeeping took (beside the ops')
        self._compiled_code: dict[Any, bool] = {}  # code object -> inductor's generated code or not
        self._node: Any = None  # the backward node of the last unpack, and the entries it unpacked
        self._node_entries: list[int] = []

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """torch.compile runs its compiled artifacts under this mode rather than falling back to
        eager (torch 2.10 and later ask): the profile is of the step the plan is for. Their fused
        kernels write into buffers without an aten op, so what an allocation made is never
        replayed (:func:`_uninitialized`)."""
        return True

    # ------------------------------------------------------------------ identity

    def _storage(self, st: torch.UntypedStorage) -> int:
        """The number of storage ``st`` in the record (a new one for a storage not seen alive)."""
        k = id(st)
        got = self.storages.get(k)
        if got is not None and got[1]() is st:
            return got[0]
        self.storage_count += 1
        self.storages[k] = (self.storage_count, weakref.ref(st))
        return self.storage_count

    def _value(self, t: torch.Tensor, op: int, out: int) -> int:
        st = t.untyped_storage()
        v = Value(op, out, self._storage(st), st.data_ptr(), st.nbytes(), tuple(t.shape), tuple(t.stride()),
                  t.storage_offset(), t.dtype, t.device, _version(t))
        self.values.append(v)
        i = len(self.values) - 1
        self.tensors[id(t)] = (i, v.version, weakref.ref(t))
        return i

    def value_of(self, t: torch.Tensor) -> int:
        """The value id of ``t``: the one an op made (the same tensor, not changed since), or a new
        leaf."""
        got = self.tensors.get(id(t))
        if got is not None and got[2]() is t and got[1] == _version(t):
            return got[0]
        i = self._value(t, -1, 0)
        s = self.values[i].address
        if s in self.registered or isinstance(t, torch.nn.Parameter) or (t.is_leaf and t.requires_grad):
            self.params.setdefault(s, weakref.ref(t))
        return i

    # ------------------------------------------------------------------ ops

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        entered = time.perf_counter_ns()
        try:
            return self._record(func, args, kwargs)
        finally:
            self.record_ns += time.perf_counter_ns() - entered

    def _record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        flat, spec = tree_flatten((args, kwargs))
        replayable = (not _random(func) and not _mutates(func) and not _uninitialized(func)
                      and not self._in_compiled_code())
        refs: list[Any] = []
        inputs: set[int] = set()
        for a in flat:
            if isinstance(a, torch.Tensor):
                if type(a) is not torch.Tensor and holds_no_data(a):  # torch.compile tracing: not the step's
                    return func(*args, **kwargs)
                if type(a) is not torch.Tensor and not isinstance(a, torch.nn.Parameter) or a.layout != torch.strided:
                    replayable = False
                    refs.append(None)
                    continue
                v = self.value_of(a)
                refs.append(_Ref(v))
                inputs.add(self.values[v].storage)
            elif isinstance(a, _SCALARS) or _scalar_list(a):
                refs.append(a)
            else:
                replayable = False
                refs.append(None)
        timing = _Timing.start(flat)
        called = time.perf_counter_ns()
        out = func(*args, **kwargs)
        self.record_ns -= time.perf_counter_ns() - called  # the op's own time is not the recorder's
        op = Op(func, (spec, refs), [], replayable, cuda=timing.device is not None)
        op.timing = timing.stop()
        index = len(self.ops)
        self.ops.append(op)
        self.ops_after[-1].append(index)
        for k, t in enumerate(tree_flatten(out)[0]):
            if isinstance(t, torch.Tensor):
                try:
                    v = self._value(t, index, k)
                except (RuntimeError, NotImplementedError):
                    op.outs.append(-1)
                    continue
                op.outs.append(v)
                if self.values[v].storage not in inputs:  # a new allocation, not an argument's storage
                    self.made_by.setdefault(self.values[v].storage, v)
            else:
                op.outs.append(-1)
        return out

    def _in_compiled_code(self) -> bool:
        """Whether the op was called by code inductor generated (a compiled region's ``call``, or
        the loader that runs it): its outputs may be written again by the region's fused kernels,
        which are not aten ops, and reused as other buffers, so nothing it makes is replayed.
        The few frames above the mode's are looked at, each code object once."""
        f = sys._getframe(3)
        for _ in range(_CALLER_FRAMES):
            if f is None:
                return False
            got = self._compiled_code.get(f.f_code)
            if got is None:
                got = self._compiled_code[f.f_code] = str(f.f_globals.get("__name__", "")).startswith("torch._inductor.")
            if got:
                return True
            f = f.f_back
        return False

    # ------------------------------------------------------------------ events

    def packed(self, entry: int | None, seq: int, t: torch.Tensor) -> None:
        """A pack: ``entry`` (its index) was made for ``t``, or ``t`` is a small saved tensor kept
        as it is (``entry`` None; ``seq`` its pack call number)."""
        v = self.value_of(t)
        s = self.values[v].storage
        if entry is None:
            self.kept_value.setdefault(seq, v)
            self.kept_of_storage.setdefault(s, seq)
            return
        self.entry_value[entry] = v
        self.entry_storage[entry] = s
        self.makers[entry] = maker_of(t)
        self.leaf_paths[entry] = leaf_paths(t)
        self.entry_of_storage.setdefault(s, entry)
        self.events.append(("pack", entry))
        self.ops_after.append([])

    def unpacking(self, entry: int) -> None:
        """An unpack of an entry: its first is an event; a later one (another handle of the
        storage, a node saved twice) marks the entry used until the event reached now. The
        backward node that unpacks holds what it unpacked until it is done: every entry one node
        unpacked is used until that node's last unpack event, after which the node's compute is
        measured (a compiled region's node takes all its saved tensors at once and reads them in
        kernels no op shows)."""
        node = current_autograd_node()
        if node is None or node is not self._node:
            self._node, self._node_entries = node, []
        if entry not in self.unpacked:
            self.unpacked.add(entry)
            self.events.append(("unpack", entry))
            self.ops_after.append([])
        if node is not None:
            self._node_entries.append(entry)
        for e in self._node_entries or [entry]:  # the latest event: no earlier use is later
            self.last_use[e] = len(self.events) - 1

    def finish(self) -> None:
        """Read the CUDA events' times (the step is over: they have completed)."""
        self._node, self._node_entries = None, []
        for op in self.ops:
            if op.timing is not None:
                op.ns = op.timing.ns()
                op.timing = None

    # ------------------------------------------------------------------ recipes

    def recipe(self, entry: int) -> Recipe | None:
        """How to make entry ``entry``'s storage again from sources packed before it, or None."""
        storage = self.entry_storage.get(entry)
        target = self.made_by.get(storage) if storage is not None else None
        if target is None:
            return None
        t, saved = self.values[target], self.values[self.entry_value[entry]]
        # The op that allocated the storage must have left it as saved: no in-place change since.
        if t.offset != 0 or t.nbytes != saved.nbytes or t.version != saved.version:
            return None
        leaves: dict[int, Leaf] = {}
        needed: list[int] = []  # ops, in the order they ran
        seen: set[int] = set()

        def visit(v: int, top: bool) -> bool:
            val = self.values[v]
            if not top:
                leaf = self._leaf(val, entry)
                if leaf is not None:
                    leaves[v] = leaf
                    return True
            if val.op < 0:
                return False  # a value from outside the step
            if val.op in seen:
                return True
            op = self.ops[val.op]
            if not op.replayable:
                return False
            seen.add(val.op)
            for r in op.args[1]:
                if isinstance(r, _Ref) and not visit(r.value, False):
                    return False
            needed.append(val.op)
            return True

        if not visit(target, True):
            return None
        needed.sort()
        ops = [self.ops[i] for i in needed]
        # The intermediates: storages the ops allocate besides the target's.
        held = {self.values[x].storage for x in leaves} | {storage}
        temp = {self.values[v].storage: self.values[v].nbytes for o in ops for v in o.outs
                if v >= 0 and self.values[v].storage not in held}
        sources = sorted({lf.key for lf in leaves.values() if lf.kind == "entry"})
        ns = sum(o.ns for o in ops) + len(ops) * self.call_ns
        return Recipe(ops, leaves, target, ns, sum(temp.values()), sources)

    def _leaf(self, val: Value, entry: int) -> Leaf | None:
        """``val`` as a recipe's source for ``entry``: a view of an earlier entry's storage, of a
        small kept saved tensor, or of a parameter; None where it must be made itself."""
        view = (val.size, val.stride, val.offset, val.dtype)
        e = self.entry_of_storage.get(val.storage)
        if e is not None and e < entry:
            return Leaf("entry", e, *view)
        k = self.kept_of_storage.get(val.storage)
        if k is not None:
            return Leaf("kept", k, *view)
        if val.address in self.params:
            ref = self.params[val.address]
            p = ref()
            if p is not None and self._storage(p.untyped_storage()) == val.storage:
                path = self.leaf_paths.get(entry, {}).get(val.address)
                if p.requires_grad and path is None:
                    return None  # beyond the nodes walked: it could not be found again
                return Leaf("param", val.address, *view, path=path)
        return None


#: The autograd nodes :func:`leaf_paths` looks at, nearest first: a recipe's parameters are
#: those of the ops just before its saved tensor.
PATH_NODES = 512


def leaf_paths(t: torch.Tensor, limit: int = PATH_NODES) -> dict[int, tuple[int, ...]]:
    """The leaves that require grad near ``t`` in its autograd graph, by storage address: for
    each, the ``next_functions`` indices from ``t``'s node (its base's, for a view) to the leaf's
    ``AccumulateGrad``, the shortest found within ``limit`` nodes.

    A recipe finds its parameters again this way in a later step: the leaf at the same place
    of the same graph, whatever address it has now (another model's parameter may have been
    given a freed one's address).
    """
    base = t if t._base is None else t._base
    out: dict[int, tuple[int, ...]] = {}
    if base.grad_fn is None:
        return out
    # The nodes walked, held: a node's Python object may be freed once dropped, and its id given
    # to the next one made.
    seen: dict[int, Any] = {id(base.grad_fn): base.grad_fn}
    frontier: list[tuple[Any, tuple[int, ...]]] = [(base.grad_fn, ())]
    while frontier and len(seen) < limit:
        nxt = []
        for fn, path in frontier:
            leaf = getattr(fn, "variable", None)  # AccumulateGrad's
            if leaf is not None:
                out.setdefault(leaf.untyped_storage().data_ptr(), path)
                continue
            for k, (f, _) in enumerate(fn.next_functions):
                if f is not None and id(f) not in seen:
                    seen[id(f)] = f
                    nxt.append((f, (*path, k)))
        frontier = nxt
    return out


def leaf_at(t: torch.Tensor, path: tuple[int, ...]) -> torch.Tensor | None:
    """The leaf at ``path`` (:func:`leaf_paths`) from ``t``'s autograd node, or None."""
    fn = (t if t._base is None else t._base).grad_fn
    for k in path:
        nexts = fn.next_functions if fn is not None else ()
        if k >= len(nexts):
            return None
        fn = nexts[k][0]
    return getattr(fn, "variable", None)


def _call_ns(calls: int = 200) -> int:
    """The host time of calling one small aten op from Python (a recipe's replay pays it per op,
    beside the kernel times the recorder measured), the median of a few batches."""
    a = torch.zeros(1)
    add = torch.ops.aten.add.Tensor
    times = []
    with torch.no_grad():
        for _ in range(5):
            t = time.perf_counter_ns()
            for _ in range(calls):
                add(a, a)
            times.append((time.perf_counter_ns() - t) // calls)
    return sorted(times)[len(times) // 2]


def maker_of(t: torch.Tensor) -> str:
    """The name of the autograd node that made ``t`` (its base's, for a view), or ``"-"``: what a
    later step's saved tensor is checked against before the plan recomputes it."""
    base = t if t._base is None else t._base
    fn = base.grad_fn
    return fn.name() if fn is not None else "-"


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter
        return 0


def _random(func: Any) -> bool:
    tags = getattr(func, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def _mutates(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is None or schema.is_mutable


#: How many frames above the mode's an op's caller may be (torch's dispatch wrappers between).
_CALLER_FRAMES = 6

#: Allocations: their bytes are whatever is written into them next, by an op or by a compiled
#: region's kernel, which no aten op shows.
_ALLOCATIONS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                          "aten::new_empty_strided", "aten::empty_permuted"})


def _uninitialized(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and schema.name in _ALLOCATIONS


def _scalar_list(a: Any) -> bool:
    return isinstance(a, (list, tuple)) and all(isinstance(x, _SCALARS) for x in a)


class _Timing:
    """An op's time: the host's clock for CPU ops, two CUDA events for ops on a CUDA device."""

    __slots__ = ("device", "t0", "e0")

    @staticmethod
    def start(flat: Iterable[Any]) -> _Timing:
        self = _Timing()
        self.device = next((a.device for a in flat if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
        if self.device is not None:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e0.record(torch.cuda.current_stream(self.device))
        else:
            self.t0 = time.perf_counter_ns()
        return self

    def stop(self) -> Any:
        if self.device is None:
            return _Done(time.perf_counter_ns() - self.t0)
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record(torch.cuda.current_stream(self.device))
        return _Events(self.e0, e1)


class _Done:
    __slots__ = ("value",)

    def __init__(self, ns: int) -> None:
        self.value = ns

    def ns(self) -> int:
        return self.value


class _Events:
    __slots__ = ("e0", "e1")

    def __init__(self, e0: Any, e1: Any) -> None:
        self.e0, self.e1 = e0, e1

    def ns(self) -> int:
        return round(self.e0.elapsed_time(self.e1) * 1e6)


def replay(recipe: Recipe, leaves: dict[int, torch.Tensor]) -> torch.Tensor:
    """Run ``recipe``'s ops over ``leaves`` (value id -> tensor) and return its target value.

    The ops run as recorded (after autocast's casts), so autocast is off
    around them, and without autograd (backward runs them, for the values
    it needs).
    """
    env: dict[int, torch.Tensor] = dict(leaves)
    device = next(iter(leaves.values())).device.type if leaves else "cpu"
    with torch.no_grad(), torch.autocast(device_type=device, enabled=False):
        for op in recipe.ops:
            spec, refs = op.args
            args, kwargs = tree_unflatten([env[r.value] if isinstance(r, _Ref) else r for r in refs], spec)
            out = op.func(*args, **kwargs)
            for v, t in zip(op.outs, tree_flatten(out)[0], strict=False):
                if v >= 0 and isinstance(t, torch.Tensor):
                    env[v] = t
    return env[recipe.target]

"""Recording a trace from a real training step (:func:`record_trace`), on CPU or CUDA.

The recorder runs one step (forward, backward, optimizer step) of a model
under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, which sees
every aten op with its input and output tensors, and under
:func:`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor
saved for backward. Each op is timed on its own, outside the recorder's
bookkeeping: on a CUDA device by two CUDA events around its kernels on the
current stream, waited for before the next op (so a trace recorded on a GPU
has the GPU's op times, each op run alone); on CPU by
``time.perf_counter_ns`` around the kernel. The trace's ``meta`` says which
(``op_time``: ``"cuda_events"`` or ``"cpu"``) and on what device.

A trace tensor is a *storage*: views share their base's storage and map to
one tensor, of the storage's size. During the recorded step the recorder
keeps every storage it saw alive, so no address is reused and identity by
``untyped_storage().data_ptr()`` is exact; the step needs memory for all its
tensors at once.

Kinds: parameters and buffers are ``weight``, the optimizer's state
``optimizer``, the batch (inputs and targets) ``input``; a tensor saved for
backward that is none of those is ``activation``; the parameters' gradients,
and any other tensor first written during backward, are ``gradient``;
everything else is ``workspace``.

Approximations: an op reads every tensor among its arguments and writes its
fresh outputs and the arguments its schema marks as written (``add_``'s
self, ``_foreach_add_``'s lists); a view op writes nothing. A tensor that
existed before the step and is none of the kinds above (a constant) is
recorded as ``input``. Times are those of a warm step (one unrecorded step
runs first, which also creates the optimizer's state); on CPU they are the
CPU's, not a GPU's. The ops the autograd engine runs outside the dispatcher
(none known) would be missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .._torch import TorchDispatchMode, tree_flatten
from .trace import Trace

#: The phases of a step, as op-name prefixes.
PHASES = ("fwd", "bwd", "step")


class _CpuTimer:
    """Times an op by the host's clock around the call (CPU kernels run in it)."""

    name = "cpu"

    def start(self) -> Any:
        return time.perf_counter_ns()

    def stop(self, started: Any) -> int:
        return time.perf_counter_ns() - started


class _CudaEventTimer:
    """Times an op by two CUDA events around its kernels on the model's device's current stream,
    waited for.

    The start event is recorded after the work queued before the op, so the
    time between the events is the op's kernels alone; waiting for the end
    event before the next op keeps each op's time its own. The events go on
    the model's device, whichever device is current (a model on ``cuda:1``
    while the current device is 0 included).
    """

    name = "cuda_events"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _recorded(self) -> Any:
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.device))
        return e

    def start(self) -> Any:
        return self._recorded()

    def stop(self, started: Any) -> int:
        end = self._recorded()
        end.synchronize()
        return round(started.elapsed_time(end) * 1e6)  # ms -> ns


class _Recorder(TorchDispatchMode):
    """Assigns ids to storages and records each op's reads, writes and time."""

    def __init__(self, timer: _CpuTimer | _CudaEventTimer | None = None) -> None:
        super().__init__()
        self.timer = timer or _CpuTimer()
        self.ids: dict[int, int] = {}  # storage data_ptr -> tensor id
        self.bytes: list[int] = []
        self.kind: dict[int, str] = {}  # fixed kinds: weight, optimizer, input, activation
        self.written_in: dict[int, str] = {}  # id -> phase of its first write
        self.keep: list[Any] = []  # every storage seen: no address reuse while recording
        self.ops: list[dict[str, Any]] = []
        self.phase = "fwd"

    def _storage(self, t: torch.Tensor) -> Any:
        if t.is_sparse or t.device.type == "meta":
            return None
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        if s.nbytes() == 0:
            return None
        return s

    def register(self, tensors: Iterable[torch.Tensor], kind: str) -> None:
        """Name tensors that exist before the step (their kind is fixed)."""
        for t in tensors:
            i = self._id(t)
            if i is not None:
                self.kind.setdefault(i, kind)

    def _id(self, t: torch.Tensor) -> int | None:
        s = self._storage(t)
        if s is None:
            return None
        ptr = s.data_ptr()
        i = self.ids.get(ptr)
        if i is None:
            i = len(self.bytes)
            self.ids[ptr] = i
            self.bytes.append(s.nbytes())
            self.keep.append(s)
        return i

    def mark_saved(self, t: torch.Tensor) -> None:
        i = self._id(t)
        if i is not None:
            self.kind.setdefault(i, "activation")

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        before = {self._storage(t).data_ptr() for t in flat_in if self._storage(t) is not None}
        reads: dict[int, None] = {}
        for t in flat_in:
            i = self._id(t)
            if i is not None:
                if i not in self.written_in and i not in self.kind:
                    self.kind[i] = "input"  # existed before the step: a constant
                reads[i] = None
        started = self.timer.start()
        out = func(*args, **kwargs)
        ns = self.timer.stop(started)
        writes: dict[int, None] = {}
        for t in _written_args(func, args, kwargs):
            i = self._id(t)
            if i is not None:
                writes[i] = None
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            s = self._storage(t)
            if s is None or s.data_ptr() in before:
                continue  # a view of an argument, or the argument itself
            i = self._id(t)
            writes[i] = None
        for i in writes:
            self.written_in.setdefault(i, self.phase)
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name.startswith("_record_function_"):
            return out  # the profiler's markers: no work, no tensors
        self.ops.append({"name": f"{self.phase}.{name}", "time_ns": ns,
                         "reads": list(reads), "writes": list(writes)})
        return out

    def trace(self, grads: Iterable[torch.Tensor], meta: dict[str, Any] | None = None) -> Trace:
        grad_ids = {self._id(g) for g in grads}
        tensors = []
        for i, b in enumerate(self.bytes):
            kind = self.kind.get(i)
            if kind is None:
                if i in grad_ids or self.written_in.get(i) == "bwd":
                    kind = "gradient"
                else:
                    kind = "workspace"
            tensors.append({"id": i, "bytes": b, "kind": kind})
        return Trace.from_dict({"version": 1, "tensors": tensors, "ops": self.ops,
                                "meta": {"op_time": self.timer.name, **(meta or {})}})


def _written_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments ``func``'s schema marks as written (in place or ``out=``)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out: list[torch.Tensor] = []
    for pos, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = kwargs.get(a.name, args[pos] if pos < len(args) and not a.kwarg_only else None)
        out += [t for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor)]
    return out


def record_trace(model: nn.Module, batch: tuple[torch.Tensor, ...],
                 loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer | None = None) -> Trace:
    """Record one training step of ``model`` as a G10 trace, with its device's op times.

    One unrecorded step runs first (it warms the kernels and creates the
    optimizer's state); then the recorded step: ``loss_fn(model, *batch)``,
    its backward and ``optimizer.step()``. The model's parameters change
    (two steps are taken).

    On a CUDA device each op is timed by CUDA events and waited for before
    the next (the recorded step runs slower than an unrecorded one, its op
    times are the GPU's); on CPU by the host's clock. ``trace.meta`` says
    which (``op_time``: ``"cuda_events"`` or ``"cpu"``) and the device.

    Args:
        model: the model, in training mode, on CPU or one CUDA device.
        batch: the step's tensors (inputs and targets), recorded as ``input``.
        loss_fn: called as ``loss_fn(model, *batch)``; returns the scalar loss.
        optimizer: default ``torch.optim.Adam(model.parameters())``.

    Returns:
        The validated trace (see this module's docstring for what is
        approximated).
    """
    opt = optimizer if optimizer is not None else torch.optim.Adam(model.parameters(), lr=1e-3)
    device = _device_of(model, batch)
    timer: _CpuTimer | _CudaEventTimer = _CudaEventTimer(device) if device.type == "cuda" else _CpuTimer()
    meta = {"device": str(device)}
    if device.type == "cuda":
        meta["device_name"] = torch.cuda.get_device_name(device)

    def step(rec: _Recorder | None) -> None:
        opt.zero_grad(set_to_none=True)
        if rec is None:
            loss_fn(model, *batch).backward()
            opt.step()
            return
        with rec, torch.autograd.graph.saved_tensors_hooks(_pack(rec), lambda t: t):
            rec.phase = "fwd"
            loss = loss_fn(model, *batch)
            rec.phase = "bwd"
            loss.backward()
        with rec:
            rec.phase = "step"
            opt.step()

    step(None)
    opt.zero_grad(set_to_none=True)
    rec = _Recorder(timer)
    rec.register(model.parameters(), "weight")
    rec.register(model.buffers(), "weight")
    rec.register((v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)),
                 "optimizer")
    rec.register(batch, "input")
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the warm step's work is not the first op's
    step(rec)
    return rec.trace((p.grad for p in model.parameters() if p.grad is not None), meta)


def _device_of(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.device:
    """The device the step runs on: its first parameter's, or its first tensor's (CPU if none)."""
    return next((t.device for t in (*model.parameters(), *batch) if isinstance(t, torch.Tensor)),
                torch.device("cpu"))


def _pack(rec: _Recorder) -> Callable[[torch.Tensor], torch.Tensor]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        rec.mark_saved(t)
        return t

    return pack

"""``python -m benchmarks offload``: activation offload against its peers (FlashNeuron tables 10-12).

With ``--device cuda`` (``--workload gpt``, its default there) it runs the
GPT-like model of :mod:`benchmarks.offload_cuda` instead: CUDA activations
against no offload, checkpointing, ``save_on_cpu``, TRL's offload and the
PCIe bound. Otherwise (``--workload train``):

CPU training of models built in code (a deep MLP and a CNN of
conv+BN+ReLU blocks), one row per way of handling the saved tensors:

- ``none``: no offload, and no saved-tensor hooks at all while timed (its
  peak comes from one untimed step under pyfastensor's ``policy="none"``,
  which only measures);
- ``torch.save`` / ``numpy.save``: a saved-tensor hook pair writing each
  tensor to its own file in the spill directory and loading it back;
- ``pft-wr`` / ``pft-w`` / ``pft-r``: pyfastensor, ``policy="all"``, with the
  write+read, write and read dictionaries;
- ``scheduled``: pyfastensor's FlashNeuron scheduler, allowed the lossless
  ``sparse`` codec (phase 2 uses it when the writes would outlast forward).

Each row gets two warm-up steps (pyfastensor's first is its profiling
iteration); then the timed steps run in rounds of one step per row, so a
disturbance from the rest of the machine lands on every row alike. Figures
are medians over the timed steps (peaks: the maximum); a row's step ratio to
``none`` is the median of its per-round ratios (each round's step against
the same round's ``none`` step), which cancels the slow drifts of a shared
machine that a ratio of medians keeps.

Every row uses the same accounting of *resident saved-tensor bytes*: bytes of
saved tensors of at least ``min_size`` held in memory by the saved-tensor
layer, counted per storage (pending writes, prefetched buffers, tensors
unpacked and still referenced; for ``none``, the saved tensors from pack until
autograd drops them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .harness import add_command, disk, temp_dir, write_json
from .harness import progress as say
from .workloads import TrainWorkload, train_workloads

if TYPE_CHECKING:  # torch (and pyfastensor.offload) load where a benchmark runs: `--help` stays fast
    import torch
    from torch import nn

MiB = 1 << 20

#: Targets.
TRANSFER_SPEEDUP = 2.5
SCHEDULED_SLOWDOWN = 1.15
PEAK_RATIO = 0.25

ROWS = ("none", "torch.save", "numpy.save", "pft-wr", "pft-w", "pft-r", "scheduled")
KEYS = ("step_ms", "peak_bytes", "peak_ratio", "transfer_ms", "stall_ms", "read_bytes", "buffer_bytes")


class Meter:
    """Bytes of saved tensors resident in memory because of a saved-tensor hook pair, and their peak.

    The accounting pyfastensor's :class:`~pyfastensor.OffloadSummary` reports
    as ``resident_peak_bytes``, for the file rows: counted per storage, not
    per tensor object (aliases and views share their storage and count once),
    from :meth:`track` until the storage itself is freed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self._tracked: set[int] = set()  # data_ptr of storages counted by track()

    def add(self, n: int) -> None:
        with self._lock:
            self.now += n
            self.peak = max(self.peak, self.now)

    def sub(self, n: int) -> None:
        with self._lock:
            self.now -= n

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.now

    def track(self, t: torch.Tensor) -> None:
        """Count the bytes of ``t``'s storage until that storage is freed (once per storage)."""
        storage = t.untyped_storage()
        key, n = storage.data_ptr(), storage.nbytes()
        with self._lock:
            if n == 0 or key in self._tracked:
                return
            self._tracked.add(key)
        self.add(n)
        weakref.finalize(storage, self._untrack, key, n)

    def _untrack(self, key: int, n: int) -> None:
        with self._lock:
            self._tracked.discard(key)
        self.sub(n)


def _storages_of(module: nn.Module) -> set[int]:
    """Addresses of the storages of a module's parameters and buffers."""
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


def _is_parameter(t: torch.Tensor, registered: set[int]) -> bool:
    """A parameter, a view of one, a leaf that requires grad, or a registered storage: what
    pyfastensor's offload leaves in memory, so the file rows leave it too."""
    from torch import nn

    def param_like(x: torch.Tensor) -> bool:
        return isinstance(x, nn.Parameter) or (x.is_leaf and x.requires_grad)

    if param_like(t) or (t._base is not None and param_like(t._base)):
        return True
    return bool(registered) and t.untyped_storage().data_ptr() in registered


class _File:
    """A saved tensor's file; removed when autograd drops this handle."""

    __slots__ = ("__weakref__", "path")

    def __init__(self, path: str) -> None:
        self.path = path


class FileHooks:
    """Per-tensor file offload (``torch.save`` or ``numpy.save``), measured like pyfastensor.

    Pack writes each eligible saved tensor to its own file (synchronously)
    and returns its path; unpack loads it. Files go when autograd drops the
    handle. The meter counts a tensor while it is written and every loaded
    copy until its storage is freed.
    """

    def __init__(self, kind: str, directory: str, min_size: int, module: nn.Module) -> None:
        self.kind, self.dir, self.min_size = kind, directory, min_size
        self.device = next(module.parameters()).device
        self.registered = _storages_of(module)
        self.meter = Meter()
        self.pack_seconds = self.unpack_seconds = 0.0
        self._n = 0

    def _pack(self, t: torch.Tensor) -> Any:
        import torch

        start = time.perf_counter()
        try:
            if t.numel() * t.element_size() < self.min_size or _is_parameter(t, self.registered):
                return t
            self._n += 1
            path = os.path.join(self.dir, f"t{self._n}.{'npy' if self.kind == 'numpy.save' else 'pt'}")
            n = t.untyped_storage().nbytes()
            self.meter.add(n)
            if self.kind == "numpy.save":
                np.save(path, t.detach().cpu().numpy())
            else:
                torch.save(t.detach(), path)
            self.meter.sub(n)
            handle = _File(path)
            weakref.finalize(handle, os.remove, path)
            return handle
        finally:
            self.pack_seconds += time.perf_counter() - start

    def _unpack(self, h: Any) -> torch.Tensor:
        import torch

        if isinstance(h, torch.Tensor):
            return h
        start = time.perf_counter()
        if self.kind == "numpy.save":
            out = torch.from_numpy(np.load(h.path)).to(self.device)
        else:
            out = torch.load(h.path, weights_only=True)
        self.meter.track(out)
        self.unpack_seconds += time.perf_counter() - start
        return out

    def __enter__(self) -> FileHooks:
        import torch

        self.meter.reset_peak()
        self.pack_seconds = self.unpack_seconds = 0.0
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                ctx: Any) -> float:
    from torch import nn

    start = time.perf_counter()
    opt.zero_grad()
    with ctx:
        nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if x.is_cuda:  # the step's kernels, not just their launches
        import torch

        torch.cuda.synchronize(x.device)
    return time.perf_counter() - start


def _figures(ctx: Any, none_peak: int) -> dict[str, float]:
    from pyfastensor.offload import Offload

    if isinstance(ctx, contextlib.nullcontext):
        return {"peak_bytes": none_peak, "transfer_ms": 0.0, "stall_ms": 0.0, "read_bytes": 0, "buffer_bytes": 0}
    if isinstance(ctx, Offload):
        s = ctx.summary()
        return {"peak_bytes": s.resident_peak_bytes, "transfer_ms": (s.pack_seconds + s.unpack_seconds) * 1e3,
                "stall_ms": s.stall_seconds * 1e3, "read_bytes": s.bytes_read, "engines": dict(s.engines),
                "buffer_bytes": s.read_buffer_bytes}
    return {"peak_bytes": ctx.meter.peak, "transfer_ms": (ctx.pack_seconds + ctx.unpack_seconds) * 1e3,
            "stall_ms": 0.0, "read_bytes": 0, "buffer_bytes": 0}


def make_context(row: str, w: TrainWorkload, directory: str, min_size: int, budget: int) -> Any:
    """The saved-tensor context of one row of the table."""
    from pyfastensor.offload import Offload

    if row in ("torch.save", "numpy.save"):
        return FileHooks(row, directory, min_size, w.model)
    if row == "none":
        return contextlib.nullcontext()
    if row == "scheduled":
        return Offload(policy="scheduled", budget=budget, min_size=min_size, module=w.model, spill_dir=directory,
                       compression="sparse")
    if row == "planned":
        return Offload(policy="planned", budget=budget, min_size=min_size, module=w.model, spill_dir=directory)
    if row == "all":
        return Offload(policy="all", budget=budget, min_size=min_size, module=w.model, spill_dir=directory)
    return Offload(policy="all", budget=budget, min_size=min_size, module=w.model, spill_dir=directory,
                   dictionary=row.split("-")[1])


def run_rows(rows: dict[str, int], w: TrainWorkload, batch: int, directory: str, *, min_size: int,
             steps: int, warmup: int, progress: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """Train ``warmup`` steps under each row (``{row: budget}``), then ``steps`` rounds of one step
    per row, interleaved, so that whatever else the machine does in the meantime falls on every
    row alike; medians of the timed steps, max of peaks, and (with a ``none`` row) each row's
    median per-round step ratio to it."""
    import torch

    from pyfastensor.offload import Offload

    ctxs = {row: make_context(row, w, directory, min_size, budget) for row, budget in rows.items()}
    none_peak = _peak_at(w, batch, directory, min_size, None) if "none" in rows else 0
    model = w.model
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = w.batch(batch)
    for row, ctx in ctxs.items():
        if progress:
            progress(f"{w.name} batch {batch}: {row} (warm-up)")
        for _ in range(warmup):
            _train_step(model, opt, x, y, ctx)
    times: dict[str, list[float]] = {row: [] for row in rows}
    figs: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    for i in range(steps):
        if progress:
            progress(f"{w.name} batch {batch}: timed round {i + 1} of {steps}")
        for row, ctx in ctxs.items():
            times[row].append(_train_step(model, opt, x, y, ctx))
            figs[row].append(_figures(ctx, none_peak))
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        f = figs[row]
        r = {k: statistics.median(g[k] for g in f) for k in ("transfer_ms", "stall_ms", "read_bytes")}
        r["peak_bytes"] = max(g["peak_bytes"] for g in f)
        r["buffer_bytes"] = max(g["buffer_bytes"] for g in f)
        r["step_ms"] = statistics.median(times[row]) * 1e3
        r["engines"] = f[-1].get("engines", {})
        if "none" in times:
            r["step_ratio"] = statistics.median(t / n for t, n in zip(times[row], times["none"], strict=True))
        out[row] = r
    for ctx in ctxs.values():
        if isinstance(ctx, Offload):
            ctx.close()
    return out


def _peak_at(w: TrainWorkload, batch: int, directory: str, min_size: int, offload_budget: int | None) -> int:
    """Peak resident saved-tensor bytes of one step (two under offload: profiling, then measured)."""
    from torch import nn

    from pyfastensor.offload import Offload

    if offload_budget is None:
        ctx: Any = Offload(policy="none", min_size=min_size, module=w.model)
        steps = 1
    else:
        ctx = Offload(policy="all", budget=offload_budget, min_size=min_size, module=w.model, spill_dir=directory)
        steps = 2
    x, y = w.batch(batch)
    peak = 0
    for _ in range(steps):
        with ctx:
            nn.functional.cross_entropy(w.model(x), y).backward()
        peak = max(peak, ctx.summary().resident_peak_bytes)
    ctx.close()
    w.model.zero_grad(set_to_none=True)
    return peak


def largest_batch(w: TrainWorkload, budget: int, directory: str, min_size: int, offload: bool,
                  start: int, cap: int) -> int:
    """The largest batch (binary search, at most ``cap``) whose peak fits ``budget``; 0 if none."""
    def fits(b: int) -> bool:
        return _peak_at(w, b, directory, min_size, budget if offload else None) <= budget

    lo, hi = 0, start
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def run(directory: str, *, quick: bool = False, min_size: int = 256 << 10, budget_fraction: float = 0.2,
        scheduled_fraction: float = 0.5, steps: int | None = None, limit: bool = True,
        batch_search: bool = True, models: list[tuple[TrainWorkload, int]] | None = None,
        progress: Callable[[str], None] | None = None, device: str = "cpu") -> dict[str, Any]:
    """Run the whole benchmark; return the tables as a dict (see :func:`format_report`).

    Args:
        directory: where the spill files go (nothing is left in it).
        quick: smaller models and fewer steps.
        min_size: saved tensors below this many bytes stay in memory.
        budget_fraction: ``policy="all"`` budget, as a fraction of no-offload's peak.
        scheduled_fraction: the scheduled policy's budget, as a fraction of no-offload's peak.
        steps: timed steps per row (default 9; 2 with ``quick``).
        limit: measure the disk's O_DIRECT limit.
        batch_search: search the largest batch that fits the budget.
        models: workloads and batch sizes (default :func:`~benchmarks.workloads.train_workloads`).
        progress: called with a line per row.
        device: where the models train (``"cuda"``: activations offloaded from the GPU).

    Returns:
        ``{"models": {name: {"batch", "rows": {row: {KEYS...}}, "fit": {...}}}, "limit": str, ...}``.
    """
    steps = steps or (2 if quick else 9)
    result: dict[str, Any] = {"models": {}, "dictionary_note": (
        "pft-w/pft-r/pft-wr: the spill engine per size comes from the write, read or write+read "
        "dictionary (aware mode, this machine's spill dictionary file; engines column: bytes written "
        "per engine in the last step)")}
    for w, batch in models or train_workloads(quick, device):
        base = _peak_at(w, batch, directory, min_size, None)
        budget = max(1, int(base * budget_fraction))
        budgets = {row: int(base * scheduled_fraction) if row == "scheduled" else budget for row in ROWS}
        rows = run_rows(budgets, w, batch, directory, min_size=min_size, steps=steps, warmup=2,
                        progress=progress)
        none = rows["none"]
        for r in rows.values():
            r["peak_ratio"] = r["peak_bytes"] / max(none["peak_bytes"], 1)
        entry: dict[str, Any] = {"batch": batch, "budget": budget, "rows": rows}
        if batch_search:
            cap = batch * 4
            entry["fit"] = {
                "budget": budget,
                "none": largest_batch(w, budget, directory, min_size, False, max(1, batch // 8), cap),
                "offload": largest_batch(w, budget, directory, min_size, True, max(1, batch // 8), cap),
                "cap": cap,
            }
        result["models"][w.name] = entry
    if limit:
        try:
            lim = disk.measure_limit(directory, size=(64 if quick else 256) * MiB, use_fio=not quick)
            result["limit"] = lim.describe()
        except Exception as e:  # the limit is context, not the benchmark's point
            result["limit"] = f"disk limit not measured: {e}"
    return result


def _engines(written: dict[str, int]) -> str:
    return ", ".join(f"{e} {n / MiB:.0f}" for e, n in sorted(written.items()) if n) or "-"


def format_report(result: dict[str, Any]) -> str:
    """The tables, side by side with ratios and the targets."""
    lines = []
    for name, m in result["models"].items():
        rows = m["rows"]
        lines.append(f"\n{name}, batch {m['batch']}, policy 'all' budget {m['budget'] / MiB:.1f} MiB")
        lines.append(f"  {'row':<11}{'step ms':>9}{'x none':>8}{'peak MiB':>10}{'x none':>8}"
                     f"{'transfer ms':>13}{'stall ms':>10}{'read MiB':>10}{'bufs MiB':>10}"
                     "  engines (MiB written, last step)")
        for row, r in rows.items():
            lines.append(f"  {row:<11}{r['step_ms']:>9.1f}{r['step_ratio']:>8.2f}{r['peak_bytes'] / MiB:>10.1f}"
                         f"{r['peak_ratio']:>8.3f}{r['transfer_ms']:>13.1f}{r['stall_ms']:>10.1f}"
                         f"{r['read_bytes'] / MiB:>10.1f}{r['buffer_bytes'] / MiB:>10.1f}"
                         f"  {_engines(r.get('engines') or {})}")
        ts, pf = rows["torch.save"]["transfer_ms"], rows["pft-wr"]["transfer_ms"]
        gain = ts / max(pf, 1e-9)
        sched = rows["scheduled"]["step_ratio"]
        peak = rows["pft-wr"]["peak_ratio"]
        lines.append(f"  transfer time torch.save / pyfastensor: {gain:.2f}x "
                     f"(target >= {TRANSFER_SPEEDUP}x: {'met' if gain >= TRANSFER_SPEEDUP else 'MISSED'})")
        lines.append(f"  scheduled step / no offload: {sched:.2f}x "
                     f"(target <= {SCHEDULED_SLOWDOWN}x: {'met' if sched <= SCHEDULED_SLOWDOWN else 'MISSED'})")
        lines.append(f"  peak under 'all' / no offload: {peak:.3f} "
                     f"(target <= {PEAK_RATIO}: {'met' if peak <= PEAK_RATIO else 'MISSED'})")
        if "fit" in m:
            f = m["fit"]
            lines.append(f"  largest batch within {f['budget'] / MiB:.1f} MiB of saved tensors (searched up to "
                         f"{f['cap']}): no offload {f['none']}, offload {f['offload']}"
                         f" ({f['offload'] / max(f['none'], 1):.1f}x)")
    lines.append("\n" + result["dictionary_note"])
    if "limit" in result:
        lines.append(result["limit"])
    return "\n".join(lines)


_DESCRIPTION = __doc__.split("\n", 2)[2] + """
Figures per row: median step time (forward, backward, optimizer) and the
median of its per-round ratios to no offload; peak resident saved-tensor bytes and ratio; offload
transfer time per step (time spent in the pack and unpack hooks, which
includes the waits for I/O, i.e. stalls; the stall column is the part of it
pyfastensor's store measured as waiting); bytes read back; read-back
buffers pyfastensor keeps for reuse across steps (bufs: not saved tensors,
and reclaimable by the kernel between steps, MADV_FREE).

Targets: transfer time >= 2.5x lower with pyfastensor than
torch.save; scheduled step <= 1.15x no offload; peak under 'all' <= 25% of
no offload. Then the largest batch whose peak fits the 'all' budget, with
and without offload (doubling, then binary search), and the disk's O_DIRECT
limit measured in the same run.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``offload`` to the benchmarks' subcommands."""
    p = add_command(sub, "offload", help="activation offload vs torch.save/numpy.save and no offload",
                    description=_DESCRIPTION, func=_cmd_offload,
                    dir_help="spill directory (default: a temporary directory under .)",
                    limit_help="skip the disk limit")
    p.add_argument("--quick", action="store_true", help="smaller models, 2 timed steps, 64M disk limit")
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default 9; 2 with --quick)")
    p.add_argument("--budget-fraction", type=float, default=0.2,
                   help="policy 'all' budget as a fraction of no offload's peak (default 0.2)")
    p.add_argument("--scheduled-fraction", type=float, default=0.5,
                   help="scheduled policy budget as a fraction of no offload's peak (default 0.5)")
    p.add_argument("--min-size", type=int, default=256 << 10, help="bytes below which tensors stay (default 256K)")
    p.add_argument("--no-batch-search", action="store_true", help="skip the largest-batch search")
    p.add_argument("--device", default="cpu", help="where the models train: cpu (default) or cuda")
    p.add_argument("--pareto", action="store_true",
                   help="step time against memory: no offload, checkpointing, selective checkpointing, "
                        "torch.compile's memory budget, save_on_cpu, TRL (CUDA), and policy='auto' at budgets "
                        "along its frontier (benchmarks/pareto.py; --device cuda: the GPT model and a Llama-like one)")
    p.add_argument("--rounds", type=int, default=5, help="--pareto: paired rounds (default 5)")
    p.add_argument("--peers", default=None, help="--pareto: comma list of the peers' rows to run (default all: "
                   "none, checkpoint, sac, compile@0.8, compile@0.5, compile@0.2, compile-blocks, save_on_cpu, trl, "
                   "trl+checkpoint); auto's rows always run")
    p.add_argument("--plot", default="bench-out/pareto.png", help="--pareto: the PNG of the front "
                   "(default bench-out/pareto.png)")
    p.add_argument("--no-plot", action="store_true", help="--pareto: do not draw the plot")
    p.add_argument("--workload", choices=("gpt", "train"), default=None,
                   help="gpt: the GPT-like model against no offload, checkpointing, save_on_cpu, TRL and the "
                        "PCIe bound (CUDA only; the default with --device cuda); train: the MLP and CNN tables "
                        "(the default on cpu)")


def _cmd_offload(args: argparse.Namespace) -> int:
    if args.pareto:
        from . import harness, pareto

        with temp_dir(args.dir, "pareto") as d:
            peers = tuple(p.strip() for p in args.peers.split(",") if p.strip()) if args.peers else pareto.PEERS
            unknown = [p for p in peers if p not in pareto.PEERS]
            if unknown:
                raise SystemExit(f"unknown --peers {', '.join(unknown)}: expected some of {', '.join(pareto.PEERS)}")
            result = pareto.run(d, device=args.device, quick=args.quick, rounds=args.rounds, peers=peers)
        return harness.finish(result, args, pareto.format_report, pareto.plot)
    workload = args.workload or ("gpt" if args.device.startswith("cuda") else "train")
    with temp_dir(args.dir, "offload") as d:
        if workload == "gpt":
            if not args.device.startswith("cuda"):
                raise SystemExit("offload --workload gpt trains on a GPU: add --device cuda")
            from . import offload_cuda

            lim = None
            if not args.no_limit:
                lim = disk.measure_limit(d, size=(64 if args.quick else 1024) * MiB, use_fio=not args.quick)
            result = offload_cuda.run(d, quick=args.quick, steps=args.steps, disk_limit=lim, progress=say)
            text = offload_cuda.format_report(result) + ("\n" + lim.describe() if lim is not None else "")
        else:
            result = run(d, quick=args.quick, min_size=args.min_size, budget_fraction=args.budget_fraction,
                         scheduled_fraction=args.scheduled_fraction, steps=args.steps, limit=not args.no_limit,
                         batch_search=not args.no_batch_search, device=args.device)
            text = format_report(result)
    print(text)
    if args.json:
        write_json(result, args.json)
    return 0

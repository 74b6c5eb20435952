"""``python -m benchmarks plan``: G10 against its baselines on G10's own A100 traces, then on traces recorded here.

First (``--no-g10`` skips it, ``--g10-only`` keeps only it): the 25
workloads of ``benchmarks/g10-traces`` against G10's published results,
and g10's sensitivity to the SSD's bandwidth and the host memory's size
(``benchmarks/plan_g10.py`` says what each column is).

Second, small models recorded on this CPU: for each built-in model (BERT-like, ViT-like, ResNet-like) and batch size,
one training step is recorded on CPU (:mod:`pyfastensor.plan.record`), and
the trace is simulated on the G10 paper's Table 2 hardware
(``Hardware.g10_default()``) with the device memory set relative to the
trace's own peak so that the memory demand is a chosen multiple of the
capacity (150%, 200%, 300%, 400% by default). Each policy's throughput is
normalized to ideal (``ideal_ns / time_ns``; 0 when it cannot run).

Batches and demands pair up in order (the n-th batch at the n-th demand, as
Figure 11 grows the demand with the batch) when the two lists are as long;
otherwise every batch runs at every demand.

What is simulated, not measured: op times are this CPU's, divided by
``--speedup`` to stand in for the G10 paper's device, while the transfers run at
Table 2's SSD and PCIe speeds. Nothing here times disk I/O. The default,
``--speedup auto``, is a measured ratio, not a choice: the G10 paper's A100 at its
FP32 peak (19.5 TFLOP/s; PyTorch runs FP32 matmuls without TF32 by default)
over this CPU's best FP32 matmul rate (a 1024^3 product through torch, best
of five). Both are peak rates, so the ratio is the gap at the best shapes of
each; small kernels run further below peak on a CPU than on a GPU, so it
understates the gap rather than overstates it. ``--speedup 1`` keeps the CPU
times (every transfer then hides behind slow compute).

The models run at the G10 paper's widths by default (BERT and ViT 768 as in
BERT-base and ViT-B, ResNet 64 channels and up as in ResNet-152; 4 layers,
for this CPU's time) and at batches 64 to 256, where saved activations
outweigh the weights and optimizer state as in Figure 11's large batches.
Compute per activation byte grows with the width (a layer's FLOPs per byte
it saves are about proportional to it): at the models' own small widths
(``--width bert=64,vit=64,resnet=16``) or small batches the traces save far
more bytes per FLOP than the G10 paper's models do, and every policy is bound by
the links. The ``bound`` column says, per row, the most throughput the links
and host memory allow at that capacity (``offload.BoundNs``): below the 90%
target, no plan meets it.

``--runtime`` (or ``--runtime-only``, which skips the simulation) adds the
measured half: real training steps on this machine's CPU, with spill files
in ``--dir``, under ``pyfastensor.offload(policy="planned")`` (G10's plan
carried out) against ``"scheduled"`` (FlashNeuron's selection, sparse codec)
and ``"all"`` at the same budget (``--budget-fraction`` of no offload's
resident saved-tensor peak, default 50%), and against no offload, which
always fits on a CPU. Rows run interleaved over ``--rounds`` rounds after two
warm-up steps each; every figure is a median with its min-max, ratios taken
per round. Targets: planned no slower than scheduled, and at most 1.10x no
offload.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from .harness import (
    add_command,
    finish,
    paired_ratios,
    plot_or_say,
    progress,
    save_figure,
    spread,
    write_json,
)

#: Targets: G10's throughput against ideal (mean over rows) and against FlashNeuron's selection.
G10_OF_IDEAL = 0.90
G10_OVER_FLASHNEURON = 1.3

#: The G10 paper's device (Table 2): an A100's FP32 peak rate, FLOP/s.
A100_FP32_FLOPS = 19.5e12

DEFAULT_BATCHES = (64, 128, 192, 256)
#: The G10 paper's widths: BERT-base and ViT-B 768, ResNet-152's first stage 64 channels.
DEFAULT_WIDTHS = {"bert": 768, "vit": 768, "resnet": 64}
DEFAULT_DEMANDS = (1.5, 2.0, 3.0, 4.0)


def run(models: tuple[str, ...] = ("bert", "vit", "resnet"), batches: tuple[int, ...] = DEFAULT_BATCHES,
        demands: tuple[float, ...] = DEFAULT_DEMANDS, *, layers: int | None = 4, width: int | dict[str, int] | None = None,
        speedup: float | None = None, traces_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Record the traces and simulate every policy on each.

    Args:
        models: built-in model names.
        batches: batch sizes.
        demands: memory demand as a multiple of the simulated device capacity.
        layers: model depth (see ``python -m benchmarks trace --help``; default 4).
        width: model width, for every model or per model name (default: each model's).
        speedup: op times are divided by it (default: :func:`device_speedup`, measured).
        traces_dir: where to save each recorded trace (default: not saved).

    Returns:
        ``{"settings": ..., "hardware": ..., "rows": [...], "summary": ...}``; a row has
        the model, batch, demand, device bytes, trace peak and one result per policy.
    """
    from pyfastensor.plan import Hardware, bound_ns, policies, simulate

    from . import workloads as builtin

    cpu = None
    if speedup is None:
        speedup, cpu = device_speedup()
    if speedup <= 0:
        raise ValueError(f"--speedup must be positive, got {speedup}")
    if any(d <= 0 for d in demands):
        raise ValueError(f"--demands must be positive, got {demands}")
    pairs = (list(zip(batches, demands, strict=True)) if len(batches) == len(demands)
             else [(b, d) for b in batches for d in demands])
    base = Hardware.g10_default()
    rows: list[dict[str, Any]] = []
    for name in models:
        recorded: dict[int, Any] = {}
        for batch, demand in pairs:
            if batch not in recorded:
                w = width.get(name) if isinstance(width, dict) else width
                t = builtin.record(name, batch, layers=layers, width=w)
                if traces_dir is not None:
                    Path(traces_dir).mkdir(parents=True, exist_ok=True)
                    t.save(Path(traces_dir) / f"{name}-b{batch}.json")
                recorded[batch] = t.scale_time(1 / speedup) if speedup != 1 else t
            trace = recorded[batch]
            peak = simulate(trace, base, "ideal").peak_device_bytes
            hw = base.replace(device_bytes=max(1, int(peak / demand)))
            results = {p: simulate(trace, hw, p) for p in policies()}
            bound = bound_ns(trace, hw)
            rows.append({"model": name, "batch": batch, "demand": demand, "device_bytes": hw.device_bytes,
                         "peak_bytes": peak, "ops": len(trace.ops), "ideal_ns": trace.total_ns,
                         "throughput": {p: r.throughput for p, r in results.items()},
                         "bound": trace.total_ns / bound if bound else 0.0,
                         "errors": {p: r.error for p, r in results.items() if r.error},
                         "ssd_write_bytes": {p: r.ssd_write_bytes for p, r in results.items()},
                         "host_write_bytes": {p: r.host_write_bytes for p, r in results.items()}})
    return {"settings": {"models": list(models), "batches": list(batches), "demands": list(demands),
                         "layers": layers, "width": width, "speedup": speedup, "cpu_flops": cpu},
            "hardware": base.to_dict(), "rows": rows, "summary": summarize(rows)}


def cpu_flops(n: int = 1024, repeats: int = 5) -> float:
    """This CPU's FP32 matmul rate in FLOP/s: the best of ``repeats`` ``n x n x n`` products through torch."""
    import time

    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def device_speedup() -> tuple[float, float]:
    """How much faster the G10 paper's A100 computes than this CPU, measured: ``(speedup, cpu_flops)``.

    The ratio of the A100's FP32 peak (:data:`A100_FP32_FLOPS`) to this
    CPU's best FP32 matmul rate (:func:`cpu_flops`).
    """
    cpu = cpu_flops()
    return A100_FP32_FLOPS / cpu, cpu


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean normalized throughput per policy, G10 against the targets, and the rows that fall short."""
    if not rows:
        return {"mean": {}, "mean_bound": None, "g10_over_flashneuron": None, "short": []}
    policies = list(rows[0]["throughput"])
    mean = {p: statistics.fmean(r["throughput"][p] for r in rows) for p in policies}
    mean_bound = statistics.fmean(r["bound"] for r in rows)
    fn = mean.get("flashneuron", 0.0)
    over = mean["g10"] / fn if fn > 0 else float("inf")
    short = []
    for r in rows:
        g, f = r["throughput"]["g10"], r["throughput"]["flashneuron"]
        why = []
        if g < G10_OF_IDEAL:
            why.append(f"g10 {g:.3f} of ideal < {G10_OF_IDEAL:.2f}"
                       + (f" (the links allow at most {r['bound']:.3f})" if r["bound"] < G10_OF_IDEAL else
                          f" (the links allow {r['bound']:.3f}: the planner's shortfall)"))
        if f > 0 and g / f < G10_OVER_FLASHNEURON:
            why.append(f"g10 {g / f:.2f}x flashneuron < {G10_OVER_FLASHNEURON}x")
        if why:
            short.append(f"{r['model']} B={r['batch']} M={r['demand']:.0%}: {'; '.join(why)}")
    return {"mean": mean, "mean_bound": mean_bound, "g10_over_flashneuron": over,
            "g10_of_ideal_met": mean["g10"] >= G10_OF_IDEAL,
            "g10_over_flashneuron_met": over >= G10_OVER_FLASHNEURON, "short": short}


def format_report(result: dict[str, Any]) -> str:
    """The table (one row per model, batch and demand; one column per policy) and the targets."""
    rows, s = result["rows"], result["settings"]
    if not rows:
        return "no rows"
    policies = list(rows[0]["throughput"])
    hw = result["hardware"]
    lines = [f"bench plan: throughput normalized to ideal; Table 2 hardware (SSD {hw['ssd_read_bps'] / 1e9:g}/"
             f"{hw['ssd_write_bps'] / 1e9:g} GB/s, PCIe {hw['host_link_bps'] / 1e9:g} GB/s) with device memory "
             f"= trace peak / demand; op times: CPU" + (f" / {s['speedup']:.4g}" if s["speedup"] != 1 else "")
             + (f" (A100 FP32 {A100_FP32_FLOPS / 1e12:g} TFLOP/s over this CPU's {s['cpu_flops'] / 1e9:.1f} GFLOP/s, "
                f"measured)" if s.get("cpu_flops") else "")]
    head = f"{'model':<7} {'batch':>5} {'demand':>6} {'device':>10} {'ops':>5}"
    lines.append(head + "".join(f" {p:>11}" for p in policies) + f" {'bound':>7} {'g10/fn':>7}")
    for r in rows:
        t = r["throughput"]
        cells = "".join(f" {t[p]:>11.3f}" if t[p] else f" {'infeasible':>11}" for p in policies)
        fn = t.get("flashneuron", 0.0)
        ratio = f"{t['g10'] / fn:>7.2f}" if fn else f"{'-':>7}"
        lines.append(f"{r['model']:<7} {r['batch']:>5} {r['demand']:>6.0%} {_mib(r['device_bytes']):>10} "
                     f"{r['ops']:>5}{cells} {r['bound']:>7.3f} {ratio}")
    m = result["summary"]
    lines.append(f"{'mean':<37}" + "".join(f" {m['mean'][p]:>11.3f}" for p in policies)
                 + f" {m['mean_bound']:>7.3f}")
    lines.append("bound: the most any plan can reach (ideal over offload.BoundNs: the bytes that must cross the "
                 "links at this capacity, over their bandwidth, the SSD's alone beyond host memory)")
    over = m["g10_over_flashneuron"]
    lines.append(f"target: g10 >= {G10_OF_IDEAL:.0%} of ideal on average: {m['mean']['g10']:.1%} "
                 f"({'met' if m['g10_of_ideal_met'] else 'NOT met'})")
    lines.append(f"target: g10 >= {G10_OVER_FLASHNEURON}x flashneuron (ratio of means): {over:.2f}x "
                 f"({'met' if m['g10_over_flashneuron_met'] else 'NOT met'})")
    if not m["g10_over_flashneuron_met"] and s["speedup"] == 1:
        lines.append("  note: op times are this CPU's, far slower than the G10 paper's A100, so transfers hide behind "
                     "compute for every policy; --speedup shortens them")
    for line in m["short"]:
        lines.append(f"  short: {line}")
    for r in rows:
        for p, e in r["errors"].items():
            lines.append(f"  infeasible: {r['model']} B={r['batch']} M={r['demand']:.0%} {p}: {e}")
    return "\n".join(lines)


def _mib(b: int) -> str:
    return f"{b / (1 << 20):.1f}MiB"


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw Figure 11's grouped bars: per model and batch, one bar per policy, normalized to ideal.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["rows"]
    policies = list(rows[0]["throughput"]) if rows else []
    colors = {"ideal": "0.3", "on_demand": "tab:blue", "flashneuron": "tab:orange", "g10": "tab:green"}
    fig = Figure(figsize=(max(6, 0.9 * len(rows) + 2), 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    w = 0.8 / max(1, len(policies))
    for j, p in enumerate(policies):
        xs = [i + (j - (len(policies) - 1) / 2) * w for i in range(len(rows))]
        ax.bar(xs, [r["throughput"][p] for r in rows], w, label=p, color=colors.get(p))
    ax.axhline(G10_OF_IDEAL, color="black", lw=0.6, ls=":", label=f"{G10_OF_IDEAL:.0%} of ideal")
    ax.set_xticks(range(len(rows)), [f"{r['model']}\nB={r['batch']}\nM={r['demand']:.0%}" for r in rows],
                  fontsize=8)
    ax.set_ylim(0, 1.3)  # room for the legend above the bars
    ax.set_ylabel("throughput normalized to ideal")
    ax.legend(fontsize=8, ncols=len(policies) + 1, loc="upper center")
    ax.grid(True, axis="y", alpha=0.3)
    s = result["settings"]
    fig.suptitle("pyfastensor bench plan (simulated, G10's Figure 11)"
                 + (f", op times / {s['speedup']:.4g}" if s["speedup"] != 1 else ""))
    return save_figure(fig, path, dpi=120)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x.strip())


def _widths(s: str) -> int | dict[str, int]:
    if "=" not in s:
        return int(s)
    return {k.strip(): int(v) for k, v in (x.split("=", 1) for x in s.split(",") if x.strip())}


def _speedup(s: str) -> float | None:
    return None if s.strip().lower() == "auto" else float(s)


def _demands(s: str) -> tuple[float, ...]:
    return tuple(float(x.strip().rstrip("%")) / (100 if "%" in x else 1) for x in s.split(",") if x.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``benchmarks plan`` to ``sub``."""
    p = add_command(sub, "plan", help="G10 against on-demand and FlashNeuron on G10's A100 traces and on recorded ones (simulated)",
                    description=__doc__, func=_cmd, json_help=None)
    p.add_argument("--models", default="bert,vit,resnet", help="built-in models (default bert,vit,resnet)")
    p.add_argument("--batches", type=_ints, default=DEFAULT_BATCHES,
                   help=f"batch sizes (default {','.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("--demands", type=_demands, default=DEFAULT_DEMANDS,
                   help="memory demand over device capacity, as ratios or percentages "
                        "(default 150%%,200%%,300%%,400%%)")
    p.add_argument("--layers", type=int, default=4, help="model depth (default 4)")
    p.add_argument("--width", type=_widths, default=DEFAULT_WIDTHS,
                   help="model width: one for every model, or per model (default bert=768,vit=768,resnet=64: "
                        "the paper's; the models' own are bert, vit 64 and resnet 16)")
    p.add_argument("--speedup", type=_speedup, default=None,
                   help="divide the CPU op times by this, for the G10 paper's device; 'auto' (the default): the A100's "
                        "FP32 peak over this CPU's measured FP32 matmul rate")
    p.add_argument("--traces", default=None, metavar="DIR", help="save the recorded traces in DIR")
    p.add_argument("--plot", default="bench-out/plan.png",
                   help="PNG of the grouped bars (default bench-out/plan.png; needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="write the raw results as JSON (the run-time part's to PATH-runtime.json, or to PATH "
                        "with --runtime-only)")
    g = p.add_argument_group("G10's own A100 traces (the first section)")
    g.add_argument("--no-g10", action="store_true", help="skip the section on G10's traces")
    g.add_argument("--g10-only", action="store_true", help="only the section on G10's traces")
    g.add_argument("--g10-workloads", default=None, metavar="W[,W...]",
                   help="workloads among benchmarks/g10-traces, e.g. BERT_Base/256,VIT/1280 (default: all 25)")
    g.add_argument("--no-sensitivity", action="store_true",
                   help="skip the SSD-bandwidth and host-memory sweeps (G10 figures 16 and 18)")
    g.add_argument("--g10-plot", default="bench-out/plan-g10.png",
                   help="PNG like G10's figures 11 and 15 (default bench-out/plan-g10.png)")
    r = p.add_argument_group("run time (policy='planned' on this CPU)")
    r.add_argument("--runtime", action="store_true",
                   help="also time training steps under policy='planned' against 'scheduled', 'all' and no "
                        "offload at the same budget")
    r.add_argument("--runtime-only", action="store_true", help="the run-time part only (implies --runtime)")
    r.add_argument("--rounds", type=int, default=21,
                   help="timed rounds of the run-time part (default 21: steps of 20-250 ms on a shared machine "
                        "need that many for a stable median)")
    r.add_argument("--budget-fraction", type=float, default=0.5,
                   help="run-time budget as a fraction of no offload's saved-tensor peak (default 0.5)")
    r.add_argument("--full", action="store_true", help="run-time part on benchmarks offload's full-size models "
                                                      "(default: its --quick ones)")
    r.add_argument("--min-size", type=int, default=256 << 10,
                   help="run time: bytes below which saved tensors stay (default 256K)")
    r.add_argument("--dir", default=None, help="run time: spill directory (default: a temporary one under .)")


def _cmd(args: argparse.Namespace) -> int:
    if not args.no_g10 and not args.runtime_only:
        from . import plan_g10

        names = [n.strip() for n in args.g10_workloads.split(",")] if args.g10_workloads else None
        g10 = plan_g10.run(names=names, sensitivity=not args.no_sensitivity, progress=progress)
        print(plan_g10.format_report(g10))
        if args.json:
            path = Path(args.json)
            write_json(g10, path.with_name(path.stem + "-g10.json"), what="raw results on G10's traces")
        if not args.no_plot:
            plot_or_say(plan_g10.plot, g10, args.g10_plot)
        if args.g10_only:
            return 0
        print("\nsmall models recorded on this CPU:")
    if not args.runtime_only:
        _cmd_simulated(args)
    if args.runtime or args.runtime_only:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pft-bench-plan-", dir=args.dir or ".") as d:
            rt = run_runtime(d, quick=not args.full, rounds=args.rounds, budget_fraction=args.budget_fraction,
                             min_size=args.min_size)
        print(format_runtime(rt))
        if args.json:  # beside the simulated results, or in their place with --runtime-only
            path = Path(args.json)
            if not args.runtime_only:
                path = path.with_name(path.stem + "-runtime.json")
            write_json(rt, path, what="raw run-time results")
    return 0


def _cmd_simulated(args: argparse.Namespace) -> int:
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    result = run(models, args.batches, args.demands, layers=args.layers, width=args.width,
                 speedup=args.speedup, traces_dir=args.traces)
    return finish(result, args, format_report, plot)


# -- the run-time half: policy="planned" on this machine's CPU ------------------------------------

#: Targets for the run-time policy, at a budget of half the saved-tensor peak.
PLANNED_OVER_SCHEDULED = 1.0
PLANNED_OVER_NONE = 1.10
RUNTIME_ROWS = ("none", "all", "scheduled", "planned")


def run_runtime(directory: str | os.PathLike[str], *, quick: bool = True, rounds: int = 21, warmup: int = 2,
                budget_fraction: float = 0.5, min_size: int = 256 << 10,
                models: list[tuple[Any, int]] | None = None) -> dict[str, Any]:
    """Time training steps under ``policy="planned"`` against ``"scheduled"``, ``"all"`` and no offload.

    Every offload row gets the same budget, ``budget_fraction`` of no
    offload's resident saved-tensor peak; ``scheduled`` is FlashNeuron's
    selection as ``benchmarks offload`` runs it (with the lossless ``sparse``
    codec). Each row first runs ``warmup`` steps (the first is the profiling
    step of ``scheduled`` and ``planned``); then ``rounds`` rounds of one
    step per row, so that a disturbance of the shared machine lands on every
    row of a round alike. Ratios are taken per round (a row's step over the
    same round's ``none`` or ``scheduled`` step) and summarized by their
    median, minimum and maximum.

    Args:
        directory: where the spill files go (nothing is left in it).
        quick: the small models of ``benchmarks offload --quick``.
        rounds: timed rounds.
        warmup: untimed steps per row first.
        budget_fraction: the budget, as a fraction of no offload's peak.
        min_size: saved tensors below this many bytes stay in memory.
        models: workloads and batch sizes (default ``benchmarks offload``'s).

    Returns:
        ``{"settings": ..., "models": {name: {"batch", "budget", "none_peak", "rows": {row: ...}}}}``;
        a row has its step times (ms, per round), the median and spread, the
        resident peak, and the per-round ratios to ``none`` and (for
        ``planned``) to ``scheduled``.
    """
    import torch

    from pyfastensor.offload import Offload

    from .offload import _figures, _peak_at, _train_step, make_context
    from .workloads import train_workloads

    if rounds < 1 or not 0 < budget_fraction:
        raise ValueError(f"rounds must be >= 1 and budget_fraction positive, got {rounds}, {budget_fraction}")
    out: dict[str, Any] = {"settings": {"quick": quick, "rounds": rounds, "warmup": warmup,
                                        "budget_fraction": budget_fraction, "min_size": min_size},
                           "models": {}}
    for w, batch in models or train_workloads(quick):
        none_peak = _peak_at(w, batch, str(directory), min_size, None)
        budget = max(1, int(none_peak * budget_fraction))
        ctxs = {row: make_context(row, w, str(directory), min_size, budget) for row in RUNTIME_ROWS}
        opt = torch.optim.SGD(w.model.parameters(), lr=1e-4)
        x, y = w.batch(batch)
        for ctx in ctxs.values():
            for _ in range(warmup):
                _train_step(w.model, opt, x, y, ctx)
        times: dict[str, list[float]] = {row: [] for row in RUNTIME_ROWS}
        peaks: dict[str, int] = dict.fromkeys(RUNTIME_ROWS, 0)
        for _ in range(rounds):
            for row, ctx in ctxs.items():
                times[row].append(_train_step(w.model, opt, x, y, ctx) * 1e3)
                peaks[row] = max(peaks[row], int(_figures(ctx, none_peak)["peak_bytes"]))
        rows: dict[str, Any] = {}
        for row in RUNTIME_ROWS:
            t = times[row]
            r: dict[str, Any] = {"step_ms": t, **spread(t), "peak_bytes": peaks[row],
                                 "x_none": spread(paired_ratios(times["none"], t))}
            if row == "planned":
                r["x_scheduled"] = spread(paired_ratios(times["scheduled"], t))
                details = ctxs[row].plan_details or {}
                r["tiers"] = {}
                for d in details.get("decisions", []):
                    r["tiers"][d["tier"]] = r["tiers"].get(d["tier"], 0) + d["bytes"]
                s = ctxs[row].summary()
                r["stall_ms"] = s.stall_seconds * 1e3
                r["prefetch_hits"] = s.prefetch_hits
            rows[row] = r
        for ctx in ctxs.values():
            if isinstance(ctx, Offload):
                ctx.close()
        out["models"][w.name] = {"batch": batch, "budget": budget, "none_peak": none_peak, "rows": rows}
    return out


def format_runtime(result: dict[str, Any]) -> str:
    """The run-time table: per model, one line per row, ratios with their spread, and the targets."""
    s = result["settings"]
    lines = [f"bench plan --runtime: step time on this machine's CPU, every offload row at budget = "
             f"{s['budget_fraction']:.0%} of no offload's resident saved-tensor peak; {s['rounds']} rounds "
             f"after {s['warmup']} warm-up steps; median [min-max] over rounds, ratios taken per round"]
    for name, m in result["models"].items():
        rows = m["rows"]
        lines.append(f"\n{name}, batch {m['batch']}: saved-tensor peak without offload {_mib(m['none_peak'])}, "
                     f"budget {_mib(m['budget'])}")
        lines.append(f"  {'row':<10} {'step ms':>22} {'x none':>20} {'peak':>10}")
        for row, r in rows.items():
            x = r["x_none"]
            lines.append(f"  {row:<10} {r['median']:>8.1f} [{r['min']:>5.1f}-{r['max']:>5.1f}] "
                         f"{x['median']:>6.2f} [{x['min']:.2f}-{x['max']:.2f}] {_mib(r['peak_bytes']):>10}")
        p = rows["planned"]
        xs, xn = p["x_scheduled"], p["x_none"]
        tiers = ", ".join(f"{t} {_mib(b)}" for t, b in sorted(p["tiers"].items())) or "-"
        lines.append(f"  planned: {tiers}; stall {p['stall_ms']:.1f} ms, prefetch hits {p['prefetch_hits']} "
                     f"(last step)")
        lines.append(f"  target: planned <= {PLANNED_OVER_SCHEDULED:.2f}x scheduled: {xs['median']:.2f}x "
                     f"[{xs['min']:.2f}-{xs['max']:.2f}] "
                     f"({'met' if xs['median'] <= PLANNED_OVER_SCHEDULED else 'NOT met'}, median)")
        lines.append(f"  target: planned <= {PLANNED_OVER_NONE:.2f}x no offload: {xn['median']:.2f}x "
                     f"[{xn['min']:.2f}-{xn['max']:.2f}] "
                     f"({'met' if xn['median'] <= PLANNED_OVER_NONE else 'NOT met'}, median)")
        over = p["peak_bytes"] > m["budget"]
        lines.append(f"  planned resident peak {_mib(p['peak_bytes'])} "
                     f"{'ABOVE' if over else 'within'} the budget {_mib(m['budget'])}")
    lines.append("\nno offload always fits here: on the CPU, device memory is host memory, unbounded by the budget")
    return "\n".join(lines)

"""G10's own A100 traces against G10's published results: the first section of ``python -m benchmarks plan``.

The G10 authors published their simulator's traces of real A100 training
iterations and its results (the G10 paper's figures 11 and 15); 25 of those
workloads, converted to pyfastensor's trace schema, are in
``benchmarks/g10-traces/`` with their provenance and licence. For each,
under the artifact's hardware (:meth:`pyfastensor.plan.Hardware.g10_artifact`:
40 GiB GPU, 128 GiB host, SSD 3.2 GB/s, PCIe 15.754 GB/s), this simulates
the ``g10``, ``flashneuron`` and ``on_demand`` policies and prints each
fraction of ideal (ideal time over the policy's) beside G10's published
``prefetch_lru`` (its full design), the bound (the most any policy could
reach over the links, host memory's capacity counted,
:func:`pyfastensor.plan.bound_ns`) and the time and peak
memory ``make_plan`` took. Targets: at least G10's figure on every
workload, and half-way from it to the bound where G10's is below the bound.

Then the sensitivity of g10 to the SSD's bandwidth and to the host memory's
size (the G10 paper's figures 16 and 18) on figure 11's five workloads,
our figures only (the paper's are not in the published results).

What differs from G10's simulator: ours moves whole tensors, not pages
(one transfer at a time per link direction, the one needed soonest first),
and models no page faults; the traces carry no per-transfer PCIe latency
(5 us) nor G10's 45 us system latency per fault.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import time
from pathlib import Path
from typing import Any

from pyfastensor import plan

from .harness import save_figure

#: The traces and G10's published results (Apache 2.0, see README.md and LICENSE-G10 there).
TRACES = Path(__file__).resolve().parent / "g10-traces"
#: The policies simulated beside g10's plan.
POLICIES = ("g10", "flashneuron", "on_demand")
#: The G10 paper's figure 11 workloads (the sensitivity runs use them).
FIGURE11 = ("BERT_Base/256", "VIT/1280", "Inceptionv3/1536", "ResNet152/1280", "SENet154/1024")
#: SSD bandwidths of the sensitivity run (figure 16), bytes/s: the artifact's 3.2 GB/s and around it.
SSD_BPS = (1.6e9, 3.2e9, 6.4e9, 12.8e9)
#: Host memory sizes of the sensitivity run (figure 18), bytes.
HOST_BYTES = (0, 32 << 30, 64 << 30, 128 << 30, 256 << 30)


def published(root: Path = TRACES) -> dict[str, dict[str, Any]]:
    """G10's published results per workload (figures 15 and 11 merged), cycles per iteration."""
    doc = json.loads((root / "published.json").read_text())
    out: dict[str, dict[str, Any]] = {}
    for fig in ("figure15_overall_batchsize", "figure11_overall_performance"):
        for name, row in doc[fig]["data"].items():
            out.setdefault(name, {}).update({k: v for k, v in row.items() if v is not None})
    return out


def workloads(root: Path = TRACES) -> list[str]:
    """The workloads with a trace and a published ``prefetch_lru``, by model then batch."""
    pub = published(root)
    names = [n for n, r in pub.items() if "prefetch_lru" in r and trace_path(n, root).exists()]
    return sorted(names, key=lambda n: (n.split("/")[0], int(n.split("/")[1])))


def trace_path(name: str, root: Path = TRACES) -> Path:
    """``BERT_Base/256`` -> ``<root>/traces/BERT_Base-256.json.gz``."""
    model, batch = name.split("/")
    return root / "traces" / f"{model}-{batch}.json.gz"


def _one(name: str, root: str, policies: tuple[str, ...]) -> dict[str, Any]:
    """One workload, in a worker process of its own (so its peak memory is its own)."""
    tr = plan.Trace.load(trace_path(name, Path(root)))
    hw = plan.Hardware.g10_artifact()
    t0 = time.perf_counter()
    plan.make_plan(tr, hw)
    plan_s = time.perf_counter() - t0
    row: dict[str, Any] = {"workload": name, "plan_s": plan_s, "ideal_ns": tr.total_ns}
    for p in policies:
        r = plan.simulate(tr, hw, p)
        row[p] = r.throughput if r.feasible else None
    b = plan.bound_ns(tr, hw)
    row["bound"] = tr.total_ns / b if b else None
    row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return row


def _sensitivity(name: str, root: str) -> dict[str, Any]:
    tr = plan.Trace.load(trace_path(name, Path(root)))
    base = plan.Hardware.g10_artifact()
    ssd = {str(bps): plan.simulate(tr, base.replace(ssd_read_bps=bps, ssd_write_bps=bps), "g10").throughput
           for bps in SSD_BPS}
    host = {str(h): plan.simulate(tr, base.replace(host_bytes=h), "g10").throughput for h in HOST_BYTES}
    return {"workload": name, "ssd": ssd, "host": host}


def run(root: Path = TRACES, *, names: list[str] | None = None, sensitivity: bool = True,
        jobs: int | None = None, progress: Any = None) -> dict[str, Any]:
    """Simulate every workload (or ``names``) and, with ``sensitivity``, the figure-16/18 sweeps.

    Returns:
        ``{"hardware", "rows": [{"workload", "g10", "flashneuron", "on_demand", "bound",
        "published", "target", "met", "plan_s", "peak_rss_bytes"}], "sensitivity": [...], "targets"}``.
    """
    pub = published(root)
    names = names or workloads(root)
    jobs = jobs or min(2, os.cpu_count() or 1)
    rows = []
    # One process per workload: its peak memory is the workload's, and nothing grows across them.
    with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=1) as ex:
        futures = [ex.apply_async(_one, (n, str(root), POLICIES)) for n in names]
        for f in futures:
            row = f.get()
            p = pub[row["workload"]]
            row["published"] = p["ideal"] / p["prefetch_lru"]
            bound = row["bound"] or 1.0
            row["target"] = row["published"] if row["published"] >= bound - 1e-9 else (row["published"] + bound) / 2
            row["met"] = row["g10"] is not None and row["g10"] >= row["published"] - 1e-9
            row["met_halfway"] = row["g10"] is not None and row["g10"] >= row["target"] - 1e-9
            rows.append(row)
            if progress:
                progress(f"g10 traces: {row['workload']} {row['g10']:.3f} of ideal (G10 {row['published']:.3f})")
        sens = []
        if sensitivity:
            fig11 = [n for n in FIGURE11 if n in names]
            sens = ex.starmap(_sensitivity, [(n, str(root)) for n in fig11])
    fig11 = [r for r in rows if r["workload"] in FIGURE11]
    means = {k: sum(r[k] or 0 for r in fig11) / len(fig11) for k in ("g10", "published")} if fig11 else None
    return {"hardware": plan.Hardware.g10_artifact().to_dict(), "rows": rows, "sensitivity": sens,
            "figure11_mean": means,
            "met": sum(r["met"] for r in rows), "met_halfway": sum(r["met_halfway"] for r in rows)}


def format_report(result: dict[str, Any]) -> str:
    """The per-workload table, the figure-11 means, the targets and the sensitivity tables."""
    hw = result["hardware"]
    lines = [f"G10's own A100 traces (benchmarks/g10-traces), hardware g10_artifact: GPU {hw['device_bytes'] >> 30} GiB, "
             f"host {hw['host_bytes'] >> 30} GiB, SSD {hw['ssd_read_bps'] / 1e9:.1f} GB/s, PCIe "
             f"{hw['host_link_bps'] / 1e9:.3f} GB/s; fraction of ideal (ideal time / policy's time)",
             f"{'workload':<18}{'g10':>7}{'G10 pub.':>9}{'bound':>7}{'target':>8}{'flashn.':>8}{'on_dem.':>8}"
             f"{'plan s':>8}{'peak MiB':>9}  met"]
    for r in result["rows"]:
        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"
        mark = "yes" if r["met_halfway"] else ("G10 only" if r["met"] else "NO")
        lines.append(f"{r['workload']:<18}{f(r['g10']):>7}{f(r['published']):>9}{f(r['bound']):>7}"
                     f"{f(r['target']):>8}{f(r['flashneuron']):>8}{f(r['on_demand']):>8}"
                     f"{r['plan_s']:>8.2f}{r['peak_rss_bytes'] / 2**20:>9.0f}  {mark}")
    n = len(result["rows"])
    m = result["figure11_mean"]
    if m:
        lines.append(f"figure 11's five workloads, mean: g10 {m['g10']:.3f}, G10 published {m['published']:.3f}")
    lines.append(f"targets: g10 >= G10's published prefetch_lru on {result['met']} of {n}; half-way from it to "
                 f"the bound where it is below ('target'): {result['met_halfway']} of {n}")
    if result["sensitivity"]:
        lines.append("\nsensitivity of g10 (fraction of ideal) to the SSD's bandwidth (G10 figure 16):")
        lines.append(f"{'workload':<18}" + "".join(f"{b / 1e9:>8.1f}" for b in SSD_BPS) + "  GB/s")
        for s in result["sensitivity"]:
            lines.append(f"{s['workload']:<18}" + "".join(f"{s['ssd'][str(b)]:>8.3f}" for b in SSD_BPS))
        lines.append("to the host memory's size (G10 figure 18):")
        lines.append(f"{'workload':<18}" + "".join(f"{h >> 30:>8}" for h in HOST_BYTES) + "  GiB")
        for s in result["sensitivity"]:
            lines.append(f"{s['workload']:<18}" + "".join(f"{s['host'][str(h)]:>8.3f}" for h in HOST_BYTES))
    return "\n".join(lines)


#: Short model names for the plot's axis.
_SHORT = {"BERT_Base": "BERT", "Inceptionv3": "Incep-v3", "ResNet152": "RN-152", "SENet154": "SE-154", "VIT": "ViT"}


def _short(workload: str) -> str:
    model, batch = workload.split("/")
    return f"{_SHORT.get(model, model)}/{batch}"


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Bars per workload like the G10 paper's figures 11 and 15: ours, G10's published, baselines, bound.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["rows"]
    fig = Figure(figsize=(max(8.0, 0.55 * len(rows)), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    series = [("g10", "pyfastensor g10", "tab:blue"), ("published", "G10 published (prefetch_lru)", "tab:orange"),
              ("flashneuron", "FlashNeuron", "tab:gray"), ("on_demand", "on demand", "tab:olive")]
    width = 0.8 / len(series)
    for k, (key, label, color) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r[key] or 0.0 for r in rows], width, color=color, label=label)
    ax.scatter(range(len(rows)), [r["bound"] or 0.0 for r in rows], marker="_", s=200, color="black",
               label="bound", zorder=3)
    ax.set_xticks(range(len(rows)), [_short(r["workload"]).replace("/", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("fraction of ideal throughput")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.set_title("python -m benchmarks plan: G10's A100 traces, hardware g10_artifact", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)

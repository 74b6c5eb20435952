"""``python -m benchmarks offload --device cuda``: activation offload of CUDA tensors against its peers and the bound.

One GPT-like model (blocks of LayerNorm, causal SDPA attention and a GELU
MLP; bf16 autocast; SGD) trained on one GPU, one row per way of handling
the saved tensors:

- ``none``: no offload; ``checkpoint``: ``torch.utils.checkpoint`` per block;
- ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``;
- ``trl``: TRL's ``OffloadActivations()`` (pinned memory, a side stream, a
  forward stash), or "not installed";
- ``pft-host`` / ``pft-ssd``: pyfastensor, ``policy="all"``, ``tier="host"`` / ``"ssd"``,
  otherwise its defaults (``pft-host`` with its default forward stash);
- ``scheduled`` / ``planned``: pyfastensor's policies with a budget of half
  no offload's extra peak, over pinned host memory as the rows above
  (``scheduled`` with ``tier="host"``, ``planned`` with ``tier="auto"``:
  its host tier); ``pft-ssd`` is the row that goes to the disk.

Beside them, the bound of each offload row (:func:`bound`): ``max(forward,
B/D2H, S/W) + max(backward, B/H2D, S/R)``, with B the bytes the row moved
(pyfastensor's summary; for the peers, pft-host's), S those of them that
went to the disk, forward and backward timed in the ``none`` row, D2H/H2D
the bandwidths of one pinned copy and W/R the disk's write and read
bandwidths, measured in the same run. The bound counts B each way: the
bytes pft-host's forward stash serves are not copied back (reported
under the table), so it may come in under its bound; the casts of the
weights autocast saves are not moved at all (``recast``, reported there
too), so B leaves them out. Step: median over the
timed steps after warm-up (pyfastensor's first step sizes its pinned pool
and, for the policies, profiles); a row whose first step takes over
:data:`SLOW_STEP_S` (the disk's, seconds a step) warms up for 2 steps and
times :data:`SLOW_STEPS`; extra peak: ``max_memory_allocated`` over
the step minus what was allocated before it (model, optimizer state).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from . import harness

#: The model of the full run (fits one 80 GB H100), and of ``--quick``.
GPT_FULL = {"layers": 6, "d": 2048, "heads": 16, "batch": 4, "seq": 2048}
GPT_QUICK = {"layers": 2, "d": 512, "heads": 8, "batch": 2, "seq": 512}

ROWS = ("none", "checkpoint", "save_on_cpu", "trl", "pft-host", "pft-ssd", "scheduled", "planned")
OFFLOAD_ROWS = ("save_on_cpu", "trl", "pft-host", "pft-ssd", "scheduled", "planned")
#: A row whose first step takes longer (seconds) is timed over :data:`SLOW_STEPS` steps
#: after 2 of warm-up: its median is as steady, and the run stays within its minutes.
SLOW_STEP_S = 0.5
SLOW_STEPS = 5

#: Targets (pft-host's step against the bound and the peers).
BOUND_RATIO = 1.25
SAVE_ON_CPU_SPEEDUP = 1.5


def gpt(layers: int, d: int, heads: int, **_: Any) -> Any:
    """The GPT-like model: ``layers`` blocks of width ``d`` (no embedding or head: the input is a
    ``(batch, seq, d)`` activation); ``model(x, checkpoint=True)`` checkpoints each block."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, x: torch.Tensor, checkpoint: bool = False) -> torch.Tensor:
            for blk in self.blocks:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False) if checkpoint else blk(x)
            return self.ln(x)

    return GPT()


def trl_offload() -> Any:
    """TRL's ``OffloadActivations()`` with its defaults, or None when TRL is not installed."""
    try:
        from trl.models.activation_offloading import OffloadActivations
    except ImportError:
        return None
    return OffloadActivations()


def link_bandwidth(nbytes: int, repeat: int = 5) -> tuple[float, float]:
    """Bytes/s of one pinned device-to-host and one host-to-device copy of ``nbytes`` (best of ``repeat``)."""
    import torch

    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = [0.0, 0.0]
    for _ in range(repeat):
        for i, (dst, src) in enumerate(((host, dev), (dev, host))):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best[i] = max(best[i], nbytes / (time.perf_counter() - t))
    return best[0], best[1]


def make_context(row: str, model: Any, directory: str, budget: int, min_size: int) -> Any:
    """The saved-tensor context of a row (None: not available here)."""
    import torch

    from pyfastensor.offload import Offload

    if row in ("none", "checkpoint"):
        return contextlib.nullcontext()
    if row == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    if row == "trl":
        return trl_offload()
    if row == "pft-host":
        return Offload(tier="host", min_size=min_size, module=model)
    if row == "pft-ssd":
        return Offload(tier="ssd", spill_dir=directory, min_size=min_size, module=model)
    if row == "scheduled":
        return Offload(policy="scheduled", tier="host", budget=budget, spill_dir=directory, min_size=min_size,
                       module=model)
    return Offload(policy="planned", tier="auto", budget=budget, spill_dir=directory, min_size=min_size, module=model)


def _step(model: Any, opt: Any, x: Any, ctx: Any, checkpoint: bool, marks: list[Any] | None = None) -> tuple[float, int]:
    """One training step: seconds and extra peak bytes. ``marks`` gets start/forward/end events."""
    import torch

    opt.zero_grad(set_to_none=True)  # before the baseline: the last step's gradients are not this step's
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    start = time.perf_counter()
    ev[0].record()
    with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, checkpoint).float().pow(2).mean()
        ev[1].record()
        loss.backward()
    opt.step()
    ev[2].record()
    torch.cuda.synchronize()
    if marks is not None:
        marks.append(ev)
    return time.perf_counter() - start, torch.cuda.max_memory_allocated() - base


def run(directory: str, *, quick: bool = False, steps: int | None = None, warmup: int = 3,
        min_size: int = 1 << 20, disk_limit: Any = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the CUDA table; return ``{"model", "rows": {row: {...}}, "bound": {...}}`` (see the module docstring)."""
    import torch

    shape = GPT_QUICK if quick else GPT_FULL
    steps = steps or (3 if quick else 10)
    torch.manual_seed(0)
    model = gpt(**shape).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(shape["batch"], shape["seq"], shape["d"], device="cuda")
    d2h, h2d = link_bandwidth((64 if quick else 512) << 20)
    marks: list[Any] = []
    for _ in range(warmup):
        _step(model, opt, x, contextlib.nullcontext(), False)
    none_peak = max(_step(model, opt, x, contextlib.nullcontext(), False, marks)[1] for _ in range(steps))
    fwd = statistics.median(a.elapsed_time(b) for a, b, _ in marks) / 1e3
    bwd = statistics.median(b.elapsed_time(c) for _, b, c in marks) / 1e3
    rows: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        if progress:
            progress(f"gpt {shape}: {row}")
        try:
            rows[row] = _row(row, model, opt, x, directory, none_peak // 2, min_size, steps, warmup)
        except Exception as e:  # reported in its row; the other rows still run
            rows[row] = {"missing": f"failed: {type(e).__name__}: {e}"}
            torch.cuda.synchronize()
    moved = rows.get("pft-host", {}).get("bytes", 0)
    disk_w = disk_r = None
    if disk_limit is not None:
        disk_w, disk_r = disk_limit.write_mbps * 1e6, disk_limit.read_mbps * 1e6
    for row in OFFLOAD_ROWS:
        r = rows[row]
        if "step_s" not in r:
            continue
        nbytes = r.get("bytes", moved)
        r["bound_s"] = bound(fwd, bwd, nbytes, r.get("ssd_bytes", 0), (d2h, h2d),
                             (disk_w, disk_r) if disk_w and disk_r else None,
                             back=nbytes - r.get("stash_bytes", 0))
        r["bound_ratio"] = r["step_s"] / r["bound_s"]
    return {"model": shape, "rows": rows, "bound": {"forward_s": fwd, "backward_s": bwd, "d2h_bps": d2h,
                                                    "h2d_bps": h2d, "bytes": moved, "disk_write_bps": disk_w,
                                                    "disk_read_bps": disk_r}}


def _row(row: str, model: Any, opt: Any, x: Any, directory: str, budget: int, min_size: int, steps: int,
         warmup: int) -> dict[str, Any]:
    """One row's figures: its step's median seconds and extra peak, and an offload's summary."""
    from pyfastensor.offload import Offload

    ctx = make_context(row, model, directory, budget, min_size)
    if ctx is None:
        return {"missing": "not installed"}
    ck = row == "checkpoint"
    try:
        slow = _step(model, opt, x, ctx, ck)[0] > SLOW_STEP_S
        for _ in range((min(warmup, 2) if slow else warmup) - 1):
            _step(model, opt, x, ctx, ck)
        got = [_step(model, opt, x, ctx, ck) for _ in range(min(steps, SLOW_STEPS) if slow else steps)]
        times = [t for t, _ in got]
        r: dict[str, Any] = {"step_s": statistics.median(times), "step_min_s": min(times), "step_max_s": max(times),
                             "peak_bytes": max(p for _, p in got)}
        if isinstance(ctx, Offload):
            s = ctx.summary()
            r["resident_peak"] = s.resident_peak_bytes
            r["budget"] = ctx.budget
            r["bytes"] = sum(s.bytes_offloaded.values())
            r["ssd_bytes"] = s.bytes_offloaded.get("ssd", 0)
            r["pinned_allocations"] = s.pinned_allocations
            r["pinned_bytes"] = s.pinned_bytes
            r["stash_hits"], r["stash_bytes"] = s.stash_hits, s.stash_bytes
            r["recast_tensors"], r["recast_bytes"] = s.recast_tensors, s.recast_bytes
        return r
    finally:
        if isinstance(ctx, Offload):
            ctx.close()


def bound(forward_s: float, backward_s: float, nbytes: int, ssd_bytes: int, link: tuple[float, float],
          disk: tuple[float, float] | None, back: int | None = None) -> float:
    """Seconds a step moving ``nbytes`` over the link (``ssd_bytes`` of them on to the disk) takes at
    least: ``max(forward, B/D2H, S/W) + max(backward, B'/H2D, S/R)``, B' the bytes that come back
    (``back``: B less the forward stash's, used in backward where they are); without ``disk``
    (not measured), the link's alone."""
    up, down = nbytes / link[0], (nbytes if back is None else back) / link[1]
    if disk is not None and ssd_bytes:
        up, down = max(up, ssd_bytes / disk[0]), max(down, ssd_bytes / disk[1])
    return max(forward_s, up) + max(backward_s, down)


def format_report(result: dict[str, Any]) -> str:
    """The table: step, extra peak, the row's bound and the ratio to it; then the targets."""
    GB, rows, bd = 1e9, result["rows"], result["bound"]
    lines = [f"\ngpt {result['model']} (bf16 autocast, SGD), device {_device_name()}",
             f"  bound: forward {bd['forward_s'] * 1e3:.1f} ms, backward {bd['backward_s'] * 1e3:.1f} ms, "
             f"D2H {bd['d2h_bps'] / GB:.1f} GB/s, H2D {bd['h2d_bps'] / GB:.1f} GB/s (pinned copies), "
             f"B {bd['bytes'] / GB:.2f} GB (pft-host's)"
             + (f", disk write {bd['disk_write_bps'] / GB:.2f} GB/s, read {bd['disk_read_bps'] / GB:.2f} GB/s"
                if bd.get("disk_write_bps") else ""),
             f"  {'row':<12}{'step ms':>9}{'extra peak GB':>15}{'bound ms':>10}{'x bound':>9}{'pinned allocs':>15}"]
    for row, r in rows.items():
        if "missing" in r:
            lines.append(f"  {row:<12}{r['missing']:>9}")
            continue
        bound = f"{r['bound_s'] * 1e3:>10.1f}{r['bound_ratio']:>9.2f}" if "bound_s" in r else f"{'-':>10}{'-':>9}"
        allocs = f"{r['pinned_allocations']:>15}" if "pinned_allocations" in r else f"{'-':>15}"
        lines.append(f"  {row:<12}{r['step_s'] * 1e3:>9.1f}{r['peak_bytes'] / GB:>15.2f}{bound}{allocs}")
    host = rows.get("pft-host", {})
    if "stash_bytes" in host:
        lines.append(f"  pft-host's forward stash: {host['stash_hits']} tensors, "
                     f"{host['stash_bytes'] / GB:.2f} GB used in backward without a copy back (not in its "
                     "bound's way back)")
    if host.get("recast_tensors"):
        lines.append(f"  pft-host's recast: {host['recast_tensors']} casts of the weights, "
                     f"{host['recast_bytes'] / GB:.2f} GB, made again in backward instead of moved")
    lines.append("  (the peers' bound is taken at pft-host's B: what they move themselves is not counted)")
    return "\n".join([*lines, "  targets:", *harness.target_lines(evaluate(result))])


def _target(name: str, value: float | None, op: str, limit: float, why: str = "") -> dict[str, Any]:
    met = None if value is None else (value <= limit if op == "<=" else value >= limit)
    return {"target": name, "ratios": [] if value is None else [value], "median": value, "met": met, "why": why}


def evaluate(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's offload targets on this run, each ``{"target", "ratios", "median", "met", "why"}``
    as :func:`benchmarks.gpu.evaluate` gives the checkpoint ones (``met`` None: not measured, or not
    applicable, ``why`` says which)."""
    rows = result["rows"]

    def missing(row: str) -> str:
        return f"{row}: {rows.get(row, {}).get('missing', 'not run')}"

    def unmeasured(*names: str) -> str:
        """Why a target over these rows has no figure: the first of them that did not run, or ""."""
        return next((missing(n) for n in names if "step_s" not in rows.get(n, {})), "")

    host, ssd, soc, trl, ck = (rows.get(r, {}) for r in ("pft-host", "pft-ssd", "save_on_cpu", "trl", "checkpoint"))
    on_soc, on_trl = unmeasured("pft-host", "save_on_cpu"), unmeasured("pft-host", "trl")
    out = [
        _target(f"host offload step <= {BOUND_RATIO}x its bound", host.get("bound_ratio"), "<=", BOUND_RATIO,
                unmeasured("pft-host")),
        _target(f"host offload >= {SAVE_ON_CPU_SPEEDUP}x save_on_cpu's speed",
                None if on_soc else soc["step_s"] / host["step_s"], ">=", SAVE_ON_CPU_SPEEDUP, on_soc),
        _target("host offload at least as fast as TRL's OffloadActivations",
                None if on_trl else trl["step_s"] / host["step_s"], ">=", 1.0, on_trl),
        _target("host offload's extra peak <= TRL's",
                None if on_trl else host["peak_bytes"] / max(trl["peak_bytes"], 1), "<=", 1.0, on_trl),
        _target(f"ssd offload step <= {BOUND_RATIO}x its bound (link and disk)", ssd.get("bound_ratio"), "<=",
                BOUND_RATIO, unmeasured("pft-ssd")),
    ]
    for row in ("scheduled", "planned"):
        r = rows.get(row, {})
        if "step_s" not in r:
            out.append(_target(f"{row}: resident peak within its budget", None, "<=", 1.0, missing(row)))
            continue
        out.append(_target(f"{row}: saved tensors' resident peak within its budget",
                           r["resident_peak"] / max(r["budget"], 1), "<=", 1.0))
        name = f"{row}: no slower than checkpointing where its bound is below checkpointing's step"
        if "step_s" not in ck:
            out.append(_target(name, None, "<=", 1.0, missing("checkpoint")))
        elif r["bound_s"] >= ck["step_s"]:
            out.append(_target(name, None, "<=", 1.0, f"not applicable: its bound is "
                                                      f"{r['bound_s'] / ck['step_s']:.2f}x checkpointing's step"))
        else:
            out.append(_target(name, r["step_s"] / ck["step_s"], "<=", 1.0))
    return out


def _device_name() -> str:
    import torch

    return str(torch.cuda.get_device_name()) if torch.cuda.is_available() else "none"

"""``python -m pyfastensor bench io``: engine bandwidth by block size, beside the disk's own limit.

For every available engine and block size the benchmark writes a new file
(durably: fsync included), reads it cold (page cache dropped) and reads it
again warm, and prints MB/s with the ratio to the disk's sequential
O_DIRECT bandwidth measured in the same run (see :mod:`.disk`). It remakes
the Fastensor paper's tables 2-4 (bandwidth of each transfer tool by tensor
size) on the machine at hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..engines import ENGINES
from ..errors import FastensorError
from . import disk
from ._output import plot_or_say, save_figure, write_json
from .cpu import crc_speed

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Default sweep: powers of 4 from 4 KiB to 1 GiB.
POW4_SIZES = tuple(4 * KiB << (2 * i) for i in range(10))
#: ``--sizes pow2``: powers of 2 from 4 KiB to 1 GiB.
POW2_SIZES = tuple(4 * KiB << i for i in range(19))
#: ``--quick``: small, medium and large blocks.
QUICK_SIZES = (4 * KiB, MiB, 64 * MiB)

#: Engines that cannot write: their files are written by posix, untimed.
READ_ONLY = frozenset({"mmap"})
#: A ratio to the limit at or above this counts as reaching it.
TARGET = 0.90

_FULL = {"total": GiB, "max_seconds": 10.0, "limit_size": GiB}
_QUICK = {"total": 128 * MiB, "max_seconds": 2.0, "limit_size": 512 * MiB}

_DESCRIPTION = """\
Measure the bandwidth of every available I/O engine (posix, direct, uring,
mmap, cufile; unavailable ones are listed with the reason and skipped) for
block sizes from 4 KiB to 1 GiB: a durable write (a new file, every block at
successive offsets through one EngineFile, then fsync; fsync time included),
a cold read (page cache dropped first) and a warm read (the same file read
again at once). Each figure is printed in MB/s (10^6 bytes/s) beside the
disk's own limit and as a ratio to it; the summary gives each engine's best
block size and whether it reaches 90% of the limit.

The limit is the disk's sequential O_DIRECT bandwidth measured in the same
run: by fio when it is installed (libaio, write bs=64M iodepth=4, read bs=16M
iodepth=16, --limit-size bytes, JSON output parsed), else by the best engine
at 64 MiB blocks, named in the report.

Cold figures: as root, `sync; echo 3 > /proc/sys/vm/drop_caches` runs before
each cold read, which is the honest cold cache; without root only the file's
own pages are dropped (posix_fadvise DONTNEED), so run as root (sudo) for
cold figures you can quote. --no-cold skips cold reads.
"""


@dataclass
class Measurement:
    """One figure of the sweep.

    Attributes:
        engine: the engine asked for.
        op: ``"write"`` or ``"read"``.
        cache: ``"cold"`` or ``"warm"`` for reads, ``""`` for writes.
        block: bytes per call.
        nbytes: bytes moved.
        seconds: wall time (fsync included for writes).
        mbps: MB/s (10^6 bytes/s).
        served_by: the engine that actually served the transfers.
        fallback: why another engine served them, or "".
        runs: MB/s of every run when repeated (the figure is the best).
    """

    engine: str
    op: str
    cache: str
    block: int
    nbytes: int
    seconds: float
    mbps: float
    served_by: str
    fallback: str
    runs: list[float]


def parse_sizes(text: str) -> list[int]:
    """Parse ``--sizes``: ``pow4``, ``pow2`` or a comma list such as ``4K,1M,64M``.

    Raises:
        ValueError: on a malformed or non-positive size.
    """
    key = text.strip().lower()
    if key == "pow4":
        return list(POW4_SIZES)
    if key == "pow2":
        return list(POW2_SIZES)
    sizes = [config.parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"--sizes {text!r}: expected pow4, pow2 or positive sizes like 4K,1M,64M")
    return sorted(set(sizes))


def size_label(n: int) -> str:
    """Format a byte count compactly: ``4K``, ``64M``, ``1G``, ``1536``."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def engine_availability(directory: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Ask :func:`pyfastensor.info` which engines work on ``directory``'s filesystem.

    Returns:
        ``(engines, dir_info)``: every engine of
        :data:`pyfastensor.engines.ENGINES` with ``available`` and ``reason``
        (engines this build of the library lacks are unavailable, saying so),
        and the directory probe.
    """
    from ..info import info

    r = info(directory)
    known = r["engines"]
    out: dict[str, dict[str, Any]] = {}
    for name in ENGINES:
        e = known.get(name)
        if e is None:
            out[name] = {"available": False, "reason": "not in this build of the native library"}
        else:
            out[name] = {"available": bool(e["available"]), "reason": e.get("reason", "")}
    return out, r.get("dir") or {}


def _buffer(engine: str, nbytes: int, host: Any) -> Any:
    """The memory an engine moves: the shared host buffer, or a CUDA copy for cufile."""
    if engine != "cufile":
        return host
    import torch  # cufile moves device memory; its probe passing implies CUDA

    return torch.from_numpy(host[:nbytes]).to("cuda")


def run_sweep(
    directory: str | os.PathLike[str],
    *,
    engines: Sequence[str] | None = None,
    sizes: Sequence[int] = POW4_SIZES,
    total: int = GiB,
    max_seconds: float | None = 10.0,
    cold: bool = True,
    use_fio: bool = True,
    limit_size: int = GiB,
    repeat: int = 1,
    buffer_offset: int = 0,
    threads: int | None = None,
    task_size: int | None = None,
    queue_depth: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the I/O benchmark in ``directory`` and return its results.

    Every file is created in a fresh temporary directory inside
    ``directory`` and removed, whatever happens: nothing is left behind.

    Args:
        directory: a directory on the filesystem under test.
        engines: engines to measure; None means every available one.
            Unavailable engines named here are reported and skipped.
        sizes: block sizes in bytes. Default powers of 4 from 4 KiB to 1 GiB.
        total: bytes per measurement (at least one block). Default 1 GiB.
        max_seconds: stop a measurement after this long (small blocks on
            slow paths); None for no limit. Default 10.
        cold: measure cold reads (page cache dropped). Default True.
        use_fio: measure the limit with fio when installed. Default True.
        limit_size: bytes per direction for the limit. Default 1 GiB.
        repeat: runs of every figure and of the limit; the best counts. Default 1.
        buffer_offset: start the memory this many bytes past a 4096-byte
            boundary (64 is where torch's large CPU tensors start) to measure
            the direct engines' bounce-buffer path. Default 0 (aligned).
        threads, task_size, queue_depth: engine options; None means the
            ``PYFASTENSOR_*`` settings.
        progress: called with a line after each figure, or None.

    Returns:
        A JSON-ready dict: ``settings``, ``dir``, ``engines`` (availability of
        all five), ``measured``, ``skipped``, ``limit``, ``results`` (one
        :class:`Measurement` dict per figure), ``summary`` and
        ``elapsed_seconds``.

    Raises:
        ValueError: for an unknown engine name or empty sizes.
    """
    if not sizes:
        raise ValueError("no block sizes to measure")
    t0 = time.perf_counter()
    avail, dir_info = engine_availability(directory)
    asked = list(ENGINES) if engines is None else list(engines)
    unknown = [e for e in asked if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {', '.join(unknown)}: expected some of {', '.join(ENGINES)}")
    measured = [e for e in asked if avail[e]["available"]]
    skipped = {e: avail[e]["reason"] for e in asked if not avail[e]["available"]}
    say = progress or (lambda _line: None)

    if not 0 <= buffer_offset < 4096:
        raise ValueError(f"buffer offset {buffer_offset}: expected 0 to 4095 bytes")
    nbytes = max(max(sizes), disk.ENGINE_LIMIT_BLOCK)
    host = disk.aligned_buffer(nbytes + buffer_offset)[buffer_offset:]
    disk.fill_random(host)
    opts = {"threads": threads, "task_size": task_size, "queue_depth": queue_depth}
    results: list[Measurement] = []
    work = tempfile.mkdtemp(prefix=".pyfastensor-bench-io-", dir=directory)
    try:
        say("measuring the disk limit ...")
        limit = disk.measure_limit(work, engines=measured or ["posix"], size=limit_size,
                                   use_fio=use_fio, buf=None if buffer_offset else host,
                                   repeat=repeat)
        say(limit.describe())
        for block in sizes:
            for name in measured:
                buf = _buffer(name, block, host)
                path = os.path.join(work, f"{name}-{block}.bin")
                results += _measure(name, path, buf, block, total, max_seconds, cold, repeat,
                                    opts, say)
                os.remove(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    settings = {
        "sizes": list(sizes), "total": total, "max_seconds": max_seconds,
        "threads": threads or config.threads() or max(os.cpu_count() or 1, 2),
        "task_size": task_size or config.task_size() or 8 * MiB,
        "queue_depth": queue_depth or config.queue_depth() or 32,
        "cold": cold, "cold_method": disk.cold_cache_method() if cold else None,
        "limit_size": limit_size, "repeat": repeat, "buffer_offset": buffer_offset,
        "target": TARGET,
    }
    rows = [asdict(m) for m in results]
    return {
        "settings": settings,
        "dir": {**dir_info, "dir": os.path.abspath(directory)},
        "engines": avail,
        "measured": measured,
        "skipped": skipped,
        "limit": asdict(limit),
        "results": rows,
        "summary": summarize(rows, measured, asdict(limit)),
        "crc_mbps": crc_speeds(sizes),
        "elapsed_seconds": time.perf_counter() - t0,
    }


def crc_speeds(sizes: Sequence[int], millis: int = 100) -> dict[int, float]:
    """MB/s of the CRC-32 every transfer sums, on one core, over a block of each size
    (summed again and again: from 4 KiB to the CPU's cache size, the cost of summing
    bytes as they move; beyond it, of a pass over memory)."""
    return {b: crc_speed(min(b, 512 * MiB), millis) / 1e6 for b in sizes}


def _measure(
    name: str, path: str, buf: Any, block: int, total: int, max_seconds: float | None,
    cold: bool, repeat: int, opts: dict[str, Any], say: Callable[[str], None],
) -> list[Measurement]:
    """Write, cold read and warm read of one file by one engine at one block size.

    Each figure is run ``repeat`` times and the best kept: a write rewrites
    the file, a cold read drops the cache again, a warm read reads again.
    """
    out: list[Measurement] = []
    kw = {"block": block, "total": total, "max_seconds": max_seconds, **opts}

    def run(op: str, cache: str, engine: str) -> None:
        setup = op == "write" and name in READ_ONLY  # posix writes the file for the reads
        passes = []
        for _ in range(1 if setup else max(1, repeat)):
            if op == "write":
                os.sync()  # earlier dirty pages must not be flushed during this write
            elif cache == "cold":
                disk.drop_caches([path])
            passes.append(disk.timed_pass(path, buf, engine=engine, write=op == "write", **kw))
        if setup:
            return  # not a figure
        p = max(passes, key=lambda x: x.mbps)
        m = Measurement(name, op, cache, block, p.nbytes, p.seconds, p.mbps, p.engine,
                        p.fallback, [x.mbps for x in passes])
        out.append(m)
        say(f"{name:<7} {size_label(block):>5} {op + (' ' + cache if cache else ''):<10} "
            f"{m.mbps:9.1f} MB/s  ({m.nbytes / MiB:.0f} MiB in {m.seconds:.2f} s)")

    run("write", "", "posix" if name in READ_ONLY else name)
    if cold:
        run("read", "cold", name)
    run("read", "warm", name)
    return out


def summarize(rows: Sequence[dict[str, Any]], engines: Sequence[str], limit: dict[str, Any]) -> dict[str, Any]:
    """Each engine's best block size per kind of figure, its ratio to the limit and the 90% verdict.

    Args:
        rows: measurements as dicts (``run_sweep``'s ``results``).
        engines: engines in report order.
        limit: the :class:`~.disk.DiskLimit` as a dict.

    Returns:
        ``{engine: {"write" | "read_cold" | "read_warm": {"block", "mbps",
        "ratio", "meets_target"} or None}}``.
    """
    lim = {"write": limit["write_mbps"], "read": limit["read_mbps"]}
    out: dict[str, Any] = {}
    for name in engines:
        entry: dict[str, Any] = {}
        for key, op, cache in (("write", "write", ""), ("read_cold", "read", "cold"),
                               ("read_warm", "read", "warm")):
            mine = [r for r in rows if r["engine"] == name and r["op"] == op and r["cache"] == cache]
            if not mine:
                entry[key] = None
                continue
            best = max(mine, key=lambda r: r["mbps"])
            ratio = best["mbps"] / lim[op] if lim[op] > 0 else 0.0
            entry[key] = {"block": best["block"], "mbps": best["mbps"], "ratio": ratio,
                          "meets_target": ratio >= TARGET}
        out[name] = entry
    return out


def format_report(result: dict[str, Any]) -> str:
    """Render ``run_sweep``'s result as the printed report: header, tables, summary."""
    s, lim, rows = result["settings"], result["limit"], result["results"]
    d = result["dir"]
    sizes = s["sizes"]
    measured = result["measured"]
    lines = [
        f"pyfastensor bench io: {d['dir']} ({d.get('fs_type', '?')}"
        + (f", O_DIRECT align {d.get('dio_offset_align')}" if d.get("o_direct") else ", no O_DIRECT")
        + f"); threads {s['threads']}, task {size_label(s['task_size'])}, "
        f"queue depth {s['queue_depth']}",
        f"per figure: {size_label(s['total'])} or one block, whichever is larger"
        + (f", stopped after {s['max_seconds']:g} s" if s["max_seconds"] else "")
        + "; MB/s = 10^6 bytes/s; ratio = figure / disk limit",
        "write: a new file, each block at successive offsets through one EngineFile, then fsync "
        "(durable; fsync time included)",
        "cold read: " + (s["cold_method"] or "skipped (--no-cold)"),
        "warm read: the same file read again at once (page cache; may exceed the disk)",
        "memory: " + (f"{s['buffer_offset']} bytes past a 4096-byte boundary (direct engines "
                      "bounce)" if s["buffer_offset"] else "4096-aligned numpy buffer (direct "
                      "engines go straight)")
        + (f"; every figure best of {s['repeat']} runs" if s["repeat"] > 1 else ""),
        "engines: " + (", ".join(e + (" (read only)" if e in READ_ONLY else "") for e in measured)
                       or "none available"),
        "crc32, 1 core: the CRC-32 every transfer sums, on one core, over a block of the column's size "
        "(above the cache's size, up to 512 MiB: a pass over memory)",
    ]
    for name, why in result["skipped"].items():
        lines.append(f"  skipped {name}: {why}")
    for fb in sorted({(r["engine"], r["served_by"], r["fallback"]) for r in rows if r["fallback"]}):
        lines.append(f"  note: {fb[0]} was served by {fb[1]}: {fb[2]}")
    lines.append(disk.DiskLimit(**lim).describe())
    lines.append("")

    label_w = 16
    head = f"{'':<{label_w}}" + "".join(f"{size_label(b):>8}" for b in sizes) + f"{'best':>12}{'ratio':>7}"
    by_key = {(r["engine"], r["op"], r["cache"], r["block"]): r["mbps"] for r in rows}
    sections = [("write MB/s (durable)", "write", "", "write"),
                ("read MB/s, cold", "read", "cold", "read"),
                ("read MB/s, warm", "read", "warm", "read")]
    for title, op, cache, lim_key in sections:
        if not s["cold"] and cache == "cold":
            continue
        lines.append(title)
        lines.append(head)
        lim_mbps = lim[f"{lim_key}_mbps"]
        lines.append(f"{'disk limit':<{label_w}}" + " " * 8 * len(sizes) + f"{lim_mbps:>12.0f}{'100%':>7}")
        crc = {int(b): v for b, v in result.get("crc_mbps", {}).items()}
        if crc:
            lines.append(f"{'crc32, 1 core':<{label_w}}" + "".join(
                f"{crc[b]:>8.0f}" if b in crc else f"{'-':>8}" for b in sizes))
        for name in measured:
            if op == "write" and name in READ_ONLY:
                lines.append(f"{name:<{label_w}}" + "".join(f"{'-':>8}" for _ in sizes) + "   read only")
                continue
            cells, best = [], (0.0, 0)
            for b in sizes:
                v = by_key.get((name, op, cache, b))
                cells.append(f"{v:>8.0f}" if v is not None else f"{'-':>8}")
                if v is not None and v > best[0]:
                    best = (v, b)
            ratio = best[0] / lim_mbps if lim_mbps > 0 else 0.0
            best_txt = f"{best[0]:.0f}@{size_label(best[1])}" if best[1] else "-"
            lines.append(f"{name:<{label_w}}" + "".join(cells) + f"{best_txt:>12}{ratio:>7.0%}")
        lines.append("")

    lines.append(f"summary (best block size per engine; target >= {TARGET:.0%} of the disk limit):")
    for name, entry in result["summary"].items():
        parts = []
        for key, label in (("write", "write"), ("read_cold", "cold read")):
            e = entry.get(key)
            if e is None:
                why = "read only" if key == "write" else "not measured (--no-cold)"
                parts.append(f"{label} {why}")
                continue
            verdict = "yes" if e["meets_target"] else "no"
            parts.append(f"{label} {size_label(e['block'])} {e['mbps']:.0f} MB/s = {e['ratio']:.0%} "
                         f"(>= {TARGET:.0%}: {verdict})")
        lines.append(f"  {name:<7} " + "; ".join(parts))
    over = [f"{name} {label} {e['ratio']:.0%}" for name, entry in result["summary"].items()
            for key, label in (("write", "write"), ("read_cold", "cold read"))
            if (e := entry.get(key)) and e["ratio"] > 1.1]
    if over:
        hint = "" if s["repeat"] > 1 else "; --repeat 3 steadies both"
        lines.append(f"note: above the limit ({', '.join(over)}): the disk or the machine was "
                     f"noisy during this run and the limit understates it{hint}")
    lines.append(f"elapsed {result['elapsed_seconds']:.0f} s")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw bandwidth against block size, write and read panels, with the limit, as a PNG.

    One colour per engine; reads cold solid, warm dashed; the disk limit is a
    horizontal black line in each panel. Log-scaled block size and bandwidth.

    Args:
        result: ``run_sweep``'s result.
        path: the PNG to write (its directory is created).

    Returns:
        The path written.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, lim, s = result["results"], result["limit"], result["settings"]
    fig = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    colors = {"posix": "tab:blue", "direct": "tab:orange", "uring": "tab:green",
              "mmap": "tab:purple", "cufile": "tab:red"}
    sizes = s["sizes"]
    for ax, op, title in ((axes[0], "write", "write (new file, fsync included)"),
                          (axes[1], "read", "read")):
        for name in result["measured"]:
            for cache, style in (("", "-"), ("cold", "-"), ("warm", "--")):
                pts = sorted((r["block"], r["mbps"]) for r in rows
                             if r["engine"] == name and r["op"] == op and r["cache"] == cache)
                if not pts:
                    continue
                label = name + (f" {cache}" if cache else "")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                        color=colors.get(name), label=label)
        limit_mbps = lim[f"{op}_mbps"]
        ax.axhline(limit_mbps, color="black", lw=1.2,
                   label=f"disk limit ({lim['source']}) {limit_mbps:.0f}")
        ax.axhline(limit_mbps * TARGET, color="black", lw=0.6, ls=":", label=f"{TARGET:.0%} of limit")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [size_label(b) for b in sizes], rotation=45 if len(sizes) > 10 else 0)
        ax.minorticks_off()
        ax.set_xlabel("block size (bytes per call)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("MB/s (10^6 bytes/s)")
    d = result["dir"]
    fig.suptitle(f"pyfastensor bench io: {d.get('fs_type', '?')} at {d['dir']}, "
                 f"{size_label(s['total'])} per figure, {s['threads']} threads"
                 + (f", best of {s['repeat']}" if s.get("repeat", 1) > 1 else ""))
    return save_figure(fig, path)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``io`` to the ``bench`` subcommands and set its handler."""
    p = sub.add_parser(
        "io", help="engine bandwidth by block size vs the disk's own limit",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", default=None,
                   help="directory on the filesystem to measure (default: a temporary directory "
                        "under the current directory); nothing is left in it")
    p.add_argument("--engines", default=None,
                   help=f"comma list among {', '.join(ENGINES)} (default: every available one)")
    p.add_argument("--sizes", default=None,
                   help="block sizes: pow4 (default, 4K..1G), pow2, or a list like 4K,1M,64M")
    p.add_argument("--total", default=None,
                   help="bytes per figure, at least one block (default 1G; 128M with --quick)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop one figure after this many seconds, for small blocks on slow paths "
                        "(default 10; 2 with --quick; 0: no limit)")
    p.add_argument("--quick", action="store_true",
                   help="4K, 1M and 64M blocks, 128M per figure, 512M for the limit")
    p.add_argument("--no-cold", action="store_true", help="skip cold reads (no cache dropping)")
    p.add_argument("--no-fio", action="store_true",
                   help="measure the limit with the best engine at 64M blocks even if fio is installed")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every figure and the limit this many times and keep the best "
                        "(default 1; use 3 on a busy machine)")
    p.add_argument("--buffer-offset", type=int, default=0, metavar="BYTES",
                   help="place the memory BYTES past a 4096-byte boundary, e.g. 64 as torch's "
                        "large CPU tensors are, to measure the bounce-buffer path (default 0)")
    p.add_argument("--limit-size", default=None,
                   help="bytes per direction for the disk limit (default 1G; 512M with --quick)")
    p.add_argument("--threads", type=int, default=None, help="goroutines per transfer "
                   "(default PYFASTENSOR_THREADS or the CPU count)")
    p.add_argument("--task-size", default=None, help="bytes per parallel piece (default 8M)")
    p.add_argument("--queue-depth", type=int, default=None, help="io_uring requests in flight (default 32)")
    p.add_argument("--plot", default="bench-out/io.png",
                   help="PNG of bandwidth vs block size (default bench-out/io.png; needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--json", default=None, metavar="PATH", help="write the raw results as JSON")
    p.set_defaults(func=_cmd_io)


def _cmd_io(args: argparse.Namespace) -> int:
    base = _QUICK if args.quick else _FULL
    sizes = parse_sizes(args.sizes) if args.sizes else list(QUICK_SIZES if args.quick else POW4_SIZES)
    total = config.parse_size(args.total) if args.total else base["total"]
    limit_size = config.parse_size(args.limit_size) if args.limit_size else base["limit_size"]
    max_seconds = base["max_seconds"] if args.max_seconds is None else (args.max_seconds or None)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    directory = args.dir or "."
    if not os.path.isdir(directory):
        raise ValueError(f"--dir {directory!r} is not a directory")
    live = sys.stderr.isatty() and config.progress_enabled()

    def progress(line: str) -> None:
        print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)

    try:
        result = run_sweep(
            directory, engines=engines, sizes=sizes, total=total, max_seconds=max_seconds,
            cold=not args.no_cold, use_fio=not args.no_fio, limit_size=limit_size,
            repeat=args.repeat, buffer_offset=args.buffer_offset, threads=args.threads,
            task_size=config.parse_size(args.task_size) if args.task_size else None,
            queue_depth=args.queue_depth, progress=progress if live else None,
        )
    except FastensorError as e:
        print(f"pyfastensor: error: {e}", file=sys.stderr)
        return 1
    finally:
        if live:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    print(format_report(result))
    if args.json:
        write_json(result, args.json)
    if not args.no_plot:
        plot_or_say(plot, result, args.plot)
    return 0

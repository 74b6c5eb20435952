"""``python -m benchmarks gpu``: pyfastensor's CUDA paths against the machine's own limits and
against torch and safetensors, in one command (see :data:`DESCRIPTION`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from . import harness

GB = 1e9
#: Exit status when there is no CUDA device: the command cannot measure anything (as a usage error).
NO_CUDA = 2

DESCRIPTION = """\
What runs on a GPU, measured on this machine, in one run:

  pinned copies   device-to-host and host-to-device bandwidth of pinned memory (GB/s)
  disk limit      the disk's O_DIRECT sequential write (fsync) and cold read bandwidth in
                  --dir (1 GiB, --quick 256 MiB, 64 MiB blocks), measured again at the start
                  of each checkpoint round: a disk's bandwidth drifts from minute to minute,
                  so each round's rows are compared with the limit of that round
  checkpoint      a bf16 state dict on the GPU (~1.9 GB; --quick ~0.5 GB), over interleaved
                  rounds (each library first in turn), for pyfastensor, torch (save + fsync /
                  load) and safetensors (save_file + fsync / load_file(device="cuda")):
                    save from CUDA, durable          GB/s, ratio to its round's write limit
                                                     (each save writes a new file: the last
                                                     one is removed first, untimed)
                    cold load to CUDA (cache dropped) GB/s, ratio to its round's read limit
                    warm load to CUDA (page cache)    GB/s
                    async_save: the caller's blocking time, and its ratio to the save's
                                                     (and the time until its device-to-host
                                                     copies end, which the training stream
                                                     waits for)
                  each with its spread over the rounds and pyfastensor's paired ratios to
                  its peers, then each target shown as met or not met. Before the rounds,
                  one untimed save and load of each library (imports, pinned buffers). A
                  peer that fails is left out with its error; the checkpoint rows are
                  printed before the offload rows run
  offload         the CUDA offload benchmark's rows (benchmarks/offload_cuda.py), each
                  target shown as met, NOT MET or not measured (and why); a row that
                  fails is reported in the table and the others still run

Without a CUDA device it says so and exits with status 2. Cold reads: as root the
page cache is dropped before each (echo 3 > drop_caches), else each file's pages
are dropped (posix_fadvise DONTNEED). Needs safetensors for its rows
(pip install -r benchmarks/requirements.txt); without it they are left out.
"""

#: The targets, ``(name, row, compared with, at least or at most, bound)``: the row's paired
#: ratios' median against the bound.
TARGETS: list[tuple[str, str, str, str, float]] = [
    ("save from CUDA >= 85% of the disk's write limit", "save", "write limit", ">=", 0.85),
    ("save from CUDA >= 1.5x torch.save + fsync", "save", "torch", ">=", 1.5),
    ("cold load to CUDA >= 85% of the disk's read limit", "cold", "read limit", ">=", 0.85),
    ("cold load to CUDA >= 1.2x safetensors", "cold", "safetensors", ">=", 1.2),
    ("warm load to CUDA >= safetensors", "warm", "safetensors", ">=", 1.0),
    ("async_save blocks <= 10% of the save", "async", "save", "<=", 0.10),
]


def pinned_bandwidth(nbytes: int, repeat: int = 5) -> dict[str, float]:
    """Best GB/s of ``repeat`` copies of ``nbytes`` each way between pinned host memory and the
    device, timed by CUDA events."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {}
    for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        best = 0.0
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = max(best, nbytes / (start.elapsed_time(end) / 1e3) / GB)
        out[name] = best
    return out


def make_state(total: int) -> dict[str, Any]:
    """A bf16 state dict of about ``total`` bytes on the GPU: 28 matrices and an embedding of
    four times their size, as a transformer's (29 tensors)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    unit = total // 32 // 2  # elements of one matrix
    cols = 4096
    rows = max(1, unit // cols)
    state = {f"layers.{i}.weight": torch.randn(rows, cols, device="cuda", generator=g).bfloat16() for i in range(28)}
    state["embed.weight"] = torch.randn(4 * rows, cols, device="cuda", generator=g).bfloat16()
    torch.cuda.synchronize()
    return state


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _libraries() -> dict[str, tuple[Callable[[Any, str], None], Callable[[str], Any]]]:
    """``name -> (save to a path durably, load from it to CUDA)`` of each library present."""
    import torch

    import pyfastensor

    def torch_save(state: Any, path: str) -> None:
        torch.save(state, path)
        _fsync(path)

    libs = {
        "pyfastensor": (lambda s, p: pyfastensor.save(s, p),
                        lambda p: pyfastensor.load(p, map_location="cuda")),
        "torch": (torch_save, lambda p: torch.load(p, map_location="cuda")),
    }
    try:
        from safetensors.torch import load_file, save_file
    except ImportError:
        return libs

    def st_save(state: Any, path: str) -> None:
        save_file(state, path)
        _fsync(path)
    libs["safetensors"] = (st_save, lambda p: load_file(p, device="cuda"))
    return libs


def _timed(fn: Callable[[], Any]) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    del out
    return dt


def round_limit(directory: str, size: int) -> Any:
    """The disk's limit now (:class:`pyfastensor.bench.disk.DiskLimit`): fio where installed, else
    one O_DIRECT pass each way at 64 MiB blocks (the engine the rows' large records take)."""
    from pyfastensor.bench import disk

    return disk.measure_limit(directory, engines=("direct",), size=size)


def checkpoint_rows(directory: str, state: dict[str, Any], rounds: int,
                    progress: Callable[[str], None] = harness.progress, *,
                    limit_size: int = 1 << 30) -> dict[str, Any]:
    """Seconds of each row and library over ``rounds`` interleaved rounds, each round after a
    measure of the disk's limit of ``limit_size`` bytes each way in ``directory`` (see
    :data:`DESCRIPTION`). ``limits`` holds each round's :class:`~pyfastensor.bench.disk.DiskLimit`."""
    import torch

    import pyfastensor
    from pyfastensor.bench import disk
    from pyfastensor.checkpoint import last_cuda_route

    libs = _libraries()
    secs: dict[str, dict[str, list[float]]] = {row: {lib: [] for lib in libs} for row in ("save", "cold", "warm")}
    secs["async"] = {"blocking": [], "gpu_blocking": [], "total": []}
    paths = {lib: os.path.join(directory, f"state-{lib}.{'safetensors' if lib == 'safetensors' else 'pt'}")
             for lib in libs}
    apath = os.path.join(directory, "state-async.pt")
    failed: dict[str, str] = {}

    def measured(lib: str, row: str, fn: Callable[[], Any]) -> None:
        """Time ``fn`` as ``lib``'s ``row``; a peer that fails is reported and left out from then
        on (its figures of earlier rounds too: rows are compared round by round), pyfastensor's
        failure ends the checkpoint rows."""
        try:
            secs[row][lib].append(_timed(fn))
        except Exception as e:
            if lib == "pyfastensor":
                raise
            failed[lib] = f"{row}: {type(e).__name__}: {e}"
            del libs[lib]
            for by_lib in secs.values():
                by_lib.pop(lib, None)

    progress("checkpoint: one untimed save and load of each library (pinned buffers, imports)")
    for lib in list(libs):
        save, load = libs[lib]
        measured(lib, "save", lambda: save(state, paths[lib]))  # noqa: B023
        if lib in libs:
            measured(lib, "cold", lambda: load(paths[lib]))  # noqa: B023
        harness.remove_saved(paths[lib])
    for by_lib in secs.values():
        for xs in by_lib.values():
            xs.clear()
    t = time.perf_counter()
    pyfastensor.async_save(state, apath).result()  # the first pays for pinning its buffer
    first_async = time.perf_counter() - t
    harness.remove_saved(apath)
    routes = set()
    limits = []
    for r in range(rounds):
        progress(f"checkpoint round {r + 1}/{rounds}: the disk's limit")
        limits.append(round_limit(directory, limit_size))
        os.sync()  # the limit's file is freed now, not inside the first save's time
        progress(f"checkpoint round {r + 1}/{rounds}")
        order = harness.round_order(list(libs), r)
        for lib in order:
            save = libs[lib][0]
            harness.remove_saved(paths[lib])  # a save writes a new file, as the limit's does (untimed)
            measured(lib, "save", lambda: save(state, paths[lib]))  # noqa: B023
        harness.remove_saved(apath)
        t = time.perf_counter()
        fut = pyfastensor.async_save(state, apath)
        secs["async"]["blocking"].append(time.perf_counter() - t)
        torch.cuda.synchronize()  # the snapshot's copies, which the training stream waits for
        secs["async"]["gpu_blocking"].append(time.perf_counter() - t)
        fut.result()
        secs["async"]["total"].append(time.perf_counter() - t)
        for lib in [x for x in order if x in libs]:
            load = libs[lib][1]
            disk.drop_caches([paths[lib]])
            measured(lib, "cold", lambda: load(paths[lib]))  # noqa: B023
            if lib == "pyfastensor":
                route = last_cuda_route()
                routes.add(route.get("route", "?") + (f" ({route['reason']})" if route.get("reason") else ""))
        for lib in [x for x in order if x in libs]:
            load = libs[lib][1]
            disk.cache_files([paths[lib]])
            measured(lib, "warm", lambda: load(paths[lib]))  # noqa: B023
    for p in (*paths.values(), apath):
        if os.path.exists(p):
            os.remove(p)
    return {"seconds": secs, "first_async_s": first_async, "routes": sorted(routes),
            "method": disk.cold_cache_method(), "limits": limits, "failed": failed}


def limit_summary(limits: list[Any]) -> dict[str, Any]:
    """The rounds' limits as the report keeps them: GB/s per round each way, their medians, and
    how they were measured."""
    w = [x.write_mbps / 1e3 for x in limits]
    r = [x.read_mbps / 1e3 for x in limits]
    return {"write_gbps": statistics.median(w), "read_gbps": statistics.median(r),
            "rounds": {"write_gbps": w, "read_gbps": r}, "describe": median_limit(limits).describe()}


def median_limit(limits: list[Any]) -> Any:
    """One :class:`~pyfastensor.bench.disk.DiskLimit` of the rounds' median figures (the offload
    rows' bound)."""
    return dataclasses.replace(limits[-1], write_mbps=statistics.median(x.write_mbps for x in limits),
                               read_mbps=statistics.median(x.read_mbps for x in limits))


def offload_part(directory: str, result: dict[str, Any], quick: bool,
                 progress: Callable[[str], None] = harness.progress) -> dict[str, Any]:
    """The GPT-like model's offload table (:mod:`benchmarks.offload_cuda`), the SSD tier bounded
    by the disk's limit the checkpoint rounds measured (their median), as ``{"offload",
    "offload_report", "offload_targets"}``; a failure as ``{"offload_error"}``."""
    from . import offload_cuda

    progress("offload")
    lim = result.get("limit")
    disk_limit = (types.SimpleNamespace(write_mbps=lim["write_gbps"] * 1e3, read_mbps=lim["read_gbps"] * 1e3)
                  if lim else None)
    try:
        off = offload_cuda.run(directory, quick=quick, disk_limit=disk_limit, progress=progress)
    except Exception as e:  # the checkpoint rows stand
        return {"offload_error": f"{type(e).__name__}: {e}"}
    return {"offload": off, "offload_report": offload_cuda.format_report(off),
            "offload_targets": offload_cuda.evaluate(off)}


def run(directory: str, *, quick: bool = False, rounds: int | None = None, size: int | None = None,
        with_offload: bool = True, progress: Callable[[str], None] = harness.progress) -> dict[str, Any]:
    """Measure everything :data:`DESCRIPTION` lists; return the raw results. A failure of
    pyfastensor's checkpoint rows is kept as ``"error"`` and the offload rows still run."""
    import torch

    nbytes = size or ((512 << 20) if quick else (7 << 28))  # 1.88 GB: 29 tensors of a 0.9B-parameter model
    rounds = rounds or (2 if quick else 3)
    progress("pinned copy bandwidth")
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "pinned_gbps": pinned_bandwidth((64 if quick else 256) << 20)}
    state = make_state(nbytes)
    out["state_bytes"] = sum(t.numel() * t.element_size() for t in state.values())
    out["tensors"] = len(state)
    try:
        out.update(checkpoint_rows(directory, state, rounds, progress,
                                   limit_size=(256 << 20) if quick else (1 << 30)))
    except Exception as e:  # reported; the offload rows still run
        out["error"] = f"{type(e).__name__}: {e}"
    del state
    torch.cuda.empty_cache()
    if "limits" in out:
        out["limit"] = limit_summary(out.pop("limits"))
        out["targets"] = evaluate(out)
    if with_offload:
        out.update(offload_part(directory, out, quick, progress))
    return out


def _ratios(result: dict[str, Any], row: str, other: str) -> list[float]:
    """Per round, pyfastensor's figure against ``other``'s (a peer, a limit, or the save), as a
    speed ratio (time ratio for the async row)."""
    secs = result["seconds"]
    if row == "async":
        return harness.paired_ratios(secs["save"]["pyfastensor"], secs["async"]["blocking"])
    mine = secs[row]["pyfastensor"]
    if other in ("write limit", "read limit"):
        return limit_ratios(result, "write_gbps" if other == "write limit" else "read_gbps", mine)
    if other not in secs[row]:
        return []
    return harness.paired_ratios(mine, secs[row][other])


def evaluate(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of :data:`TARGETS` with its paired ratios' median and whether it is met (None: no peer here)."""
    out = []
    for name, row, other, op, bound in TARGETS:
        xs = _ratios(result, row, other)
        med = statistics.median(xs) if xs else None
        met = None if med is None else (med >= bound if op == ">=" else med <= bound)
        out.append({"target": name, "ratios": xs, "median": med, "met": met})
    return out


def limit_ratios(result: dict[str, Any], key: str, seconds: list[float]) -> list[float]:
    """Each round's GB/s of a row (``seconds`` per round) over that round's limit ``key``
    (``"write_gbps"`` or ``"read_gbps"``); one limit for every round where only one was measured."""
    lims = result["limit"].get("rounds", {}).get(key) or [result["limit"][key]] * len(seconds)
    return [result["state_bytes"] / s / (lim * GB) for s, lim in zip(seconds, lims, strict=True)]


def _limit_rounds(limit: dict[str, Any]) -> str:
    rounds = limit.get("rounds")
    if not rounds:
        return f"disk limit: write {limit['write_gbps']:.2f} GB/s, read {limit['read_gbps']:.2f} GB/s"
    return ("disk limit per round: write " + ", ".join(f"{x:.2f}" for x in rounds["write_gbps"])
            + " GB/s; read " + ", ".join(f"{x:.2f}" for x in rounds["read_gbps"]) + " GB/s")


def format_report(result: dict[str, Any]) -> str:
    """The report: bandwidths, the checkpoint rows with their spreads and ratios, the targets."""
    nb = result["state_bytes"]
    lines = [f"device: {result['device']}, torch {result['torch']}",
             f"pinned copies: D2H {result['pinned_gbps']['d2h']:.1f} GB/s, H2D {result['pinned_gbps']['h2d']:.1f} GB/s"]
    if "error" in result:
        lines.append(f"checkpoint rows: pyfastensor failed, no figures: {result['error']}")
        return "\n".join(lines + _offload_lines(result))
    lines += [result["limit"]["describe"] + " (the rounds' median; measured at the start of each round)",
             _limit_rounds(result["limit"]),
             f"state: {result['tensors']} bf16 tensors, {nb / GB:.2f} GB on the GPU; cold reads: {result['method']}",
             f"pyfastensor's load route: {', '.join(result['routes'])}", "",
             f"{'row':<26}{'library':<13}{'GB/s (min-max)':<18}{'x limit (paired)':<22}"
             "pyfastensor / it (paired, min-max)"]
    names = {"save": "save from CUDA, durable", "cold": "cold load to CUDA", "warm": "warm load to CUDA"}
    secs = result["seconds"]
    for row, title in names.items():
        key = {"save": "write_gbps", "cold": "read_gbps"}.get(row)
        for lib, xs in secs[row].items():
            gbps = [nb / s / GB for s in xs]
            lim = "-"
            if key:
                x = limit_ratios(result, key, xs)
                lim = f"{statistics.median(x):.2f} ({harness.spread_text(x)})"
            rel = "" if lib == "pyfastensor" else harness.spread_text(harness.paired_ratios(secs[row]["pyfastensor"], xs))
            lines.append(f"{title:<26}{lib:<13}{statistics.median(gbps):5.2f} ({harness.spread_text(gbps)})"
                         f"{'':<3}{lim:<22}{rel}")
    a = secs["async"]
    lines.append(f"{'async_save blocking':<26}{'pyfastensor':<13}{statistics.median(a['blocking']):.3f} s "
                 f"({harness.spread_text(a['blocking'], '.3f')}) of a {statistics.median(a['total']):.2f} s save; "
                 f"first call (pins its buffer) {result['first_async_s']:.2f} s")
    if a.get("gpu_blocking"):
        lines.append(f"{'':<39}until its device-to-host copies end (the training stream waits for them): "
                     f"{statistics.median(a['gpu_blocking']):.3f} s ({harness.spread_text(a['gpu_blocking'], '.3f')})")
    for lib, why in result.get("failed", {}).items():
        lines.append(f"{lib} failed and is left out: {why}")
    lines += ["", "targets:", *harness.target_lines(result["targets"])]
    return "\n".join(lines + _offload_lines(result))


def _offload_lines(result: dict[str, Any]) -> list[str]:
    if "offload_error" in result:
        return ["", f"offload (CUDA): failed: {result['offload_error']}"]
    if not result.get("offload_report"):
        return []
    return ["", "offload (CUDA):", result["offload_report"]]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = harness.add_command(
        sub, "gpu", help="the CUDA paths: pinned copies, the disk, checkpoints to and from CUDA, offload",
        description=DESCRIPTION, func=_cmd_gpu,
        dir_help="directory on the disk under test (default: the current one)")
    p.add_argument("--quick", action="store_true", help="~0.5 GB state, 2 rounds: under a minute")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, --quick 2)")
    p.add_argument("--no-offload", action="store_true", help="leave out the offload rows")


def _cmd_gpu(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("benchmarks gpu: no CUDA device here (torch.cuda.is_available() is False): this benchmark "
              "measures pyfastensor's CUDA paths and runs on a GPU machine", file=sys.stderr)
        return NO_CUDA
    with harness.temp_dir(args.dir, "gpu") as d:
        result = run(d, quick=args.quick, rounds=args.rounds, with_offload=False)
        print(format_report(result), flush=True)  # the checkpoint rows, before the offload ones run
        if not args.no_offload:
            result.update(offload_part(d, result, args.quick))
            print("\n".join(_offload_lines(result)), flush=True)
    if args.json:
        harness.write_json(result, args.json)
    return 1 if "error" in result or "offload_error" in result else 0

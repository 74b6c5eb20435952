"""``python -m benchmarks dcp``: pyfastensor.dcp against DCP's FileSystemWriter/Reader.

A GPT-2-shaped state dict (:func:`~benchmarks.workloads.gpt2_state_dict`,
fp32, about 498 MB at full size) is sharded as DTensors, every tensor
``Shard(0)``, over 1, 2 and 4 ranks of one machine (spawned processes, gloo on
127.0.0.1). Each process first saves and loads once with each tool, untimed:
the first ``dcp.save`` in a process paid its imports, DCP's own and ours (the
native library's load, the directory's probe), costs a training job pays once;
the tool measured first in round 0 bore them (0.48-1.06 s against 0.25-0.41 s
in later rounds for our 4- and 2-rank saves). The objects alive then are frozen
out of the garbage collector's passes (:func:`gc.freeze`; a full pass over them
stalled one timed call in five by 180-190 ms, for either tool). Then each round,
for each tool in alternating order:

- save: ``dcp.save`` of the sharded dict into an empty directory, durable for
  both (``Writer(path)``: fsync, rename, directory fsync; ``FileSystemWriter(path)``
  with its defaults, ``sync_files=True``), timed from before the call to after a
  barrier on every rank;
- load: caches dropped (:func:`pyfastensor.bench.disk.drop_caches`), then
  ``dcp.load`` into preallocated DTensors of the same sharding, timed the same way.

Resharded loads: the dict saved with 4 ranks (``Shard(0)``, and ``Shard(1)``) is
loaded cold by 2 ranks into the other sharding, and each rank's bytes read from
the device (``read_bytes`` of ``/proc/self/io``, which counts page-cache misses
and O_DIRECT reads alike) are summed and set against the bytes the load needs
(its local shards' bytes). Our reader reads whole 4 KiB pages around what it
needs (so every byte read is checked against the page sums); its planned bytes
are shown beside, the least a page-granular reader can read. Ranks on one
machine share the page cache, so a page two ranks read comes from the device
once: ``rchar`` (what the ranks' read calls returned, cached or not) is shown
too, the bytes each rank would read from its own device on separate nodes.

Figures are medians over rounds; ratios (theirs over ours, in seconds) are taken
round by round, with their spread (min-max). The disk's limit is measured in the
same run (:func:`pyfastensor.bench.disk.measure_limit`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .harness import (
    add_command,
    disk,
    freeze_heap,
    progress,
    round_order,
    spread_text,
    temp_dir,
    write_json,
)

MiB = 1 << 20

#: The tools compared: ours, then DCP's own.
TOOLS = ("pyfastensor", "filesystem")

#: The targets this benchmark judges.
SPEEDUP_TARGET = 1.5
RESHARD_TARGET = 1.1

#: Sizes: full GPT-2 small, and a quick one.
SIZES = {"full": {"layers": 12, "vocab": 50257}, "quick": {"layers": 2, "vocab": 8192}}


def _io() -> dict[str, int]:
    """This process's read counters (``/proc/self/io``): ``read_bytes``, the bytes it made the
    kernel read from storage, and ``rchar``, the bytes its read calls returned (page-cache
    hits included: what it read, wherever from)."""
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("read_bytes", "rchar"):
                out[k] = int(v)
    return out


def _writer(tool: str, path: str) -> Any:
    if tool == "pyfastensor":
        from pyfastensor.dcp import Writer

        return Writer(path)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(path)


def _reader(tool: str, path: str) -> Any:
    if tool == "pyfastensor":
        from pyfastensor.dcp import Reader

        return Reader(path)
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(path)


def _sharded(cfg: dict[str, Any], world: int, dim: int, *, zeros: bool) -> dict[str, Any]:
    """The GPT-2 dict as DTensors on a 1-D mesh of ``world``: 2-D tensors ``Shard(dim)``,
    1-D ones ``Shard(0)``; zeros to load into when ``zeros``. Each rank slices its own
    shards from the full dict (no communication)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from .workloads import gpt2_state_dict

    mesh = init_device_mesh("cpu", (world,))
    full = gpt2_state_dict(layers=cfg["layers"], vocab=cfg["vocab"])
    out = {}
    for k, v in full.items():
        if zeros:
            v = torch.zeros_like(v)
        out[k] = distribute_tensor(v, mesh, [Shard(dim if v.dim() == 2 else 0)], src_data_rank=None)
    del full
    return out


def _files(path: str) -> list[str]:
    return [os.path.join(path, n) for n in os.listdir(path)] if os.path.isdir(path) else []


def _entry(rank: int, fn: Any, world: int, port: int, cfg: dict[str, Any]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, world, cfg)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def exit_without_finalizing() -> None:
    """Leave a spawned worker that succeeded without running interpreter finalization.

    A gloo worker thread may still drop the last reference to a finished
    collective's tensors after the interpreter began finalizing; taking the GIL
    then ends the thread inside a noexcept destructor and the process aborts
    ("terminate called without an active exception", pytorch/pytorch#190489).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(fn: Any, world: int, cfg: dict[str, Any]) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_entry, args=(fn, world, port, cfg), nprocs=world, join=True)


def _save_load(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """Rounds of save then cold load for each tool; rank 0 writes the times."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    sd = _sharded(cfg, world, 0, zeros=False)
    dst = _sharded(cfg, world, 0, zeros=True)
    for tool in TOOLS:  # untimed: the process's one-time costs (see the module's doc)
        path = os.path.join(cfg["dir"], f"warmup-{tool}-{world}")
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
        dcp.save(sd, storage_writer=_writer(tool, path))
        dist.barrier()
        dcp.load(dst, storage_reader=_reader(tool, path))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    freeze_heap()
    rows = []
    for rnd in range(cfg["rounds"]):
        for tool in round_order(TOOLS, rnd):
            path = os.path.join(cfg["dir"], f"{tool}-{world}-{cfg['dims'][0]}")
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            dist.barrier()
            w, storage = _timed(_writer(tool, path), ("write_data", "finish"))
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=w)
            dist.barrier()
            save_s = time.perf_counter() - t0
            save_storage = storage[0]
            if rank == 0:
                disk.drop_caches(_files(path))
            dist.barrier()
            r, storage = _timed(_reader(tool, path), ("read_metadata", "read_data"))
            t0 = time.perf_counter()
            dcp.load(dst, storage_reader=r)
            dist.barrier()
            load_s = time.perf_counter() - t0
            # The slowest rank's storage time bounds the call (gathered untimed).
            every: list[Any] = [None] * world
            dist.all_gather_object(every, (save_storage, storage[0]))
            rows.append({"tool": tool, "round": rnd, "save_s": save_s, "load_s": load_s,
                         "save_storage_s": max(x[0] for x in every), "load_storage_s": max(x[1] for x in every)})
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps(rows))


def _timed(obj: Any, methods: tuple[str, ...]) -> tuple[Any, list[float]]:
    """``obj`` with ``methods`` timed: the returned one-item list sums their seconds.

    What a storage backend spends in its own methods; the rest of a
    ``dcp.save``/``dcp.load`` (planning, collectives, the planner's copies)
    is DCP's, paid the same whatever the backend.
    """
    spent = [0.0]

    def timing(f: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return timed

    for name in methods:
        setattr(obj, name, timing(getattr(obj, name)))
    return obj, spent


def _save_only(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """Save the dict sharded along cfg["dims"][0] with both tools (the resharded loads' sources)."""
    import torch.distributed.checkpoint as dcp

    sd = _sharded(cfg, world, cfg["dims"][0], zeros=False)
    for tool in TOOLS:
        path = os.path.join(cfg["dir"], f"{tool}-{world}-{cfg['dims'][0]}")
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dcp.save(sd, storage_writer=_writer(tool, path))


def _reshard(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """Cold loads by ``world`` ranks into sharding cfg["dims"][1] of a dict saved by 4 with
    cfg["dims"][0]; each rank writes its bytes read, needed and planned."""
    import zlib

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dst = _sharded(cfg, world, cfg["dims"][1], zeros=True)
    needed = sum(v.to_local().numel() * v.element_size() for v in dst.values())
    freeze_heap()
    rows = []
    sums: dict[str, int] = {}
    for rnd in range(cfg["rounds"]):
        for tool in round_order(TOOLS, rnd):
            path = os.path.join(cfg["dir"], f"{tool}-4-{cfg['dims'][0]}")
            if rank == 0:
                disk.drop_caches(_files(path))
            dist.barrier()
            before = _io()
            t0 = time.perf_counter()
            r = _reader(tool, path)
            dcp.load(dst, storage_reader=r)
            seconds = time.perf_counter() - t0
            after = _io()
            rows.append({"tool": tool, "round": rnd, "read_bytes": after["read_bytes"] - before["read_bytes"],
                         "rchar": after["rchar"] - before["rchar"], "needed": needed,
                         "planned": getattr(r, "last_stats", {}).get("data_bytes"), "seconds": seconds})
            crc = 0
            for v in dst.values():
                crc = zlib.crc32(v.to_local().contiguous().view(-1).numpy().tobytes(), crc)
            sums[tool] = crc
            dist.barrier()
    Path(f"{cfg['out']}.{rank}").write_text(json.dumps({"rows": rows, "agree": len(set(sums.values())) == 1}))


def run(directory: str, *, size: str = "full", ranks: tuple[int, ...] = (1, 2, 4), rounds: int = 3,
        limit: bool = True, progress: Any = None) -> dict[str, Any]:
    """Run the benchmark in ``directory``; return the raw figures (see the module's doc).

    Args:
        directory: where the checkpoints go (emptied of them at the end).
        size: ``"full"`` (GPT-2 small, 498 MB) or ``"quick"``.
        ranks: world sizes of the save/load rounds. Default 1, 2, 4.
        rounds: rounds per world size and per resharded load. Default 3.
        limit: measure the disk's limit first. Default True.
        progress: called with a line before each step, or None.
    """
    from .workloads import gpt2_state_dict

    say = progress or (lambda _: None)
    cfg = {**SIZES[size], "rounds": rounds, "dir": directory}
    nbytes = sum(v.numel() * v.element_size() for v in gpt2_state_dict(**SIZES[size]).values())
    result: dict[str, Any] = {"size": size, "nbytes": nbytes, "rounds": rounds,
                              "cold": disk.cold_cache_method(), "worlds": {}, "reshard": {}}
    if limit:
        say("disk limit")
        lim = disk.measure_limit(directory, size=min(1 << 30, max(256 * MiB, nbytes)))
        result["limit"] = {"write_mbps": lim.write_mbps, "read_mbps": lim.read_mbps, "how": lim.describe()}
    out = os.path.join(directory, "rows.json")
    for world in ranks:
        say(f"save and load with {world} rank(s)")
        _spawn(_save_load, world, {**cfg, "dims": (0, 0), "out": out})
        result["worlds"][world] = json.loads(Path(out).read_text())
    for src, dst in ((0, 1), (1, 0)):
        say(f"save with 4 ranks Shard({src}), cold load with 2 into Shard({dst})")
        if 4 not in ranks or src != 0:
            _spawn(_save_only, 4, {**cfg, "dims": (src, dst)})
        _spawn(_reshard, 2, {**cfg, "dims": (src, dst), "out": out})
        per_rank = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
        result["reshard"][f"Shard({src})x4->Shard({dst})x2"] = per_rank
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians, paired ratios with their spread, and the targets, from :func:`run`'s result."""
    nb = result["nbytes"]
    lim = result.get("limit")
    out: dict[str, Any] = {"worlds": {}, "reshard": {}, "targets": []}
    for world, rows in result["worlds"].items():
        s: dict[str, Any] = {}
        for key in ("save", "load"):
            by = {t: {r["round"]: r[f"{key}_s"] for r in rows if r["tool"] == t} for t in TOOLS}
            ratios = [by["filesystem"][k] / by["pyfastensor"][k] for k in by["pyfastensor"] if k in by["filesystem"]]
            s[key] = {t: statistics.median(by[t].values()) for t in TOOLS}
            s[key]["ratio"], s[key]["spread"] = statistics.median(ratios), spread_text(ratios)
            s[key]["gbps"] = {t: nb / s[key][t] / 1e9 for t in TOOLS}
            figures = f"{s[key]['ratio']:.2f}x (rounds {s[key]['spread']})"
            bound = _bound(rows, key, nb / (lim[f"{'write' if key == 'save' else 'read'}_mbps"] * 1e6)) if lim else None
            if bound:
                s[key]["dcp_own_s"], s[key]["bound_s"] = bound["dcp_own_s"], bound["bound_s"]
                s[key]["best_ratio"], s[key]["best_spread"] = bound["best_ratio"], bound["best_spread"]
                figures += (f"; the most any backend could show: {bound['best_ratio']:.2f}x (rounds "
                            f"{bound['best_spread']}), DCP's own {bound['dcp_own_s'] * 1e3:.0f} ms + the bytes "
                            f"at the disk's limit")
            out["targets"].append({"what": f"{key} with {world} rank(s) >= {SPEEDUP_TARGET}x FileSystem"
                                           f"{'Writer' if key == 'save' else 'Reader'}",
                                   "met": s[key]["ratio"] >= SPEEDUP_TARGET, "figures": figures})
        out["worlds"][world] = s
    for name, per_rank in result["reshard"].items():
        s = {}
        for t in TOOLS:
            rounds = sorted({r["round"] for r in per_rank[0]["rows"]})
            read = [sum(r["read_bytes"] for pr in per_rank for r in pr["rows"] if r["tool"] == t and r["round"] == k)
                    for k in rounds]
            secs = [max(r["seconds"] for pr in per_rank for r in pr["rows"] if r["tool"] == t and r["round"] == k)
                    for k in rounds]
            planned = [sum(r["planned"] or 0 for pr in per_rank for r in pr["rows"] if r["tool"] == t
                           and r["round"] == k) for k in rounds]
            rchar = [sum(r.get("rchar", 0) for pr in per_rank for r in pr["rows"] if r["tool"] == t
                         and r["round"] == k) for k in rounds]
            s[t] = {"read_bytes": statistics.median(read), "seconds": statistics.median(secs),
                    "rchar": statistics.median(rchar),
                    "planned": statistics.median(planned) if t == "pyfastensor" else None, "reads": read}
        needed = sum(pr["rows"][0]["needed"] for pr in per_rank)
        s["needed"] = needed
        s["agree"] = all(pr["agree"] for pr in per_rank)
        for t in TOOLS:
            s[t]["ratio"] = s[t]["read_bytes"] / needed
            s[t]["spread"] = spread_text([x / needed for x in s[t]["reads"]])
        ours = s["pyfastensor"]
        out["targets"].append({"what": f"{name}: bytes read <= {RESHARD_TARGET}x needed", "met":
                               ours["ratio"] <= RESHARD_TARGET,
                               "figures": f"{ours['ratio']:.2f}x (rounds {ours['spread']}); pages planned "
                                          f"{ours['planned'] / needed:.2f}x"})
        out["reshard"][name] = s
    return out


def _bound(rows: list[dict[str, Any]], key: str, at_limit_s: float) -> dict[str, Any] | None:
    """The fastest a round of ``key`` could be with any backend, and the ratio that would show.

    A round's bound is DCP's own time in it (the call less the slowest rank's
    time in the backend's methods; the smaller of the two tools' figures) plus
    the bytes at the disk's limit. The best ratio is FileSystem*'s time over
    that bound, round by round. None for rows of an older run without the
    storage times.
    """
    by: dict[str, dict[int, dict[str, Any]]] = {t: {r["round"]: r for r in rows if r["tool"] == t} for t in TOOLS}
    own, bounds, best = [], [], []
    for k, ours in by["pyfastensor"].items():
        theirs = by["filesystem"].get(k)
        if theirs is None or f"{key}_storage_s" not in ours:
            return None
        dcp_own = min(r[f"{key}_s"] - r[f"{key}_storage_s"] for r in (ours, theirs))
        own.append(dcp_own)
        bounds.append(dcp_own + at_limit_s)
        best.append(theirs[f"{key}_s"] / bounds[-1])
    if not best:
        return None
    return {"dcp_own_s": statistics.median(own), "bound_s": statistics.median(bounds),
            "best_ratio": statistics.median(best), "best_spread": spread_text(best)}


def format_report(result: dict[str, Any]) -> str:
    """The report: per world size, ours, theirs, the limit, ratios with spread; resharded bytes; targets."""
    s = summarize(result)
    lines = [f"dcp benchmark: GPT-2 ({result['size']}, {result['nbytes'] / 1e6:.0f} MB fp32) sharded Shard(0), "
             f"{result['rounds']} rounds; cold reads: {result['cold']}"]
    lim = result.get("limit")
    if lim:
        lines.append(lim["how"])
    lines.append("")
    lines.append(f"{'ranks':>5}  {'op':<5} {'pyfastensor':>16} {'FileSystem*':>16} {'limit':>10} "
                 f"{'ratio':>6} {'spread':>10}  {'DCP own':>7} {'bound':>6} {'best':>6}")
    for world, w in s["worlds"].items():
        for key, lk in (("save", "write_mbps"), ("load", "read_mbps")):
            x = w[key]
            limit = f"{lim[lk] / 1e3:.2f} GB/s" if lim else "-"
            bound = (f"{x['dcp_own_s'] * 1e3:>5.0f}ms {x['bound_s']:>5.2f}s {x['best_ratio']:>5.2f}x"
                     if "bound_s" in x else f"{'-':>7} {'-':>6} {'-':>6}")
            lines.append(f"{world:>5}  {key:<5} {x['pyfastensor']:>6.2f}s {x['gbps']['pyfastensor']:>4.2f}GB/s "
                         f"{x['filesystem']:>6.2f}s {x['gbps']['filesystem']:>4.2f}GB/s {limit:>10} "
                         f"{x['ratio']:>5.2f}x {x['spread']:>10}  {bound}")
    if lim:
        lines.append("DCP own: a call's time outside the backend's methods (planning, collectives; the same for "
                     "any backend);")
        lines.append("bound: DCP own + the bytes at the disk's limit; best: FileSystem*'s time over the bound, "
                     "the most any backend could show")
    lines.append("")
    lines.append("resharded loads (cold; bytes read from the device, summed over ranks):")
    for name, r in s["reshard"].items():
        n = r["needed"]
        lines.append(f"  {name}: needed {n / 1e6:.1f} MB; pyfastensor {r['pyfastensor']['read_bytes'] / 1e6:.1f} MB "
                     f"({r['pyfastensor']['ratio']:.2f}x, rounds {r['pyfastensor']['spread']}; pages planned "
                     f"{r['pyfastensor']['planned'] / n:.2f}x) in {r['pyfastensor']['seconds']:.2f}s; "
                     f"FileSystemReader {r['filesystem']['read_bytes'] / 1e6:.1f} MB ({r['filesystem']['ratio']:.2f}x, "
                     f"rounds {r['filesystem']['spread']}) in {r['filesystem']['seconds']:.2f}s; "
                     f"same values: {'yes' if r['agree'] else 'NO'}")
        lines.append(f"    read by the ranks' calls (rchar, page-cache hits included): pyfastensor "
                     f"{r['pyfastensor']['rchar'] / n:.2f}x needed, FileSystemReader {r['filesystem']['rchar'] / n:.2f}x")
    lines.append("")
    lines.append("targets:")
    for t in s["targets"]:
        lines.append(f"  [{'met' if t['met'] else 'NOT met'}] {t['what']}: {t['figures']}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``dcp`` to the benchmarks' subcommands."""
    p = add_command(sub, "dcp", help="pyfastensor.dcp vs DCP's FileSystemWriter/Reader, 1/2/4 ranks, resharding",
                    description=__doc__, func=_cmd_dcp,
                    dir_help="parent directory on the filesystem to measure (default: .)",
                    limit_help="skip measuring the disk's limit")
    p.add_argument("--size", choices=sorted(SIZES), default="full",
                   help="full: GPT-2 small (498 MB); quick: 2 layers, vocab 8192 (about 85 MB)")
    p.add_argument("--ranks", default="1,2,4", help="world sizes of the save/load rounds (default 1,2,4)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians count (default 3)")


def _cmd_dcp(args: argparse.Namespace) -> int:
    parent = args.dir or "."
    if not os.path.isdir(parent):
        raise ValueError(f"--dir {parent!r} is not a directory")
    ranks = tuple(int(x) for x in args.ranks.split(",") if x.strip())
    if args.repeat < 1 or not ranks or min(ranks) < 1:
        raise ValueError("--repeat and every --ranks entry must be >= 1")
    with temp_dir(parent, "dcp") as d:
        result = run(d, size=args.size, ranks=ranks, rounds=args.repeat, limit=not args.no_limit,
                     progress=progress)
    print(format_report(result))
    if args.json:
        write_json(result, args.json)
    return 0

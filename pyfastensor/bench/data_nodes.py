"""Brand's distributed protocol: owner-prefetch against none, and against one node (the paper's Tables 4 and 5).

``python -m pyfastensor bench data-nodes --nodes 2,4`` packs a synthetic
dataset, then reads one shuffled epoch of it

* on one node: a ``ChunkDataset`` within ``--budget`` of the data (the
  single-node loader);
* on K simulated nodes, K processes of a gloo process group on this
  machine's loopback, each a ``ChunkDataset(distributed=True)`` within the
  same budget (the cluster's memory is K budgets), each asking for its
  ``perm[rank::K]`` share: without owner-prefetch (the paper's
  Brand-no-prefetching) and with it (Brand).

and, as the baseline per node, K processes each reading its share from a
single-node loader of its own (no exchange: not exactly once across
nodes). Per variant: the epoch time (the slowest node's, from a common
start after ``set_epoch`` to its last batch), the requests for other nodes' slots that
missed the remote memory (remote misses: each fetched from its owner on
demand: the paper's remote data requests), the calls to owners (a
batch's misses, one call per owner), the hits on prefetched samples, the chunk reads, and the
remote memory's peak against its limit. The targets: owner-prefetch cuts
remote misses by at least half, and the distributed epoch is no slower
than with the single-node loader per node.

What this measures: the protocol (decisions, gRPC calls, copies) and the
chunk reads from the page cache (the pack is read once before timing);
not a network (loopback) nor a disk, and the K nodes share this machine's
cores. ``add_nodes_options``/``run_nodes`` let ``bench data --nodes K``
run it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._output import write_json

#: The paper's three-node setup is ImageNet-1k; this default is small enough for a laptop.
DEFAULT_SAMPLES = 8000
DEFAULT_NODES = (2, 4)


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas") from None
    if not out or any(k < 1 for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected node counts >= 1")
    return out


def add_nodes_options(parser: argparse.ArgumentParser) -> None:
    """Add this benchmark's options to ``parser`` (``bench data-nodes``, or ``bench data`` at merge)."""
    parser.add_argument("--nodes", type=_ints, default=DEFAULT_NODES,
                        help="simulated node counts, comma-separated (default 2,4)")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"samples of the synthetic dataset (default {DEFAULT_SAMPLES})")
    parser.add_argument("--sample-bytes", type=int, default=4096,
                        help="mean sample size; sizes are uniform from half to 1.5 times it (default 4096)")
    parser.add_argument("--chunk-size", type=int, default=32, help="samples per chunk (default 32)")
    parser.add_argument("--budget", type=float, default=0.15,
                        help="each node's memory budget, as a share of the data (default 0.15)")
    parser.add_argument("--remote", type=float, default=0.1,
                        help="each node's remote memory limit, as a share of its budget (default 0.1, the paper's)")
    parser.add_argument("--overflow", type=float, default=None,
                        help="the budget's share for spares (default: the loader's, 0.75)")
    parser.add_argument("--batch", type=int, default=64, help="DataLoader batch size (default 64)")
    parser.add_argument("--dir", default=None, help="where to write the dataset and pack (default: a temporary directory)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the raw results as JSON")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench data-nodes`` to ``sub``."""
    p = sub.add_parser("data-nodes", help="Brand's distributed loader: owner-prefetch on K simulated nodes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_nodes_options(p)
    p.set_defaults(func=run_nodes)


def _make_pack(root: Path, samples: int, mean: int, chunk: int) -> tuple[Path, int]:
    """A folder of random files, two classes, packed; return the pack and its data bytes."""
    from ..data import pack

    rng = random.Random(0)
    src = root / "src"
    total = 0
    for label in ("a", "b"):
        (src / label).mkdir(parents=True, exist_ok=True)
    for i in range(samples):
        size = rng.randint(mean // 2, mean * 3 // 2)
        (src / ("a" if i % 2 else "b") / f"{i:07d}.bin").write_bytes(os.urandom(size))
        total += size
    out = root / "pack"
    pack(src, out, chunk_size=chunk, seed=1, progress=False)
    return out, total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(cfg: dict[str, Any]) -> dict[str, Any]:
    """One node's epoch (run in its own process). Modes: ``single``, the whole epoch on one
    node; ``alone``, this rank's share on a single-node loader of its own (no exchange);
    ``dist``, this rank's share as a node of the cluster."""
    import torch
    import torch.distributed as dist

    from ..data import ChunkDataset

    world, mode = cfg["world"], cfg["mode"]
    if mode == "dist":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=cfg["rank"],
                                world_size=world, timeout=datetime.timedelta(seconds=600))
    ds = ChunkDataset(cfg["pack"], memory_budget=cfg["budget"], overflow=cfg["overflow"],
                      distributed=mode == "dist", prefetch=cfg["prefetch"], remote_memory=cfg["remote"])
    ds.set_epoch(0)
    sampler: Any = ds.sampler()
    if mode == "alone":  # the share ChunkSampler gives rank r of world, on a loader of its own
        g = torch.Generator()
        g.manual_seed(ds.seed)
        sampler = torch.randperm(len(ds), generator=g)[cfg["rank"]::world].tolist()
    dl = torch.utils.data.DataLoader(ds, batch_size=cfg["batch"], sampler=sampler, collate_fn=list)
    if mode == "dist":
        dist.barrier()
    elif mode == "alone":  # start together: the nodes share this machine's cores as the cluster's do
        Path(cfg["sync"], f"ready-{cfg['rank']}").touch()
        while not Path(cfg["sync"], "go").exists():
            time.sleep(0.01)
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = sum(len(b) for b in dl)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stats = ds.stats()
    if mode == "dist":
        dist.barrier()  # serve the others until every node is done
    ds.close()
    return {"rank": cfg["rank"], "samples": n, "seconds": seconds, "cpu_s": cpu, "stats": stats}


def _run_variant(pack: Path, world: int, mode: str, prefetch: bool, o: argparse.Namespace, budget: int) -> dict[str, Any]:
    port = _free_port()
    sync = tempfile.mkdtemp(dir=pack.parent)
    procs = []
    for r in range(world):
        cfg = {"pack": str(pack), "rank": r, "world": world, "mode": mode, "port": port, "sync": sync, "budget": budget,
               "overflow": o.overflow, "prefetch": prefetch, "remote": int(budget * o.remote), "batch": o.batch}
        procs.append(subprocess.Popen([sys.executable, "-m", "pyfastensor.bench.data_nodes", "--node", json.dumps(cfg)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    if mode == "alone":
        deadline = time.monotonic() + 600
        while len(list(Path(sync).glob("ready-*"))) < world and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        Path(sync, "go").touch()
    nodes = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a node failed (exit {p.returncode}): {err.decode()[-2000:]}")
        nodes.append(json.loads(out.decode().strip().splitlines()[-1]))
    d = [n["stats"].get("dist", {}) for n in nodes]

    def total(key: str) -> int:
        return sum(int(x.get(key, 0)) for x in d)

    return {
        "nodes": world, "mode": mode, "prefetch": prefetch, "epoch_s": max(n["seconds"] for n in nodes),
        "node_cpu_s": max(n["cpu_s"] for n in nodes),
        "samples": sum(n["samples"] for n in nodes),
        "remote_misses": total("remote_misses"), "remote_requests": total("remote_requests"),
        "remote_hits": total("remote_hits"), "prefetched": total("prefetched"),
        "remote_peak_bytes": max((int(x.get("remote_peak_bytes", 0)) for x in d), default=0),
        "remote_limit": int(budget * o.remote) if mode == "dist" else 0,
        "chunk_reads": sum(int(n["stats"]["chunk_reads"]) for n in nodes),
        "wasted_bytes": sum(int(n["stats"]["wasted_bytes"]) for n in nodes),
    }


def run_nodes(args: argparse.Namespace) -> int:
    """Run the benchmark with ``args`` (``add_nodes_options``); print the tables; 0."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        pack, data = _make_pack(Path(tmp), args.samples, args.sample_bytes, args.chunk_size)
        for f in sorted(pack.iterdir()):  # into the page cache: the protocol is measured, not the disk
            f.read_bytes()
        budget = int(data * args.budget)
        print(f"dataset: {args.samples} samples, {data / 2**20:.1f} MiB in chunks of {args.chunk_size}; "
              f"budget {budget / 2**20:.1f} MiB per node ({args.budget:.0%} of the data), remote memory "
              f"{args.remote:.0%} of it; {os.cpu_count()} cores shared by the nodes")
        rows = [_run_variant(pack, 1, "single", False, args, budget)]
        for k in args.nodes:
            if k > 1:
                rows += [_run_variant(pack, k, "alone", False, args, budget),
                         _run_variant(pack, k, "dist", False, args, budget), _run_variant(pack, k, "dist", True, args, budget)]
    print(format_report(rows))
    if args.json:
        write_json(rows, args.json)
    return 0


def format_report(rows: list[dict[str, Any]]) -> str:
    """Tables 4 and 5 remade: epoch time, remote misses and requests per variant, and the targets."""
    single = next(r for r in rows if r["mode"] == "single")
    head = (f"{'variant':<36}{'epoch s':>9}{'vs 1 node':>10}{'node CPU s':>11}{'to others':>11}{'remote misses':>15}"
            f"{'hits':>7}{'calls':>7}{'chunk reads':>13}{'remote peak/limit':>20}")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = {"single": "single-node loader, whole epoch",
                "alone": f"{r['nodes']} nodes, single-node loader each",
                "dist": f"{r['nodes']} nodes, " + ("owner-prefetch" if r["prefetch"] else "no prefetch")}[r["mode"]]
        peak = f"{r['remote_peak_bytes'] / 2**10:.0f}/{r['remote_limit'] / 2**10:.0f} KiB" if r["mode"] == "dist" else "-"
        lines.append(f"{name:<36}{r['epoch_s']:>9.2f}{r['epoch_s'] / single['epoch_s']:>9.2f}x{r['node_cpu_s']:>11.2f}"
                     f"{r['remote_hits'] + r['remote_misses']:>11}{r['remote_misses']:>15}{r['remote_hits']:>7}"
                     f"{r['remote_requests']:>7}{r['chunk_reads']:>13}{peak:>20}")
    lines += ["", "single-node loader each: every node reads its share of the epoch from a loader of its own over the "
              "whole pack (no exchange, so not exactly once across nodes: the baseline per node); to others: requests "
              "for other nodes' slots; remote misses: those not in the remote memory, asked of their owner (the "
              "paper's remote data requests); hits: served from prefetched samples; calls: gRPC calls to owners (a "
              "batch's misses, one per owner); node CPU s: the busiest node's process CPU time over its epoch (its Go "
              "threads included). All nodes share this machine's cores."]
    for k in sorted({r["nodes"] for r in rows if r["mode"] == "dist"}):
        off = next(r for r in rows if r["nodes"] == k and r["mode"] == "dist" and not r["prefetch"])
        on = next(r for r in rows if r["nodes"] == k and r["mode"] == "dist" and r["prefetch"])
        alone = next(r for r in rows if r["nodes"] == k and r["mode"] == "alone")
        cut = 1 - on["remote_misses"] / max(off["remote_misses"], 1)
        ok_cut = "met" if cut >= 0.5 else "MISSED"
        ok_time = "met" if on["epoch_s"] <= alone["epoch_s"] else "MISSED"
        lines.append(f"{k} nodes: owner-prefetch cuts remote misses by {cut:.0%} (target >= 50%: {ok_cut}); "
                     f"epoch {on['epoch_s']:.2f}s against {alone['epoch_s']:.2f}s with a single-node loader per node "
                     f"(target no slower: {ok_time}; {on['epoch_s'] / max(alone['epoch_s'], 1e-9):.2f}x) and "
                     f"{single['epoch_s']:.2f}s for the whole epoch on one node")
    return "\n".join(lines)


def _main() -> None:
    p = argparse.ArgumentParser(prog="python -m pyfastensor.bench.data_nodes")
    p.add_argument("--node", required=True, help="one node's JSON config (internal)")
    cfg = json.loads(p.parse_args().node)
    print(json.dumps(_node(cfg)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()

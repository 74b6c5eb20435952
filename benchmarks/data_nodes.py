"""Brand's distributed protocol: owner-prefetch against none, and against one node (the paper's Tables 4 and 5).

``python -m benchmarks data-nodes --nodes 2,4`` packs a synthetic
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
remote memory's peak against its limit. Each node reads a copy of the
pack of its own (its own files, so its own page cache, as on a node with
a volume of its own). ``--rounds`` rounds run every variant once each,
interleaved; the table gives medians with their range and the ratios the
median of per-round ratios. The targets: owner-prefetch cuts remote
misses by at least half, and the distributed epoch is no slower than
with the single-node loader per node.

Two disk settings (``--disk``, both by default):

* ``throttled``: each node process, the baselines' too, sits in a blkio
  cgroup (v1) of its own limited to ``--iops`` read requests per second on
  the pack's disk (``blkio.throttle.read_iops_device``): every node its own
  throttled view of the disk; the page cache is dropped once every process has built its loader, just before
  the common start. This is the setting Brand is for (a disk that cannot
  serve random small reads fast) and the one the epoch-time target is
  judged on. It needs root, cgroup v1 blkio with blk-throttle and a block
  device under ``--dir``; where one is missing the setting is skipped
  with the reason.
* ``cached``: the pack read once into the page cache before timing, so
  the protocol's own cost is what is left: decisions, gRPC calls, copies.

As root, each node runs in a network namespace of its own, joined to the
others by a veth pair and a bridge (``ip netns``; ``--no-netns`` or
where not permitted: processes on loopback, and the report says why): the
nodes reach each other, and the process group's store, over their own
interfaces as on separate machines, though not over a real network. The
K nodes share this machine's cores. ``add_nodes_options``/``run_nodes`` let
``benchmarks data --nodes K`` run it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from ._child import reply_channel
from .harness import (
    ReaderCgroups,
    add_command,
    block_device,
    cgroup_support,
    child_env,
    disk,
    mapped_files,
    write_json,
)

#: The paper's three-node setup is ImageNet-1k; this default (125 MiB) is small enough for a laptop and long
#: enough (seconds an epoch on a throttled disk) that start-up does not rule the epoch time.
DEFAULT_SAMPLES = 32000
DEFAULT_NODES = (2, 4)
#: Disk settings (see the module docstring).
DISK_SETTINGS = ("throttled", "cached")
#: Read requests per second of each node's view of the disk, throttled: a volume that cannot serve random reads.
DEFAULT_IOPS = 300


def _settings(text: str) -> tuple[str, ...]:
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in out if x not in DISK_SETTINGS]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: expected some of {','.join(DISK_SETTINGS)}")
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas") from None
    if not out or any(k < 1 for k in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected node counts >= 1")
    return out


def add_nodes_options(parser: argparse.ArgumentParser) -> None:
    """Add this benchmark's options to ``parser`` (``benchmarks data-nodes``, or ``benchmarks data`` at merge)."""
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
                        help="the budget's share for spares (default: the loader's, 0.9)")
    parser.add_argument("--batch", type=int, default=64, help="DataLoader batch size (default 64)")
    parser.add_argument("--disk", type=_settings, default=DISK_SETTINGS,
                        help="disk settings, comma-separated: throttled (each node's reads limited to --iops in a "
                             "blkio cgroup of its own, cold cache; needs root) and cached (pack in the page cache) "
                             "(default throttled,cached)")
    parser.add_argument("--iops", type=int, default=DEFAULT_IOPS,
                        help=f"read requests per second of each node's throttled view of the disk (default {DEFAULT_IOPS})")
    parser.add_argument("--no-netns", dest="netns", action="store_false",
                        help="run the nodes on loopback instead of each in a network namespace of its own "
                             "(the default where ip netns is permitted, as root)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each running every variant once (default 3); figures are medians over rounds, "
                             "the epoch-time ratio the median of the per-round ratios")
    parser.add_argument("--dir", default=None, help="where to write the dataset and pack (default: a temporary directory)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the raw results as JSON")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``benchmarks data-nodes`` to ``sub``."""
    p = add_command(sub, "data-nodes", help="Brand's distributed loader: owner-prefetch on K simulated nodes",
                    description=__doc__, func=run_nodes, json_help=None)
    add_nodes_options(p)


def _make_pack(root: Path, samples: int, mean: int, chunk: int) -> tuple[Path, int]:
    """A folder of random files, two classes, packed; return the pack and its data bytes."""
    from pyfastensor.data import pack

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


def _node(cfg: dict[str, Any], reply: TextIO) -> dict[str, Any]:
    """One node's epoch (run in its own process). Modes: ``single``, the whole epoch on one
    node; ``alone``, this rank's share on a single-node loader of its own (no exchange);
    ``dist``, this rank's share as a node of the cluster. ``reply`` is the line to the
    benchmark (:func:`~benchmarks._child.reply_channel`)."""
    import torch
    import torch.distributed as dist

    from pyfastensor.data import ChunkDataset

    world, mode = cfg["world"], cfg["mode"]
    if mode == "dist":
        os.environ["MASTER_ADDR"] = cfg["master"]  # a node listens on the interface that reaches it
        dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}:{cfg['port']}", rank=cfg["rank"],
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
    # Built: the parent drops the caches (throttled) and starts every node at once.
    print("ready", file=reply, flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the benchmark gave no start")
    if mode == "dist":
        dist.barrier()
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = sum(len(b) for b in dl)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stats = ds.stats()
    if mode == "dist":
        dist.barrier()  # serve the others until every node is done
    ds.close()
    return {"rank": cfg["rank"], "samples": n, "seconds": seconds, "cpu_s": cpu, "stats": stats}


class Namespaces:
    """K network namespaces, one a node, each joined by a veth pair to a bridge: node r at
    ``10.232.<K>.<r+1>/24`` (``ip``, as root). :meth:`close` removes them.

    Raises:
        OSError: an ``ip`` command failed (its message), after removing what was made.
    """

    def __init__(self, k: int) -> None:
        tag = f"p{os.getpid() % 10000}k{k}"  # interface names: 15 characters at most
        self.subnet = f"10.232.{k}"  # /24
        self.names = [f"pft-bench-{tag}-{r}" for r in range(k)]
        self.veths = [f"{tag}n{r}" for r in range(k)]
        self.bridge = f"{tag}br"
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("link", "set", self.bridge, "up")
            for r, (ns, veth) in enumerate(zip(self.names, self.veths, strict=True)):
                self._ip("netns", "add", ns)
                self._ip("link", "add", veth, "type", "veth", "peer", "name", f"{tag}b{r}")
                self._ip("link", "set", veth, "netns", ns)
                self._ip("link", "set", f"{tag}b{r}", "master", self.bridge)
                self._ip("link", "set", f"{tag}b{r}", "up")
                self._ip("-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", veth)
                self._ip("-n", ns, "link", "set", veth, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
        except OSError:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def addr(self, r: int) -> str:
        """Node r's address."""
        return f"{self.subnet}.{r + 1}"

    def prefix(self, r: int) -> list[str]:
        """The command prefix that runs a program as node r."""
        return ["ip", "netns", "exec", self.names[r]]

    def close(self) -> None:
        """Remove the namespaces (their veth ends go with them) and the bridge."""
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _namespaces(k: int) -> tuple[Namespaces | None, str]:
    """K namespaces for the nodes, or None and why not (the nodes then share loopback)."""
    if k < 2:
        return None, ""
    if os.geteuid() != 0:
        return None, "not root (ip netns needs it)"
    if shutil.which("ip") is None:
        return None, "no ip command (iproute2)"
    try:
        return Namespaces(k), ""
    except OSError as e:
        return None, str(e)


def _run_variant(views: list[Path], world: int, mode: str, prefetch: bool, o: argparse.Namespace, budget: int,
                 setting: str, device: str, support: dict[str, str], nets: Namespaces | None = None) -> dict[str, Any]:
    """One variant's epoch: ``world`` node processes, rank r on ``views[r]`` (a copy of the pack of its own,
    each in a throttled blkio cgroup of its own when ``setting`` is ``throttled``), started together once
    each has built its loader."""
    port = _free_port()
    work = Path(tempfile.mkdtemp(dir=views[0].parent))
    groups: list[ReaderCgroups] = []
    procs: list[subprocess.Popen[str]] = []
    errs = []
    try:
        for r in range(world):
            cfg = {"pack": str(views[r]), "rank": r, "world": world, "mode": mode, "port": port, "budget": budget,
                   "master": nets.addr(0) if nets else "127.0.0.1",
                   "overflow": o.overflow, "prefetch": prefetch, "remote": int(budget * o.remote), "batch": o.batch}
            join = None
            if setting == "throttled":
                g = ReaderCgroups(f"pyfastensor-bench-nodes-{os.getpid()}-{r}", support, memory_limit=0,
                                  device=device, iops=o.iops)
                groups.append(g)
                join = g.join
            errs.append(open(work / f"node-{r}.stderr", "w+"))
            env = child_env()
            prefix: list[str] = []
            if nets is not None:  # gloo picks its interface by hostname, which no namespace resolves: name it
                prefix, env["GLOO_SOCKET_IFNAME"] = nets.prefix(r), nets.veths[r]
            procs.append(subprocess.Popen([*prefix, sys.executable, "-m", "benchmarks.data_nodes", "--node",
                                           json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=errs[-1], text=True, env=env, preexec_fn=join))

        def failed(r: int, what: str) -> RuntimeError:
            procs[r].kill()
            procs[r].wait()
            errs[r].seek(0)
            return RuntimeError(f"node {r} of {world} ({mode}) {what} (exit {procs[r].returncode}): {errs[r].read()[-2000:]}")

        for r, p in enumerate(procs):
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise failed(r, f"failed before its epoch (it said {line!r}, not 'ready')")
        if setting == "throttled":
            disk.drop_caches([v / f for v in views[:world] for f in os.listdir(v)])
            # The nodes' libraries back into the cache (read here, outside their cgroups).
            disk.cache_files(sorted({f for p in procs for f in mapped_files(p.pid, exclude=views[0].parent)}))
        before = [(g.read_bytes() or 0, g.read_ios() or 0) for g in groups]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        nodes = []
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=1800)
            except subprocess.TimeoutExpired:
                raise failed(r, "did not finish in 1800 s") from None
            if p.returncode != 0:
                raise failed(r, "failed")
            nodes.append(json.loads(out.strip().splitlines()[-1]))
        read = [((g.read_bytes() or 0) - b, (g.read_ios() or 0) - i) for g, (b, i) in zip(groups, before, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in errs:
            f.close()
        for g in groups:
            g.remove()
    d = [n["stats"].get("dist", {}) for n in nodes]

    def total(key: str) -> int:
        return sum(int(x.get(key, 0)) for x in d)

    return {
        "nodes": world, "mode": mode, "prefetch": prefetch, "disk": setting,
        "epoch_s": max(n["seconds"] for n in nodes),
        "node_cpu_s": max(n["cpu_s"] for n in nodes),
        "samples": sum(n["samples"] for n in nodes),
        "remote_misses": total("remote_misses"), "remote_requests": total("remote_requests"),
        "remote_hits": total("remote_hits"), "prefetched": total("prefetched"),
        "remote_peak_bytes": max((int(x.get("remote_peak_bytes", 0)) for x in d), default=0),
        "remote_limit": int(budget * o.remote) if mode == "dist" else 0,
        "chunk_reads": sum(int(n["stats"]["chunk_reads"]) for n in nodes),
        "wasted_bytes": sum(int(n["stats"]["wasted_bytes"]) for n in nodes),
        "node_disk_bytes": max((b for b, _ in read), default=None),
        "node_disk_ios": max((i for _, i in read), default=None),
    }


def run_nodes(args: argparse.Namespace) -> int:
    """Run the benchmark with ``args`` (``add_nodes_options``); print the tables; 0."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        pack, data = _make_pack(Path(tmp), args.samples, args.sample_bytes, args.chunk_size)
        # A copy of the pack per node: each node its own files (and page cache), as on a volume of its own.
        views = [pack] + [Path(shutil.copytree(pack, Path(tmp, f"pack-node{r}"))) for r in range(1, max(args.nodes))]
        budget = int(data * args.budget)
        device, dev_name = block_device(pack)
        support = cgroup_support(device)
        support["memory"] = "not used"
        print(f"dataset: {args.samples} samples, {data / 2**20:.1f} MiB in chunks of {args.chunk_size}; "
              f"budget {budget / 2**20:.1f} MiB per node ({args.budget:.0%} of the data), remote memory "
              f"{args.remote:.0%} of it; {os.cpu_count()} cores shared by the nodes")
        rows: list[dict[str, Any]] = []
        nets: dict[int, Namespaces] = {}
        why = "" if args.netns else "--no-netns"
        for k in sorted(set(args.nodes)) if args.netns else ():
            ns, why = _namespaces(k)
            if why:
                break
            if ns is not None:
                nets[k] = ns
        if why:
            for ns in nets.values():
                ns.close()
            nets.clear()
            print(f"nodes: processes on loopback (not in network namespaces: {why})")
        elif nets:
            print(f"nodes: each in a network namespace of its own, joined by veth pairs to a bridge "
                  f"({', '.join(f'{ns.subnet}.0/24' for ns in nets.values())})")
        try:
            _run_settings(args, rows, views, budget, device, dev_name, support, nets)
        finally:
            for ns in nets.values():
                ns.close()
    print(format_report(rows, args.iops))
    if args.json:
        write_json(rows, args.json)
    return 0


def _run_settings(args: argparse.Namespace, rows: list[dict[str, Any]], views: list[Path], budget: int, device: str,
                  dev_name: str, support: dict[str, str], nets: dict[int, Namespaces]) -> None:
    """Every disk setting's rounds, appended to ``rows``."""
    for setting in args.disk:
        if setting == "throttled":
            why = support["throttle"] or ("" if disk.can_drop_caches() else "cannot drop the page cache (not root)")
            if why:
                print(f"disk throttled: skipped: {why}")
                continue
            print(f"disk throttled: each node's reads limited to {args.iops} requests/s on {dev_name} "
                  f"({device}) in a blkio cgroup of its own; page cache dropped before the start")
        else:
            disk.cache_files(sorted(f for v in views for f in v.iterdir()))  # the protocol measured, not the disk
            print("disk cached: the pack in the page cache")
        variants = [(1, "single", False)] + [(k, m, pf) for k in args.nodes if k > 1
                                             for m, pf in (("alone", False), ("dist", False), ("dist", True))]
        for rnd in range(args.rounds):  # interleaved: each round runs every variant once
            for k, m, pf in variants:
                row = _run_variant(views, k, m, pf, args, budget, setting, device, support, nets.get(k))
                rows.append(dict(row, round=rnd, netns=k in nets))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def format_report(rows: list[dict[str, Any]], iops: int = DEFAULT_IOPS) -> str:
    """Tables 4 and 5 remade, one per disk setting: epoch time (median [min-max] over rounds), remote misses
    and requests per variant, and the targets (the epoch-time target judged on the throttled disk, the one
    Brand is for, as the median of per-round ratios)."""
    if not rows:
        return "no rows"
    head = (f"{'variant':<36}{'epoch s [min-max]':>20}{'vs 1 node':>10}{'node CPU s':>11}{'node disk':>15}"
            f"{'to others':>11}{'remote misses':>15}{'hits':>7}{'calls':>7}{'chunk reads':>13}{'remote peak/limit':>20}")
    lines: list[str] = []
    verdicts: list[str] = []
    for setting in dict.fromkeys(r["disk"] for r in rows):
        part = [r for r in rows if r["disk"] == setting]
        rounds = sorted({r.get("round", 0) for r in part})
        keys = list(dict.fromkeys((r["nodes"], r["mode"], r["prefetch"]) for r in part))

        def runs(key: tuple[int, str, bool], part: list[dict[str, Any]] = part) -> list[dict[str, Any]]:
            return [r for r in part if (r["nodes"], r["mode"], r["prefetch"]) == key]

        def per_round(a: tuple[int, str, bool], b: tuple[int, str, bool]) -> list[float]:
            ea = {r.get("round", 0): r["epoch_s"] for r in runs(a)}
            eb = {r.get("round", 0): r["epoch_s"] for r in runs(b)}
            return [ea[x] / max(eb[x], 1e-9) for x in sorted(ea) if x in eb]

        title = (f"disk throttled to {iops} read requests/s per node (cold cache)" if setting == "throttled"
                 else "pack in the page cache (the protocol's own cost)")
        lines += ["", f"{title}; {len(rounds)} round(s)", head, "-" * len(head)]
        for key in keys:
            rs = runs(key)
            k, mode, prefetch = key
            r = rs[-1]  # counts from the last round (they vary little between rounds)
            ep = [x["epoch_s"] for x in rs]
            name = {"single": "single-node loader, whole epoch",
                    "alone": f"{k} nodes, single-node loader each",
                    "dist": f"{k} nodes, " + ("owner-prefetch" if prefetch else "no prefetch")}[mode]
            peak = (f"{max(x['remote_peak_bytes'] for x in rs) / 2**10:.0f}/{r['remote_limit'] / 2**10:.0f} KiB"
                    if mode == "dist" else "-")
            node_disk = (f"{r['node_disk_bytes'] / 2**20:.1f}M/{r['node_disk_ios']}"
                         if r.get("node_disk_bytes") is not None else "-")
            epoch = f"{_median(ep):.2f} [{min(ep):.2f}-{max(ep):.2f}]"
            vs = _median(per_round(key, (1, "single", False)))
            lines.append(f"{name:<36}{epoch:>20}{vs:>9.2f}x{_median([x['node_cpu_s'] for x in rs]):>11.2f}"
                         f"{node_disk:>15}{r['remote_hits'] + r['remote_misses']:>11}{r['remote_misses']:>15}"
                         f"{r['remote_hits']:>7}{r['remote_requests']:>7}{r['chunk_reads']:>13}{peak:>20}")
        for k in sorted({key[0] for key in keys if key[1] == "dist"}):
            off, on = runs((k, "dist", False)), runs((k, "dist", True))
            cut = 1 - sum(r["remote_misses"] for r in on) / max(sum(r["remote_misses"] for r in off), 1)
            ok_cut = "met" if cut >= 0.5 else "MISSED"
            ratios = per_round((k, "dist", True), (k, "alone", False))
            ratio = _median(ratios)
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
            if setting == "throttled":
                judged = "met" if ratio <= 1 else "MISSED"
            else:
                judged = "not judged here: the target is the throttled disk's"
            verdicts.append(f"{setting}, {k} nodes: owner-prefetch cuts remote misses by {cut:.0%} (target >= 50%: "
                            f"{ok_cut}); epoch {_median([r['epoch_s'] for r in on]):.2f}s against "
                            f"{_median([r['epoch_s'] for r in runs((k, 'alone', False))]):.2f}s with a single-node "
                            f"loader per node (paired {ratio:.2f}x, rounds {spread}; target no slower: {judged}); "
                            f"{_median([r['epoch_s'] for r in runs((1, 'single', False))]):.2f}s for the whole epoch "
                            f"on one node")
    lines += ["", "single-node loader each: every node reads its share of the epoch from a loader of its own over the "
              "whole pack (no exchange, so not exactly once across nodes: the baseline per node); node disk: the "
              "busiest node's bytes and read requests on the disk (its blkio cgroup); to others: requests "
              "for other nodes' slots; remote misses: those not in the remote memory, asked of their owner (the "
              "paper's remote data requests); hits: served from prefetched samples; calls: gRPC calls to owners (a "
              "batch's misses, one per owner); node CPU s: the busiest node's process CPU time over its epoch (its Go "
              "threads included). Counts are the last round's. All nodes share this machine's cores: a noisy "
              "two-core VM, hence the rounds.", ""] + verdicts
    return "\n".join(lines)


def _main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_nodes")
    p.add_argument("--node", required=True, help="one node's JSON config (internal)")
    cfg = json.loads(p.parse_args().node)
    reply = reply_channel()
    print(json.dumps(_node(cfg, reply)), file=reply, flush=True)
    os._exit(0)


if __name__ == "__main__":
    _main()

"""A distributed ChunkDataset: several nodes, each a process of a gloo process group.

Nodes run on this machine on loopback ports (and, where ``ip netns`` works,
in network namespaces joined by a veth pair, each listening on its own
interface). Checked: the union of what the nodes deliver in an epoch is
every sample once, each with its file's bytes; owner-prefetch cuts the
requests that miss the remote memory; the remote memory stays within its
limit; a cluster resumes mid-epoch from every node's state in new
processes; a node killed mid-epoch makes the others raise NodeFailedError
naming it; a node without the job's token is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from data_helpers import CLASSES, PER_CLASS

from pyfastensor import _lib, errors
from pyfastensor.data import ChunkDataset, _dist, _native

N = len(CLASSES) * PER_CLASS
WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parent.parent
#: Of the budget, for spares: a small share leaves the slots abstract chunks enough for every node.
OVERFLOW = 0.3




@pytest.fixture(scope="module")
def files(source) -> dict[str, int]:
    """sha1 of each file's bytes -> its label."""
    return {hashlib.sha1(data).hexdigest(): label for data, (_, label) in source[1].items()}


@pytest.fixture(scope="module")
def budget(source) -> int:
    """A node's budget: 30% of the data, the cluster's memory below the data (refills happen)."""
    return int(0.3 * sum(len(b) for b in source[1]))


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _run(tmp: Path, cfgs: list[dict], prefix: list[list[str]] | None = None, timeout: float = 120,
         kill: tuple[int, str, str] | None = None) -> list[dict]:
    """Run one process per config (a rank); return their results. ``kill``: (rank, its ready
    file, the file that tells the others it was killed): SIGKILL that rank once it is ready."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(WORKER.parent)]))
    procs = []
    for k, cfg in enumerate(cfgs):
        cfg["out"] = str(tmp / f"result-{cfg['rank']}-{time.monotonic_ns()}.json")
        cmd = (prefix[k] if prefix else []) + [sys.executable, str(WORKER), json.dumps(cfg)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        if kill is not None:
            rank, ready, killed = kill
            deadline = time.monotonic() + timeout
            while not os.path.exists(ready):
                assert time.monotonic() < deadline, "the node to kill never got ready"
                assert procs[rank].poll() is None, procs[rank].stdout.read().decode()
                time.sleep(0.05)
            procs[rank].send_signal(signal.SIGKILL)
            procs[rank].wait()
            Path(killed).touch()
        out = []
        for k, p in enumerate(procs):
            if kill is not None and k == kill[0]:
                continue
            log = p.communicate(timeout=timeout)[0].decode()
            assert p.returncode == 0, log
            res = json.loads(Path(cfgs[k]["out"]).read_text())
            res["log"] = log
            out.append(res)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _cluster(packed: Path, budget: int, world: int, host: str = "127.0.0.1", **kw) -> list[dict]:
    port = _free_port(host)
    return [dict(pack=str(packed), rank=r, world=world, master_addr=host, port=port, budget=budget,
                 overflow=OVERFLOW, **kw) for r in range(world)]


def _require_exactly_once(results: list[dict], files: dict[str, int]) -> None:
    """The union of the nodes' samples: every position once, each with its file's bytes and label."""
    for res in results:
        assert "error" not in res, res["error"]
    items = [tuple(it) for res in results for it in res["items"]]
    positions = sorted(pos for pos, _, _ in items)
    assert positions == list(range(N)), f"{len(items)} samples for {N} positions"
    assert len({sha for _, _, sha in items}) == N, "a sample's bytes delivered twice"
    for pos, label, sha in items:
        assert files.get(sha) == label, f"position {pos}: bytes or label not those of a source file"


def _dist_sum(results: list[dict], key: str) -> int:
    return sum(int(r["stats"]["dist"][key]) for r in results)


def test_three_nodes_with_workers_deliver_each_sample_once(packed, files, budget, tmp_path):
    results = _run(tmp_path, _cluster(packed, budget, 3, workers=2, batch=8))
    _require_exactly_once(results, files)
    for res in results:
        layout = res["layout"]
        assert layout["chunks_per_group"] > 1, "less memory than data: chunks share abstract chunks"
        assert res["addresses"] == results[0]["addresses"]
        assert all(a.startswith("127.0.0.1:") for a in res["addresses"]), "listening on the store's interface"
    d = [r["stats"]["dist"] for r in results]
    assert sum(x["local_requests"] + x["remote_hits"] + x["remote_misses"] for x in d) == N
    assert sum(x["served_remote"] for x in d) == sum(x["remote_misses"] for x in d), "each miss served by its owner"


def test_prefetch_cuts_remote_misses_within_the_remote_limit(packed, files, budget, tmp_path):
    remote = 6000
    without = _run(tmp_path, _cluster(packed, budget, 2, prefetch=False, remote=remote))
    with_ = _run(tmp_path, _cluster(packed, budget, 2, prefetch=True, remote=remote))
    _require_exactly_once(without, files)
    _require_exactly_once(with_, files)
    assert _dist_sum(without, "remote_hits") == 0 and _dist_sum(without, "prefetched") == 0
    misses0, misses1 = _dist_sum(without, "remote_misses"), _dist_sum(with_, "remote_misses")
    assert misses0 > 0
    assert misses1 < misses0, f"remote misses {misses0} without prefetch, {misses1} with"
    assert _dist_sum(with_, "remote_hits") == _dist_sum(with_, "prefetched"), "every prefetched sample consumed"
    for res in with_:
        d = res["stats"]["dist"]
        assert d["remote_limit"] == remote
        assert 0 < d["remote_peak_bytes"] <= remote, f"rank {res['rank']}: remote memory {d['remote_peak_bytes']} > {remote}"
        assert d["remote_held_bytes"] == 0


def test_cluster_resumes_after_every_node_restarts(packed, files, budget, tmp_path):
    states = [str(tmp_path / f"state-{r}.pt") for r in range(2)]
    first = _run(tmp_path, [dict(c, stop_after=3, state_out=states[c["rank"]])
                            for c in _cluster(packed, budget, 2, remote=8000)])
    for res in first:
        assert "error" not in res, res["error"]
        assert len(res["items"]) == 3 * 16
    second = _run(tmp_path, [dict(c, state_in=states[c["rank"]]) for c in _cluster(packed, budget, 2, remote=8000)])
    _require_exactly_once([*first, *second], files)


def test_torchrun_needs_no_configuration(packed, files, budget, tmp_path):
    out = tmp_path / "torchrun.json"
    cfg = {"pack": str(packed), "budget": budget, "overflow": OVERFLOW, "torchrun": True, "out": str(out)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(WORKER.parent)]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(_free_port()), str(WORKER), json.dumps(cfg)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    _require_exactly_once(results, files)
    assert all(a.startswith("127.0.0.1:") for a in results[0]["addresses"])


def test_killed_node_makes_the_others_fail_clearly(packed, budget, tmp_path):
    ready, killed = str(tmp_path / "ready"), str(tmp_path / "killed")
    cfgs = _cluster(packed, budget, 2, timeout=20.0)
    cfgs[1].update(hang=True, ready=ready)
    cfgs[0].update(wait_for=killed)
    (res,) = _run(tmp_path, cfgs, kill=(1, ready, killed))
    assert res.get("error_type") == "NodeFailedError", res.get("error", res["log"])
    addr1 = res["addresses"][1]
    assert f"to node 1 ({addr1}) failed" in res["error"]
    assert len(res["items"]) < N // 2 + 1


def test_node_without_the_job_token_is_refused(packed, budget, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=__import__("datetime").timedelta(seconds=10))
    # Rank 1 is an intruder: a server with another token than the one rank 0 makes.
    rogue = _native.Server(packed, budget, 0, OVERFLOW, 1, 2)
    try:
        addr1 = rogue.dist_listen({"rank": 1, "world": 2, "token": "not-the-job-token", "timeout_s": 5}, "127.0.0.1:0")
        prefix = f"pyfastensor/data/ds{_dist._datasets + 1}/"
        store.set(prefix + "addr/1", addr1)
        store.set(prefix + "barrier/1/1", "1")
        before = _lib.handle_count()
        with pytest.raises(errors.NodeFailedError, match=f"hello to node 1 \\({addr1}\\) failed.*node 1 refuses "
                           r"/pyfastensor.loader.dist.Brand/Hello: the call carries another token than this job's"):
            ChunkDataset(packed, memory_budget=budget, overflow=OVERFLOW, rank=0, world_size=2, store=store, timeout=5)
        assert _lib.handle_count() == before, "the refused node's server is closed"
        addr0 = bytes(store.get(prefix + "addr/0")).decode()
        assert addr0.startswith("127.0.0.1:"), f"rank 0 listens on {addr0}, not the store's interface"
    finally:
        rogue.close()


def _netns_available() -> str | None:
    """Why the network-namespace variant cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for `ip netns add`"
    probe = subprocess.run(["ip", "netns", "add", "pft-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns add` is not permitted here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "pft-probe"], capture_output=True)
    return None


@pytest.fixture
def two_namespaces():
    """Two network namespaces joined by a veth pair: 10.231.0.1/24 and 10.231.0.2/24."""
    why = _netns_available()
    if why:
        pytest.skip(why)
    ns = [f"pft-ns{os.getpid()}-{k}" for k in range(2)]
    veth = [f"pft{os.getpid() % 100000}v{k}" for k in range(2)]

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        for n in ns:
            ip("netns", "add", n)
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for k in range(2):
            ip("link", "set", veth[k], "netns", ns[k])
            ip("-n", ns[k], "addr", "add", f"10.231.0.{k + 1}/24", "dev", veth[k])
            ip("-n", ns[k], "link", "set", veth[k], "up")
            ip("-n", ns[k], "link", "set", "lo", "up")
        yield list(zip(ns, veth, strict=True))
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_nodes_in_network_namespaces_over_veth(packed, files, budget, tmp_path, two_namespaces):
    cfgs = _cluster(packed, budget, 2, host="127.0.0.1")
    for c, (_, veth) in zip(cfgs, two_namespaces, strict=True):
        # gloo picks its interface from the hostname, which no namespace resolves: name it
        c.update(master_addr="10.231.0.1", env={"GLOO_SOCKET_IFNAME": veth})
    results = _run(tmp_path, cfgs, prefix=[["ip", "netns", "exec", ns] for ns, _ in two_namespaces], timeout=90)
    _require_exactly_once(results, files)
    assert results[0]["addresses"][0].startswith("10.231.0.1:")
    assert results[0]["addresses"][1].startswith("10.231.0.2:"), "each node listens on its own interface"
    assert _dist_sum(results, "remote_misses") > 0


def _bench_nodes(tmp_path, *args):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "data-nodes", "--nodes", "2", "--samples", "600",
                           "--sample-bytes", "1500", "--json", str(out), *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_bench_data_nodes_prints_both_variants(tmp_path):
    stdout, rows = _bench_nodes(tmp_path, "--disk", "cached", "--rounds", "2")
    assert [(r["round"], r["nodes"], r["mode"], r["prefetch"]) for r in rows] == [
        (rnd, k, m, pf) for rnd in (0, 1) for k, m, pf in ((1, "single", False), (2, "alone", False),
                                                           (2, "dist", False), (2, "dist", True))]
    assert all(r["samples"] == 600 and r["disk"] == "cached" for r in rows), "each variant reads one whole epoch"
    for r in rows[2::4]:
        assert r["remote_hits"] == 0
    for r in rows[3::4]:
        assert r["remote_hits"] == r["prefetched"] > 0 and r["remote_peak_bytes"] <= r["remote_limit"]
    assert "cached, 2 nodes: owner-prefetch cuts remote misses by" in stdout
    assert "2 round(s)" in stdout and "rounds " in stdout, "the spread over rounds is shown"
    why = _netns_available()
    if why:
        assert "nodes: processes on loopback" in stdout and not any(r["netns"] for r in rows)
    else:  # each node in a namespace of its own, all of them removed after
        assert "nodes: each in a network namespace of its own" in stdout
        assert all(r["netns"] for r in rows if r["nodes"] > 1)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "pft-bench-" not in left, left


def test_bench_data_nodes_throttled(tmp_path):
    from benchmarks.harness import block_device, cgroup_support
    from pyfastensor.bench import disk

    why = cgroup_support(block_device(tmp_path)[0])["throttle"] or ("" if disk.can_drop_caches() else "not root")
    stdout, rows = _bench_nodes(tmp_path, "--disk", "throttled", "--rounds", "1", "--iops", "2000")
    if why:
        assert rows == [] and f"disk throttled: skipped: {why}" in stdout
        pytest.skip(f"the throttled setting cannot run here: {why}")
    assert [r["disk"] for r in rows] == ["throttled"] * 4
    for r in rows:  # every node's reads in its blkio cgroup: the pack is read cold, from the disk
        assert r["samples"] == 600 and r["node_disk_bytes"] > 0 and r["node_disk_ios"] > 0, r
    assert "disk throttled to 2000 read requests/s per node" in stdout
    assert "throttled, 2 nodes: owner-prefetch cuts remote misses by" in stdout


def test_a_ranks_state_does_not_load_into_one_node(packed, budget):
    with ChunkDataset(packed, memory_budget=budget, overflow=OVERFLOW) as ds:
        state = dict(ds.state_dict(), rank=1, world=2, issued=0)
        with pytest.raises(errors.InvalidArgumentError, match=r"the state of rank 1 of a cluster of 2 node\(s\); "
                           r"this ChunkDataset is rank 0 of 1"):
            ds.load_state_dict(state)
        ds.load_state_dict(ds.state_dict())  # its own loads

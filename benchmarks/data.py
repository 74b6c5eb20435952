"""``python -m benchmarks data``: ChunkDataset (Brand) against torch's DataLoader, Streaming, WebDataset and LitData.

A class-sorted dataset (``--files`` samples of ``--file-size`` bytes in
``--classes`` classes, written in class order) is read one epoch at a time,
cold, by five loaders with the same batch size and workers:

- ``DataLoader (files)``: torch's ``DataLoader`` over the plain files with a
  ``RandomSampler`` (a full shuffle, one file read per sample);
- ``Streaming (MDS)``: MosaicML Streaming over local MDS shards, its default
  shuffle (``py1e``);
- ``WebDataset (tar)``: tar shards, its shard shuffle and sample buffer;
- ``LitData (optimized)``: Lightning's ``litdata.optimize`` chunks and its
  ``StreamingDataset(shuffle=True)`` through its ``StreamingDataLoader``;
- ``ChunkDataset``: a pyfastensor pack of ``--chunk-size`` chunks within
  ``--budget``.

Each epoch runs in a process of its own placed, as root, in a memory cgroup
(v1 ``memory.limit_in_bytes``: the reader's memory and its page cache
together, so no loader reads from a cache larger than the budget) and a
blkio cgroup (its device reads; with ``--throttle``, its read IOPS limit),
after ``sync; echo 3 > drop_caches``. What cannot be done here (not root,
no cgroup v1, no block device) is printed with the reason and the run goes
on without it.

The figures (see :func:`format_report`): samples/s (median of the rounds,
min-max), bytes read from the device over the dataset's bytes, the reader's
peak memory (cgroup) and ChunkDataset's own (``stats()``), and the
randomness of the order beside a full shuffle: label entropy per batch,
distinct shards or chunks per batch, Spearman correlation between delivery
order and position on disk, and Streaming's shuffle-quality metric (the
entropy of the differences between consecutive sample indices).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyfastensor import config

from . import data_loaders as dlm
from .data_loaders import FORMAT_DIRS, LOADER_NAMES, LOADERS
from .harness import (
    ReaderCgroups,
    add_command,
    block_device,
    cgroup_support,
    child_env,
    disk,
    diskstats_read_bytes,
    finish,
    mapped_files,
    save_figure,
)
from .workloads import small_cnn

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Disk settings: plain, and read IOPS throttled.
SETTINGS = ("plain", "throttled")
#: Targets: ChunkDataset's samples/s over DataLoader's, per setting.
TARGET_VS_DATALOADER = {"plain": 1.3, "throttled": 2.0}
#: ChunkDataset's label entropy per batch may be this far below the full shuffle's.
ENTROPY_TOLERANCE = 0.05
#: Wasted reads (bytes read from the device / dataset bytes - 1) must stay below this.
WASTE_TARGET = 0.10

_DESCRIPTION = """\
Read one epoch of a class-sorted dataset, cold, through five loaders with the
same --batch-size and --workers, and compare: torch's DataLoader over the
plain files (RandomSampler, a full shuffle), MosaicML Streaming over local MDS
shards (its default shuffle), WebDataset over tar shards (shard shuffle and a
1000-sample buffer), LitData over its optimized chunks (its shuffle), and
pyfastensor's ChunkDataset over a pack (Brand).
Streaming, WebDataset and LitData are optional (pip install -r benchmarks/requirements.txt); one
that is missing is printed as skipped, with the reason.

Each epoch runs in a process of its own, after sync; echo 3 > drop_caches,
inside a memory cgroup (cgroup v1 memory.limit_in_bytes = --memory-limit: the
reader's memory and its page cache together) and a blkio cgroup that counts
its device reads (blkio.throttle.io_service_bytes) and, in the throttled
setting, limits them to --iops reads/s (blkio.throttle.read_iops_device on the
data directory's disk). Both need root and cgroup v1; without them the run
goes on, printing what it could not do (device reads then come from
/proc/diskstats, which counts the whole machine's reads).

Printed per loader and setting: samples/s (median of --rounds, min-max),
bytes read from the device over the dataset's bytes (wasted: read/dataset - 1;
ChunkDataset's own count from stats() beside it), peak memory (the cgroup's
memory.max_usage_in_bytes, page cache included; ChunkDataset's
stats()["peak_bytes"]). The order each loader delivered (every sample carries
its index) is checked to hold every sample exactly once and measured beside a
full shuffle: label entropy per batch (bits), distinct shards or chunks per
batch, Spearman correlation between delivery order and position on disk, and
Streaming's metric (entropy of |differences| of consecutive indices). Targets:
ChunkDataset >= 2x DataLoader's samples/s throttled and >= 1.3x on
the plain disk; >= Streaming's and WebDataset's samples/s in both settings with
label entropy per batch within 5% of the full shuffle; wasted reads < 10%.

--convergence adds a check of what the order does to training: a small CNN on
class-sorted 32x32 synthetic images, a few epochs through a full shuffle,
ChunkDataset and WebDataset, loss curves and test accuracy side by side.

The datasets are written once under --dir and reused by later runs with the
same sizes (--clean removes them at the end).
"""


# ---------------------------------------------------------------- metrics


def label_entropy(labels: np.ndarray, batch_sizes: Sequence[int]) -> np.ndarray:
    """Shannon entropy (bits) of the label distribution of each batch.

    Args:
        labels: the labels in delivery order.
        batch_sizes: the batches' sizes, in order (summing to ``len(labels)``).

    Returns:
        One entropy per batch: 0 for a batch of one class, ``log2(k)`` for ``k``
        classes in equal numbers.
    """
    out = np.empty(len(batch_sizes), dtype=np.float64)
    lo = 0
    for b, n in enumerate(batch_sizes):
        _, counts = np.unique(labels[lo:lo + n], return_counts=True)
        p = counts / counts.sum() if n else counts
        out[b] = float(-(p * np.log2(p)).sum()) if n else 0.0
        lo += n
    return out


def distinct_per_batch(groups: np.ndarray, batch_sizes: Sequence[int]) -> np.ndarray:
    """The number of distinct values of ``groups`` (shards or chunks) in each batch."""
    out = np.empty(len(batch_sizes), dtype=np.int64)
    lo = 0
    for b, n in enumerate(batch_sizes):
        out[b] = len(np.unique(groups[lo:lo + n]))
        lo += n
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their ranks), from 0."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    if np.any(counts > 1):
        sums = np.bincount(inverse, weights=ranks)
        ranks = (sums / counts)[inverse]
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (ties averaged); 0.0 when either is constant."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) != len(b):
        raise ValueError(f"spearman of {len(a)} and {len(b)} values")
    if len(a) < 2:
        return 0.0
    ra, rb = _ranks(a), _ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else 0.0


def diff_entropy(order: np.ndarray) -> float:
    """Streaming's shuffle-quality metric: entropy (bits) of ``|order[k+1] - order[k]|``.

    As MosaicML Streaming's simulator computes it (``get_entropy``): the
    distribution of the absolute differences between consecutive sample
    indices. 0 for an order read in sequence (every difference 1); a full
    shuffle of n samples gives about ``log2(n)`` minus a bit.
    """
    order = np.asarray(order, dtype=np.int64)
    if len(order) < 2:
        return 0.0
    diffs = np.abs(np.diff(order))
    freqs = np.bincount(diffs)
    freqs = freqs[freqs != 0]
    p = freqs / (len(order) - 1)
    return float(-(p * np.log2(p)).sum())


def order_metrics(index: np.ndarray, label: np.ndarray, position: np.ndarray, group: np.ndarray | None,
                  batch_sizes: Sequence[int], files: int) -> dict[str, Any]:
    """The randomness figures of one delivered epoch, and whether it held every sample once.

    Args:
        index: each delivered sample's index (class-sorted: index order is class order).
        label: its label.
        position: where it lies on disk in the loader's format.
        group: its shard or chunk (None or all -1: plain files, not counted).
        batch_sizes: the batches' sizes in delivery order.
        files: the dataset's samples.

    Returns:
        ``label_entropy`` (mean bits per batch), ``label_entropy_batches``
        (per batch), ``distinct_groups`` (mean per batch, or None),
        ``spearman_disk`` (delivery order vs position on disk),
        ``diff_entropy`` (Streaming's metric), ``missing``, ``duplicated``,
        ``exactly_once``.
    """
    ent = label_entropy(label, batch_sizes)
    counts = np.bincount(index[(index >= 0) & (index < files)], minlength=files)
    missing = int(np.count_nonzero(counts == 0))
    duplicated = int((counts[counts > 1] - 1).sum()) + int(np.count_nonzero((index < 0) | (index >= files)))
    has_groups = group is not None and len(group) and bool(np.any(group >= 0))
    return {
        "label_entropy": float(ent.mean()) if len(ent) else 0.0,
        "label_entropy_batches": ent.tolist(),
        "distinct_groups": float(distinct_per_batch(group, batch_sizes).mean()) if has_groups else None,
        "spearman_disk": spearman(np.arange(len(position)), position),
        "diff_entropy": diff_entropy(index),
        "missing": missing,
        "duplicated": duplicated,
        "exactly_once": missing == 0 and duplicated == 0 and len(index) == files,
    }


def full_shuffle_metrics(files: int, classes: int, batch_size: int, chunk_size: int,
                         seed: int = 0) -> dict[str, Any]:
    """The same figures for a uniform random permutation (computed, not read).

    Distinct chunks per batch are counted over chunks of ``chunk_size``
    consecutive indices: for a uniform permutation every partition into equal
    chunks gives the same distribution, so it is the reference for
    ChunkDataset's chunks (and, with their sizes, roughly for shards).
    """
    perm = np.random.default_rng(seed).permutation(files).astype(np.int64)
    sizes = [min(batch_size, files - lo) for lo in range(0, files, batch_size)]
    return order_metrics(perm, dlm.label_of(perm, files, classes), perm, perm // chunk_size, sizes, files)


# ---------------------------------------------------------------- one epoch in a child


def run_reader(loader: str, root: Path, *, batch_size: int, workers: int, seed: int, budget: int,
               epoch: int, support: dict[str, str], memory_limit: int, device: str, iops: int,
               work: Path, timeout: float | None = None) -> dict[str, Any]:
    """Read one epoch through ``loader``, cold, in a child process held by the cgroups.

    Returns:
        :func:`~.data_loaders.read_epoch`'s result, plus ``device_read``
        (bytes, from the blkio cgroup, else /proc/diskstats), ``device_read_source``,
        ``peak_memory`` (cgroup, or None), ``cache`` (how the caches were dropped),
        and ``error`` (the child's last lines if it failed, else ``""``). The
        caches are dropped and the counters started once the child has built
        its loader (imports done), so neither counts its libraries.
    """
    out = work / f"{loader}-{epoch}-{os.getpid()}.json"
    cmd = [sys.executable, "-m", "benchmarks.data_loaders", "read", "--loader", loader,
           "--root", str(root), "--batch-size", str(batch_size), "--workers", str(workers),
           "--seed", str(seed), "--epoch", str(epoch), "--budget", str(budget), "--out", str(out),
           "--handshake"]
    groups = ReaderCgroups(f"pyfastensor-bench-data-{os.getpid()}-{loader}", support,
                           memory_limit=memory_limit, device=device, iops=iops)
    env = child_env()
    env.setdefault("PYTHONWARNINGS", "ignore")
    err_path = work / f"{loader}-{epoch}.stderr"
    cache, before, after, peak, oom = "", None, None, None, 0
    cg_read: int | None = None
    cg_before: int | None = None
    ios: int | None = None
    ios_before: int | None = None
    try:
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, text=True,
                                    preexec_fn=groups.join if groups.dirs else None)
            try:
                # The child imports and builds its loader first; only then are the caches
                # dropped and the counters started, so neither counts the child's libraries.
                line = proc.stdout.readline().strip() if proc.stdout else ""
                if line == "ready":
                    cache = disk.drop_caches(_dataset_files(root, loader))
                    if cache == "drop_caches":
                        # Its libraries back into the cache (read here, outside its cgroups): code
                        # the reader first runs mid-epoch would otherwise be read from the disk
                        # (8 MiB of readaround a page fault here) and counted as its reads.
                        disk.cache_files(mapped_files(proc.pid, exclude=root))
                    groups.reset_peak()
                    cg_before = groups.read_bytes()
                    ios_before = groups.read_ios()
                    before = diskstats_read_bytes(device)
                    assert proc.stdin is not None
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return {"loader": loader, "error": f"abandoned after {timeout:g} s (--timeout)"}
            finally:
                for f in (proc.stdin, proc.stdout):
                    if f is not None:
                        f.close()
        after = diskstats_read_bytes(device)
        peak = groups.peak_memory()
        oom = groups.oom_kills()
        cg_after = groups.read_bytes()
        if cg_after is not None and cg_before is not None:
            cg_read = cg_after - cg_before
        ios_after = groups.read_ios()
        if ios_after is not None and ios_before is not None:
            ios = ios_after - ios_before
    finally:
        groups.remove()
    if proc.returncode != 0 or not out.exists():
        tail = err_path.read_text().strip().splitlines()[-3:]
        why = " | ".join(tail) or f"exit status {proc.returncode}"
        if proc.returncode < 0 and oom:
            why = f"killed (signal {-proc.returncode}) at the memory cgroup's limit: raise --memory-limit"
        return {"loader": loader, "error": why}
    result = dlm.load_result(out)
    out.unlink(missing_ok=True)
    Path(str(out) + ".npz").unlink(missing_ok=True)
    if cg_read is not None:
        result["device_read"], result["device_read_source"] = cg_read, "blkio cgroup"
    elif before is not None and after is not None:
        result["device_read"], result["device_read_source"] = after - before, "/proc/diskstats (whole machine)"
    else:
        result["device_read"], result["device_read_source"] = None, "unknown"
    result.update(peak_memory=peak, oom_kills=oom, cache=cache, error="", device_ios=ios)
    return result


def _dataset_files(root: Path, loader: str) -> list[str]:
    """The files a loader reads (for the fadvise fallback of drop_caches when not root)."""
    if disk.can_drop_caches():
        return []
    sub = FORMAT_DIRS[loader]
    return [os.path.join(d, f) for d, _, fs in os.walk(root / sub) for f in fs]


# ---------------------------------------------------------------- the benchmark


def run_bench(
    directory: str | os.PathLike[str],
    *,
    files: int = 100_000,
    file_size: int = 100 * KiB,
    classes: int = 1000,
    batch_size: int = 256,
    workers: int = 2,
    chunk_size: int = 64,
    shard_size: int = 64 * MiB,
    budget: int | None = None,
    budget_fraction: float = 0.10,
    memory_limit: int | None = None,
    iops: int = 1000,
    settings: Sequence[str] = SETTINGS,
    loaders: Sequence[str] = LOADERS,
    rounds: int = 1,
    seed: int = 0,
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write the dataset in every format (or reuse it), then read it through each loader.

    Args:
        directory: where the datasets live (``<directory>/<sizes>/``); kept for later runs.
        files, file_size, classes: the dataset (class-sorted).
        batch_size, workers: the same for every loader (ChunkDataset falls back
            to 0 workers where it cannot serve workers, saying so).
        chunk_size: samples per pack chunk. shard_size: bytes per MDS and tar shard.
        budget: ChunkDataset's memory budget; None: ``budget_fraction`` of the
            dataset, at least the pack's minimum.
        memory_limit: the memory cgroup's limit; None: the budget plus 1 GiB
            (the reader's processes).
        iops: the throttled setting's read IOPS.
        settings: among ``plain`` and ``throttled``.
        loaders: among :data:`~.data_loaders.LOADERS`.
        rounds: epochs per loader and setting (cold each time); the figures are medians.
        seed: seed of the contents, the pack and every shuffle.
        timeout: seconds one epoch may take before it is abandoned; None for no limit.
        progress: called with a line as the run goes, or None.

    Returns:
        A JSON-ready dict: ``settings`` (the run's parameters and the machine's
        support), ``skipped`` (loader or setting: why), ``runs`` (one entry per
        epoch read), ``order`` (randomness per loader, from its first epoch),
        ``full_shuffle``, ``summary`` and ``targets``.
    """
    say = progress or (lambda _s: None)
    t0 = time.perf_counter()
    unknown = [x for x in loaders if x not in LOADERS] + [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown loader or setting {', '.join(unknown)}: loaders are "
                         f"{', '.join(LOADERS)}, settings {', '.join(SETTINGS)}")
    root = Path(directory) / f"f{files}-s{file_size}-c{classes}-k{chunk_size}-h{shard_size}-r{seed}"
    skipped: dict[str, str] = {}
    active = []
    for name in loaders:
        why = dlm.peer_missing(name)
        if why:
            skipped[name] = why
        else:
            active.append(name)
    layout = dlm.write_datasets(root, files=files, file_size=file_size, classes=classes,
                                shard_bytes=shard_size, chunk_size=chunk_size, seed=seed,
                                formats=tuple(active), say=say)
    dataset_bytes = layout["dataset_bytes"]
    # The disk's own limit in the same run, beside which the loaders' plain-disk figures stand.
    say("measuring the disk's limit ...")
    limit = disk.measure_limit(root, size=min(256 * MiB, max(dataset_bytes, 16 * MiB)))
    device, dev_name = block_device(root)
    support = cgroup_support(device)
    min_budget = epoch_budget = 0
    chunk_workers = workers
    chunk_note = ""
    if "chunk" in active:
        from pyfastensor.data import ChunkDataset

        with ChunkDataset(root / "pack", memory_budget=max(dataset_bytes, 1 << 20)) as ds:
            min_budget = int(ds.layout["min_budget"])
            epoch_budget = int(ds.layout.get("epoch_budget", 0))
        if budget is None:
            budget = max(int(dataset_bytes * budget_fraction), min_budget)
        if budget < min_budget:
            raise ValueError(f"--budget {budget} is below the pack's minimum {min_budget} "
                             "(one abstract chunk and one chunk read)")
        if workers > 0:
            why = dlm.chunk_workers_supported(root / "pack", budget)
            if why:
                chunk_workers = 0
                chunk_note = f"ran with num_workers=0, not {workers}: {why}"
    budget = budget or max(int(dataset_bytes * budget_fraction), 1)
    if memory_limit is None:
        memory_limit = budget + GiB
    eff_settings = []
    for s in settings:
        if s == "throttled" and support["throttle"]:
            skipped["throttled"] = f"IOPS throttle not applied: {support['throttle']}"
        else:
            eff_settings.append(s)

    runs: list[dict[str, Any]] = []
    order: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix=".pyfastensor-bench-data-", dir=directory))
    try:
        for r in range(rounds):
            for s in eff_settings:
                # Rotate the loaders' order each round: no loader always runs first after a drop.
                turn = active[r % len(active):] + active[:r % len(active)] if active else []
                for name in turn:
                    w = chunk_workers if name == "chunk" else workers
                    res = run_reader(name, root, batch_size=batch_size, workers=w, seed=seed, budget=budget,
                                     epoch=r, support=support, memory_limit=memory_limit, device=device,
                                     iops=iops if s == "throttled" else 0, work=work, timeout=timeout)
                    entry = _run_entry(res, s, r, layout)
                    runs.append(entry)
                    if not res.get("error") and name not in order:
                        order[name] = order_metrics(res["index"], res["label"], res["position"],
                                                    res["group"], res["batch_sizes"].tolist(), files)
                    say(_progress_line(entry))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    full = full_shuffle_metrics(files, classes, batch_size, chunk_size, seed)
    summary = summarize(runs, active, eff_settings)
    params = {
        "dir": str(root.resolve()), "files": files, "file_size": file_size, "classes": classes,
        "dataset_bytes": dataset_bytes, "batch_size": batch_size, "workers": workers,
        "chunk_workers": chunk_workers, "chunk_note": chunk_note, "chunk_size": chunk_size,
        "shard_size": shard_size, "per_shard": layout["per_shard"],
        "mds_shards": _mds_shards(root) if "streaming" in active else None,
        "wds_shards": layout.get("wds_shards"), "budget": budget, "min_budget": min_budget, "epoch_budget": epoch_budget,
        "memory_limit": memory_limit, "iops": iops, "rounds": rounds, "seed": seed,
        "device": device, "device_name": dev_name if device else "", "device_note": "" if device else dev_name,
        "cgroups": support, "cold_method": disk.cold_cache_method(),
        "limit": limit.describe(), "limit_read_mbps": limit.read_mbps,
        "settings": list(eff_settings), "loaders": list(active),
    }
    result = {"settings": params, "skipped": skipped, "runs": runs, "order": order,
              "full_shuffle": full, "summary": summary}
    result["targets"] = evaluate_targets(result)
    result["elapsed_seconds"] = time.perf_counter() - t0
    return result


def _mds_shards(root: Path) -> int | None:
    try:
        return len(json.loads((root / "mds" / "index.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return None


def _run_entry(res: dict[str, Any], setting: str, rnd: int, layout: dict[str, Any]) -> dict[str, Any]:
    """One epoch's figures, JSON-ready."""
    e: dict[str, Any] = {"loader": res["loader"], "setting": setting, "round": rnd,
                         "error": res.get("error", "")}
    if e["error"]:
        return e
    ds_bytes = layout["dataset_bytes"]
    dev = res["device_read"]
    st = res.get("chunk_stats") or {}
    e.update(
        seconds=res["seconds"], samples=res["samples"],
        samples_per_s=res["samples"] / res["seconds"] if res["seconds"] > 0 else 0.0,
        device_read=dev, device_read_source=res["device_read_source"], device_ios=res.get("device_ios"),
        wasted=(dev / ds_bytes - 1) if dev is not None else None,
        loader_read=st.get("bytes_read"),
        loader_wasted=(st["bytes_read"] / ds_bytes - 1) if st else None,
        peak_memory=res["peak_memory"], chunk_peak=st.get("peak_bytes"),
        oom_kills=res.get("oom_kills", 0), workers=res["workers"], note=res["note"],
        mismatch=res["mismatch"], cache=res["cache"],
    )
    return e


def _progress_line(e: dict[str, Any]) -> str:
    head = f"round {e['round'] + 1} {e['setting']:<9} {LOADER_NAMES[e['loader']]:<20}"
    if e["error"]:
        return f"{head} FAILED: {e['error']}"
    dev = f"{e['device_read'] / MiB:.0f} MiB read" if e["device_read"] is not None else "reads unknown"
    return f"{head} {e['samples_per_s']:9.0f} samples/s ({e['seconds']:.1f} s, {dev})"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(runs: Sequence[dict[str, Any]], loaders: Sequence[str], settings: Sequence[str]) -> dict[str, Any]:
    """Per setting and loader: the median of the rounds (and min, max) of each figure.

    Returns:
        ``{setting: {loader: {"samples_per_s", "min", "max", "rounds",
        "device_read", "wasted", "loader_wasted", "peak_memory", "chunk_peak",
        "errors"}}}``; figures are None where no round succeeded.
    """
    out: dict[str, Any] = {}
    for s in settings:
        out[s] = {}
        for name in loaders:
            mine = [r for r in runs if r["loader"] == name and r["setting"] == s]
            ok = [r for r in mine if not r["error"]]
            sps = [r["samples_per_s"] for r in ok]

            def med(key: str, rows: list[dict[str, Any]] = ok) -> float | None:
                return _median([r[key] for r in rows if r.get(key) is not None])

            out[s][name] = {
                "samples_per_s": _median(sps), "min": min(sps) if sps else None,
                "max": max(sps) if sps else None, "rounds": sps,
                "device_read": med("device_read"), "device_ios": med("device_ios"), "wasted": med("wasted"),
                "loader_wasted": med("loader_wasted"),
                "peak_memory": max((r["peak_memory"] for r in ok if r.get("peak_memory") is not None),
                                   default=None),
                "chunk_peak": max((r["chunk_peak"] for r in ok if r.get("chunk_peak") is not None),
                                  default=None),
                "errors": [r["error"] for r in mine if r["error"]],
            }
    return out


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets against the summary: each ``{"name", "value", "goal", "met"}`` (met None: not measured)."""
    summ, order, full = result["summary"], result["order"], result["full_shuffle"]
    out: list[dict[str, Any]] = []

    def sps(s: str, name: str) -> float | None:
        return summ.get(s, {}).get(name, {}).get("samples_per_s")

    ours_ent = order.get("chunk", {}).get("label_entropy")
    ent_ok = ours_ent is not None and ours_ent >= (1 - ENTROPY_TOLERANCE) * full["label_entropy"]
    for s in SETTINGS:
        goal = TARGET_VS_DATALOADER[s]
        mine, base = sps(s, "chunk"), sps(s, "dataloader")
        ratio = mine / base if mine and base else None
        out.append({"name": f"{s}: ChunkDataset samples/s >= {goal:g}x DataLoader's",
                    "value": f"{ratio:.2f}x" if ratio is not None else "not measured",
                    "met": None if ratio is None else ratio >= goal})
        for peer in ("streaming", "webdataset", "litdata"):
            theirs = sps(s, peer)
            ratio = mine / theirs if mine and theirs else None
            peer_ent = order.get(peer, {}).get("label_entropy")
            theirs_txt = (f"; theirs {peer_ent / full['label_entropy']:.0%} of the full shuffle's"
                          if peer_ent is not None else "")
            out.append({"name": f"{s}: ChunkDataset samples/s >= {LOADER_NAMES[peer]}'s, label entropy "
                                f"within {ENTROPY_TOLERANCE:.0%} of the full shuffle",
                        "value": ("not measured" if ratio is None else
                                  f"{ratio:.2f}x, entropy {ours_ent / full['label_entropy']:.0%} of the full "
                                  f"shuffle's{theirs_txt}"),
                        "met": None if ratio is None else (ratio >= 1.0 and ent_ok)})
    for s in SETTINGS:
        w = summ.get(s, {}).get("chunk", {}).get("wasted")
        lw = summ.get(s, {}).get("chunk", {}).get("loader_wasted")
        val = w if w is not None else lw
        out.append({"name": f"{s}: ChunkDataset wasted reads < {WASTE_TARGET:.0%}",
                    "value": ("not measured" if val is None else
                              f"{w:+.1%} (device)" if w is not None else f"{lw:+.1%} (stats)")
                    + (f", {lw:+.1%} by its stats()" if w is not None and lw is not None else ""),
                    "met": None if val is None else val < WASTE_TARGET})
    return out


# ---------------------------------------------------------------- report


def _mib(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / MiB:.1f} MiB"


def format_report(result: dict[str, Any]) -> str:
    """Render :func:`run_bench`'s result (and the convergence check, if any) as the printed report."""
    p, summ, order, full = result["settings"], result["summary"], result["order"], result["full_shuffle"]
    cg = p["cgroups"]
    lines = [
        f"benchmarks data: {p['files']} files of {p['file_size']} bytes ({_mib(p['dataset_bytes'])}), "
        f"{p['classes']} classes, class-sorted, at {p['dir']}",
        f"every loader: batch {p['batch_size']}, {p['workers']} workers; ChunkDataset chunks of "
        f"{p['chunk_size']}, budget {_mib(p['budget'])} (pack minimum {_mib(p['min_budget'])}; a random "
        f"epoch reads each chunk once from about {_mib(p.get('epoch_budget'))}); "
        f"MDS and tar shards of {_mib(p['shard_size'])} ({p['per_shard']} samples)",
        "cold: " + p["cold_method"],
        p["limit"] + " (sequential O_DIRECT; the plain disk's 'of disk' column is a loader's MB/s of its read)",
        "memory cgroup: " + (f"limit {_mib(p['memory_limit'])} on the reader's memory and page cache"
                             if not cg["memory"] else f"not used ({cg['memory']})"),
        "device: " + (f"{p['device_name']} ({p['device']}); reads counted by "
                      + ("the reader's blkio cgroup" if not cg["blkio"] else
                         f"/proc/diskstats, the whole machine's ({cg['blkio']})")
                      if p["device"] else p["device_note"]),
    ]
    if p["chunk_note"]:
        lines.append(f"note: ChunkDataset {p['chunk_note']}")
    for name, why in result["skipped"].items():
        label = LOADER_NAMES.get(name, f"setting {name}")
        lines.append(f"  skipped {label}: {why}")
    lines.append("")

    for s in p["settings"]:
        title = ("plain disk" if s == "plain" else f"disk throttled to {p['iops']} read IOPS "
                 "(blkio.throttle.read_iops_device)")
        lines.append(f"{title}: samples/s median of {p['rounds']} round(s) [min-max]")
        lines.append(f"{'loader':<20}{'samples/s':>10}{'[min-max]':>16}{'vs DL':>7}{'of disk':>8}{'read':>11}"
                     f"{'wasted':>9}{'own count':>11}{'KiB/IO':>8}{'peak mem':>10}{'own peak':>10}")
        base = summ[s].get("dataloader", {}).get("samples_per_s")
        for name in p["loaders"]:
            e = summ[s][name]
            if e["samples_per_s"] is None:
                lines.append(f"{LOADER_NAMES[name]:<20} failed: {'; '.join(e['errors'])}")
                continue
            ratio = f"{e['samples_per_s'] / base:.2f}x" if base else "-"
            spread = f"[{e['min']:.0f}-{e['max']:.0f}]"
            wasted = "-" if e["wasted"] is None else f"{e['wasted']:+.1%}"
            own = "-" if e["loader_wasted"] is None else f"{e['loader_wasted']:+.1%}"
            per_io = (f"{e['device_read'] / e['device_ios'] / KiB:.0f}"
                      if e.get("device_ios") and e["device_read"] is not None else "-")
            of_disk = (f"{e['samples_per_s'] * p['dataset_bytes'] / p['files'] / 1e6 / p['limit_read_mbps']:.0%}"
                       if s == "plain" and p.get("limit_read_mbps") else "-")
            lines.append(f"{LOADER_NAMES[name]:<20}{e['samples_per_s']:>10.0f}{spread:>16}{ratio:>7}{of_disk:>8}"
                         f"{_mib(e['device_read']):>11}{wasted:>9}{own:>11}{per_io:>8}{_mib(e['peak_memory']):>10}"
                         f"{_mib(e['chunk_peak']) if e['chunk_peak'] is not None else '-':>10}")
            for err in e["errors"]:
                lines.append(f"  a round failed: {err}")
        lines.append("")
    lines.append("read: bytes the reader read from the device in the epoch; wasted: read / dataset - 1; "
                 "own count: ChunkDataset's stats() (bytes_read / dataset - 1); KiB/IO: bytes per read request "
                 "(blkio.throttle.io_serviced; the throttle counts requests); peak mem: the memory "
                 "cgroup's max usage (page cache included); own peak: stats()['peak_bytes']")
    lines.append("")

    lines.append("randomness of the order (first epoch of each loader) beside a full shuffle:")
    lines.append(f"{'loader':<24}{'once':>6}{'label H/batch':>15}{'vs full':>9}{'groups/batch':>14}"
                 f"{'spearman(disk)':>16}{'diff H':>8}")
    rows = [(f"full shuffle ({p['chunk_size']}-chunks)", full)] + [(LOADER_NAMES[n], order[n])
                                                                  for n in p["loaders"] if n in order]
    for label, m in rows:
        once = "yes" if m["exactly_once"] else f"no: {m['missing']} missing, {m['duplicated']} extra"
        groups = "-" if m["distinct_groups"] is None else f"{m['distinct_groups']:.1f}"
        lines.append(f"{label:<24}{once:>6}{m['label_entropy']:>15.3f}"
                     f"{m['label_entropy'] / full['label_entropy']:>9.1%}{groups:>14}"
                     f"{m['spearman_disk']:>16.3f}{m['diff_entropy']:>8.2f}")
    lines.append(f"label H/batch: entropy of the labels in a batch, bits (log2({p['classes']}) = "
                 f"{np.log2(p['classes']):.2f}); groups/batch: distinct shards (Streaming, WebDataset) or "
                 "chunks (ChunkDataset) in a batch; spearman(disk): rank correlation of delivery order "
                 "and position on disk (0: none); diff H: Streaming's metric, entropy of |index[k+1] - "
                 "index[k]|")
    lines.append("")
    lines.append("targets:")
    for t in result["targets"]:
        verdict = {True: "PASS", False: "short", None: "not measured"}[t["met"]]
        lines.append(f"  {verdict:<12} {t['name']}: {t['value']}")
    conv = result.get("convergence")
    if conv:
        lines.append("")
        lines.extend(format_convergence(conv))
    lines.append(f"elapsed {result['elapsed_seconds']:.0f} s")
    return "\n".join(lines)


# ---------------------------------------------------------------- convergence


CONV_LOADERS = ("dataloader", "chunk", "webdataset")
CONV_NAMES = {"dataloader": "full shuffle (DataLoader)", "chunk": "ChunkDataset",
              "webdataset": "WebDataset"}
_IMG = (3, 32, 32)


def synthetic_image(label: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """A 3x32x32 uint8 image of class ``label``: a grating whose orientation and frequency
    depend on the class, a class colour, random phase and noise."""
    angle = np.pi * (label % 8) / 8 + rng.normal(0, 0.05)
    freq = 0.15 + 0.1 * ((label // 8) % 4) + rng.normal(0, 0.01)
    y, x = np.mgrid[0:32, 0:32].astype(np.float32)
    wave = np.sin(freq * (x * np.cos(angle) + y * np.sin(angle)) * 2 + rng.uniform(0, 2 * np.pi))
    colour = np.array([(label * 37) % 256, (label * 91) % 256, (label * 53) % 256], np.float32)
    colour = colour / 255 * 0.6 + 0.2
    img = 0.5 + 0.4 * wave[None] * colour[:, None, None] + rng.normal(0, 0.15, _IMG)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def decode_image(data: Any) -> Any:
    """The transform: a sample's bytes (16-byte header, then 3x32x32 uint8) to a float tensor."""
    return data[dlm.HEADER:].reshape(_IMG).float().div_(255)


def run_convergence(directory: str | os.PathLike[str], *, files: int = 6000, classes: int = 10,
                    epochs: int = 3, batch_size: int = 64, chunk_size: int = 64,
                    budget_fraction: float = 0.10, seed: int = 0,
                    loaders: Sequence[str] = CONV_LOADERS,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train a small CNN on class-sorted synthetic images through each loader's order.

    Same model initialisation, optimiser (Adam, lr 1e-3) and batch size for
    every loader; in-process, ``num_workers=0`` (the order, not the speed, is
    measured). Test accuracy on a separate, balanced set after every epoch.

    Returns:
        ``{"settings": ..., "skipped": {loader: why}, "loaders": {loader:
        {"loss": [per step], "epoch_loss": [...], "accuracy": [per epoch]}}}``.
    """
    import torch

    say = progress or (lambda _s: None)
    size = dlm.HEADER + int(np.prod(_IMG))

    def make(i: int, label: int, rng: np.random.Generator) -> bytes:
        return np.array([i, label], "<i8").tobytes() + synthetic_image(label, classes, rng).tobytes()

    skipped = {n: dlm.peer_missing(n) for n in loaders if dlm.peer_missing(n)}
    active = [n for n in loaders if n not in skipped]
    root = Path(directory) / f"conv-f{files}-c{classes}-k{chunk_size}-r{seed}"
    per_shard = max(1, files // 20)  # 20 shards: the shard shuffle has something to shuffle
    layout = dlm.write_datasets(root, files=files, file_size=size, classes=classes,
                                shard_bytes=per_shard * size, chunk_size=chunk_size, seed=seed,
                                formats=tuple(active), make=make, say=say)
    budget = int(files * size * budget_fraction)
    if "chunk" in active:
        from pyfastensor.data import ChunkDataset

        with ChunkDataset(root / "pack", memory_budget=files * size) as ds:
            budget = max(budget, int(ds.layout["min_budget"]))
    rng = np.random.default_rng(seed + 1)
    test_y = np.arange(2000) % classes
    test_x = torch.from_numpy(np.stack([synthetic_image(int(y), classes, rng) for y in test_y])).float() / 255
    test_y_t = torch.from_numpy(test_y)
    out: dict[str, Any] = {}
    for name in active:
        torch.manual_seed(seed)
        model = small_cnn(classes)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses, epoch_loss, acc = [], [], []
        for epoch in range(epochs):
            dl, ds, _, _ = dlm.make_loader(name, root, layout, batch_size=batch_size, workers=0, seed=seed,
                                           budget=budget, transform=decode_image, epoch=epoch)
            model.train()
            mine = []
            for x, y, _pos in dl:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                mine.append(loss.item())
            if name == "chunk":
                ds.close()
            losses += mine
            epoch_loss.append(float(np.mean(mine)))
            model.eval()
            with torch.no_grad():
                acc.append(float((model(test_x).argmax(1) == test_y_t).float().mean()))
            say(f"convergence {CONV_NAMES[name]:<26} epoch {epoch + 1}: loss {epoch_loss[-1]:.3f}, "
                f"test accuracy {acc[-1]:.1%}")
        out[name] = {"loss": losses, "epoch_loss": epoch_loss, "accuracy": acc}
    return {"settings": {"files": files, "classes": classes, "epochs": epochs, "batch_size": batch_size,
                         "chunk_size": chunk_size, "budget": budget, "image": list(_IMG),
                         "shards": layout.get("wds_shards")},
            "skipped": skipped, "loaders": out}


def format_convergence(conv: dict[str, Any]) -> list[str]:
    """The convergence check's lines of the report."""
    s = conv["settings"]
    lines = [f"convergence: small CNN, {s['files']} class-sorted {s['image'][1]}x{s['image'][2]} images of "
             f"{s['classes']} classes, {s['epochs']} epochs, batch {s['batch_size']}, Adam lr 1e-3 "
             f"(ChunkDataset budget {_mib(s['budget'])}, chunks of {s['chunk_size']}; "
             f"WebDataset {s['shards']} shards)"]
    for name, why in conv["skipped"].items():
        lines.append(f"  skipped {CONV_NAMES[name]}: {why}")
    for name, r in conv["loaders"].items():
        lines.append(f"  {CONV_NAMES[name]:<26} loss by epoch "
                     + " ".join(f"{x:.3f}" for x in r["epoch_loss"])
                     + "; test accuracy " + " ".join(f"{a:.1%}" for a in r["accuracy"]))
    return lines


# ---------------------------------------------------------------- plot


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw the throughput bars, the label entropy per batch and (with --convergence) the loss curves as a PNG.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    p, summ, order, full = result["settings"], result["summary"], result["order"], result["full_shuffle"]
    conv = result.get("convergence")
    fig = Figure(figsize=(18 if conv else 12, 5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if conv else 2)
    colors = {"dataloader": "tab:blue", "streaming": "tab:orange", "webdataset": "tab:green", "litdata": "tab:purple",
              "chunk": "tab:red"}
    ax = axes[0]
    width = 0.8 / max(1, len(p["loaders"]))
    for k, name in enumerate(p["loaders"]):
        xs, ys, lo, hi = [], [], [], []
        for j, s in enumerate(p["settings"]):
            e = summ[s][name]
            if e["samples_per_s"] is None:
                continue
            xs.append(j + (k - (len(p["loaders"]) - 1) / 2) * width)
            ys.append(e["samples_per_s"])
            lo.append(e["samples_per_s"] - e["min"])
            hi.append(e["max"] - e["samples_per_s"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=colors[name], label=LOADER_NAMES[name])
    ax.set_xticks(range(len(p["settings"])),
                  ["plain disk" if s == "plain" else f"{p['iops']} read IOPS" for s in p["settings"]])
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title(f"one cold epoch, {p['files']} x {p['file_size'] // KiB} KiB, batch {p['batch_size']}")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1]
    ax.plot(full["label_entropy_batches"], color="black", lw=1, label="full shuffle (computed)")
    for name in p["loaders"]:
        if name in order:
            ax.plot(order[name]["label_entropy_batches"], color=colors[name], lw=0.8,
                    label=LOADER_NAMES[name])
    ax.set_xlabel("batch")
    ax.set_ylabel("label entropy per batch (bits)")
    ax.set_title(f"label entropy per batch ({p['classes']} classes, max {np.log2(p['classes']):.2f})")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)

    if conv:
        ax = axes[2]
        conv_colors = {"dataloader": "black", "chunk": "tab:red", "webdataset": "tab:green"}
        for name, r in conv["loaders"].items():
            loss = np.asarray(r["loss"])
            k = max(1, len(loss) // 100)
            smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
            ax.plot(smooth, color=conv_colors[name], lw=1,
                    label=f"{CONV_NAMES[name]} (test acc {r['accuracy'][-1]:.0%})")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (moving mean)")
        ax.set_title(f"convergence: small CNN, class-sorted images, {conv['settings']['epochs']} epochs")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path)


# ---------------------------------------------------------------- command line


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``data`` to the benchmarks' subcommands."""
    p = add_command(
        sub, "data", help="ChunkDataset vs DataLoader, Streaming, WebDataset, LitData: one cold epoch, plain and throttled disk",
        description=_DESCRIPTION, func=_cmd_data,
    )
    p.add_argument("--dir", default="bench-out/data",
                   help="where the datasets are written and kept for later runs with the same sizes "
                        "(default bench-out/data); the disk under it is the one measured")
    p.add_argument("--files", type=int, default=100_000, help="samples (default 100000)")
    p.add_argument("--file-size", default="100K", help="bytes per sample (default 100K)")
    p.add_argument("--classes", type=int, default=1000, help="classes, written in order (default 1000)")
    p.add_argument("--batch-size", type=int, default=256, help="batch size of every loader (default 256)")
    p.add_argument("--workers", type=int, default=2,
                   help="DataLoader workers of every loader (default 2); ChunkDataset runs with 0 where "
                        "it cannot serve workers, and the report says so")
    p.add_argument("--chunk-size", type=int, default=64, help="samples per pack chunk (default 64)")
    p.add_argument("--shard-size", default="64M",
                   help="bytes per MDS and tar shard (default 64M, MDSWriter's default)")
    p.add_argument("--budget", default=None,
                   help="ChunkDataset's memory budget (default --budget-fraction of the dataset, at "
                        "least the pack's minimum)")
    p.add_argument("--budget-fraction", type=float, default=0.10,
                   help="the default budget as a fraction of the dataset's bytes (default 0.10)")
    p.add_argument("--memory-limit", default=None,
                   help="memory cgroup limit on each reader, page cache included (default: the budget "
                        "plus 1G for the reader's processes)")
    p.add_argument("--iops", type=int, default=1000, help="read IOPS of the throttled setting (default 1000)")
    p.add_argument("--settings", default="plain,throttled",
                   help="disk settings to run: plain, throttled or both (default both)")
    p.add_argument("--loaders", default=",".join(LOADERS),
                   help=f"loaders to run, among {', '.join(LOADERS)} (default all)")
    p.add_argument("--rounds", type=int, default=1,
                   help="cold epochs per loader and setting; medians are printed with the spread (default 1; "
                        "use 3 on a noisy machine)")
    p.add_argument("--seed", type=int, default=0, help="seed of the contents, the pack and the shuffles")
    p.add_argument("--timeout", type=float, default=None, help="abandon an epoch after this many seconds")
    p.add_argument("--convergence", action="store_true",
                   help="also train a small CNN on class-sorted synthetic images through a full shuffle, "
                        "ChunkDataset and WebDataset, and compare the loss curves")
    p.add_argument("--convergence-epochs", type=int, default=3, help="epochs of the convergence check (default 3)")
    p.add_argument("--convergence-files", type=int, default=6000,
                   help="images of the convergence check (default 6000, 10 classes)")
    p.add_argument("--clean", action="store_true", help="remove the datasets at the end")
    p.add_argument("--plot", default="bench-out/data.png",
                   help="PNG of the throughput, label entropy and loss curves (default bench-out/data.png; "
                        "needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--nodes", default=None, metavar="K[,K...]",
                   help="instead: Brand's distributed protocol on K simulated nodes, with and without "
                        "owner-prefetch (`benchmarks data-nodes` with its defaults; see its --help for its options)")


def _cmd_data(args: argparse.Namespace) -> int:
    from pyfastensor.errors import FastensorError

    if args.nodes is not None:
        from . import data_nodes

        nodes_parser = argparse.ArgumentParser()
        data_nodes.add_nodes_options(nodes_parser)
        return data_nodes.run_nodes(nodes_parser.parse_args(["--nodes", args.nodes]))

    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    if args.rounds < 1 or args.files < 1 or args.batch_size < 1 or args.workers < 0:
        raise ValueError("--rounds, --files and --batch-size must be >= 1, --workers >= 0")
    os.makedirs(args.dir, exist_ok=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    quiet = not config.progress_enabled()
    try:
        result = run_bench(
            args.dir, files=args.files, file_size=config.parse_size(args.file_size), classes=args.classes,
            batch_size=args.batch_size, workers=args.workers, chunk_size=args.chunk_size,
            shard_size=config.parse_size(args.shard_size),
            budget=config.parse_size(args.budget) if args.budget else None,
            budget_fraction=args.budget_fraction,
            memory_limit=config.parse_size(args.memory_limit) if args.memory_limit else None,
            iops=args.iops, settings=settings, loaders=loaders, rounds=args.rounds, seed=args.seed,
            timeout=args.timeout, progress=None if quiet else progress,
        )
        if args.convergence:
            t = time.perf_counter()
            result["convergence"] = run_convergence(
                args.dir, files=args.convergence_files, epochs=args.convergence_epochs, seed=args.seed,
                chunk_size=args.chunk_size, budget_fraction=args.budget_fraction,
                progress=None if quiet else progress)
            result["elapsed_seconds"] += time.perf_counter() - t
    except FastensorError as e:
        print(f"pyfastensor: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.clean:
            for sub in Path(args.dir).glob("*"):
                if sub.is_dir() and (sub / "layout.json").exists():
                    shutil.rmtree(sub, ignore_errors=True)
    return finish(result, args, format_report, plot)

"""``python -m benchmarks checkpoint``: pyfastensor.save/load against its peers.

State dicts built in code, no downloads: a GPT-2-small-shaped model (about
124M fp32 parameters), a ResNet-50-shaped model (about 25.6M, BN running
statistics and ``num_batches_tracked`` included), two dicts of small
tensors (4 KiB to 64 KiB): 10,000 of them (``small``) and 6,000 (``small6k``),
and a LoRA adapter's state dict (``lora``: a few hundred 16-256 KiB tensors).
Each tool saves the whole dict durably, then loads it cold and warm. The
loads come in two groups, compared within their group only:

owned (the loaded tensors have memory of their own):

- ``pyfastensor``: ``pyfastensor.save(sd, path, durable=True)`` (temp file,
  fsync, rename, fsync of the directory) and ``pyfastensor.load(path)``,
  every record's CRC-32 checked;
- ``pyfastensor-noverify``: the same file (its save is not timed again),
  ``pyfastensor.load(path, verify=False)``: what checking costs;
- ``torch``: ``torch.save`` into an open file, ``os.fsync`` of it and of the
  directory; ``torch.load(path, weights_only=True)``;
- ``safetensors``: ``safetensors.torch.save_file``, fsync of the file and of
  the directory; ``safetensors.torch.load(open(path, "rb").read())``;
- ``tensorizer``: CoreWeave's ``TensorSerializer.write_state_dict``, fsync of
  the file and of the directory; ``TensorDeserializer(path)`` read whole
  (its default: not lazy, hashes unchecked);
- ``numpy``: one ``.npy`` per tensor in a directory (``np.save`` into an open
  file, fsync of each file, then of the directory); load is
  ``torch.from_numpy(np.load(f))`` per tensor.

mapped (the tensors are views of a mapping of the file):

- ``pyfastensor-mmap``: pyfastensor's file (its save is not timed again),
  ``pyfastensor.load(path, mmap=True)``, every record's CRC-32 still checked;
- ``torch-mmap``: torch.save's file (not timed again),
  ``torch.load(path, mmap=True, weights_only=True)``, unchecked;
- ``safetensors-mmap``: save_file's file (not timed again),
  ``safetensors.torch.load_file(path)``, unchecked.

Every timed load, for every tool, ends by touching every page of every
loaded storage (one byte per 4 KiB page and the last byte, summed): free for
tensors already in memory, it makes lazily mapped results (torch-mmap, and
safetensors' load_file, which maps the file) read what they would otherwise
defer, so no tool scores by not reading.

Figures are GB/s (10^9 bytes per second) of tensor payload (the sum of the
tensors' bytes, the same for every tool), wall time from the first call to
the last byte durable or loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pyfastensor.info import available_memory

from .harness import (
    add_command,
    crc_speed,
    disk,
    finish,
    progress,
    remove_saved,
    round_order,
    save_figure,
    spread_text,
    temp_dir,
)
from .workloads import STATE_DICTS as WORKLOADS
from .workloads import StateDict, build_state_dicts
from .workloads import StateDictWorkload as Workload

if TYPE_CHECKING:  # torch is imported where a benchmark runs: `--help` stays fast
    pass

MiB = 1 << 20
GiB = 1 << 30
#: Where every tool loads to (``--device``; saves are always from host memory).
DEVICE = "cpu"

#: The rows of each group of loads, pyfastensor's first: loads into memory of their own, and mapped loads.
GROUPS = {
    "owned": ("pyfastensor", "pyfastensor-noverify", "torch", "safetensors", "tensorizer", "numpy"),
    "mapped": ("pyfastensor-mmap", "torch-mmap", "safetensors-mmap"),
}
#: Rows of every table.
TOOLS = GROUPS["owned"] + GROUPS["mapped"]
#: pyfastensor's rows.
OURS = ("pyfastensor", "pyfastensor-noverify", "pyfastensor-mmap")
#: Peers of pyfastensor.
PEERS = tuple(t for t in TOOLS if t not in OURS)
#: Figures of every row.
KEYS = ("save_gbps", "cold_gbps", "warm_gbps")
#: Workloads held to the disk-limit and warm-load targets.
MODELS = ("gpt2", "resnet50")
#: Workloads of many small tensors.
SMALL = ("small", "small6k", "lora")
#: Workloads held to the many-small-tensors targets against torch (:data:`SMALL_TARGET`).
SMALL_2X = ("small6k", "lora")
#: Fraction of the disk's O_DIRECT write limit the models' durable save must reach.
SAVE_TARGET = 0.85
#: Fraction of the read into new memory the models' cold load must reach.
COLD_TARGET = 0.90
#: How much faster than torch.save a durable save of many small tensors must be.
SMALL_SAVE_TARGET = 1.5
#: How much faster than torch a durable save and a cold load of :data:`SMALL_2X` must be.
SMALL_TARGET = 2.0
#: How much faster than torch.load the default (owned, verified) warm load of a model must be.
WARM_TARGET = 1.5
#: The most the default warm load may take over the same load with verify=False.
VERIFY_COST_MAX = 0.10
#: How many times safetensors' load_file the mapped, verified warm load may take at most.
MAPPED_SAFETENSORS_MAX = 2.0

# ---------------------------------------------------------------- tools


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_pyfastensor(sd: StateDict, path: str) -> None:
    import pyfastensor

    pyfastensor.save(sd, path, durable=True, progress=False)


def _save_torch(sd: StateDict, path: str) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_path(os.path.dirname(path), directory=True)


def _save_safetensors(sd: StateDict, path: str) -> None:
    from safetensors.torch import save_file

    save_file(sd, path)
    _fsync_path(path)
    _fsync_path(os.path.dirname(path), directory=True)


def _save_tensorizer(sd: StateDict, path: str) -> None:
    from tensorizer import TensorSerializer

    with open(path, "wb+") as f:  # tensorizer wants a file it can read back
        serializer = TensorSerializer(f)
        serializer.write_state_dict(sd)
        serializer.close()  # closes f too
    _fsync_path(path)
    _fsync_path(os.path.dirname(path), directory=True)


def _npy_names(sd: StateDict) -> list[str]:
    return [f"{i:06d}.npy" for i in range(len(sd))]


def _save_numpy(sd: StateDict, path: str) -> None:
    os.mkdir(path)
    for name, t in zip(_npy_names(sd), sd.values(), strict=True):
        with open(os.path.join(path, name), "wb") as f:
            np.save(f, t.numpy())
            f.flush()
            os.fsync(f.fileno())
    _fsync_path(path, directory=True)
    _fsync_path(os.path.dirname(path), directory=True)


def _load_pyfastensor(path: str, keys: list[str]) -> StateDict:
    import pyfastensor

    return pyfastensor.load(path, map_location=DEVICE, progress=False)


def _load_pyfastensor_mmap(path: str, keys: list[str]) -> StateDict:
    import pyfastensor

    return pyfastensor.load(path, mmap=True, map_location=DEVICE, progress=False)


def _load_pyfastensor_noverify(path: str, keys: list[str]) -> StateDict:
    import pyfastensor

    return pyfastensor.load(path, verify=False, progress=False)


def _load_torch(path: str, keys: list[str]) -> StateDict:
    import torch

    return torch.load(path, weights_only=True, map_location=DEVICE)


def touch_pages(sd: StateDict) -> int:
    """Read one byte of every 4 KiB page (and the last byte) of every storage; return their sum.

    On an mmap'd load this faults every page in, so the lazy reads are timed.
    Host memory is read through ctypes, a few µs a storage (a torch view and
    sum per storage cost 20 µs: 0.12 s on 6,000 small tensors, added to
    every tool's load alike); device memory through a strided view's sum.
    """
    import torch

    total = 0
    for t in sd.values():
        s = t.untyped_storage()
        n = s.nbytes()
        if n == 0:
            continue
        if s.device.type == "cpu":
            b = _HOST_BYTES.from_address(s.data_ptr())
            total += sum(b[0:n:4096]) + b[n - 1]
            continue
        u = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
        total += int(u[::4096].sum()) + int(u[-1])
    return total


#: A byte array type over all of host memory, for :func:`touch_pages` (never allocated).
_HOST_BYTES = ctypes.c_uint8 * (1 << 46)


def _load_torch_mmap(path: str, keys: list[str]) -> StateDict:
    import torch

    return torch.load(path, mmap=True, weights_only=True, map_location=DEVICE)


def _load_safetensors(path: str, keys: list[str]) -> StateDict:
    from safetensors.torch import load

    with open(path, "rb") as f:
        return load(f.read())


def _load_safetensors_mmap(path: str, keys: list[str]) -> StateDict:
    from safetensors.torch import load_file

    return load_file(path, device=DEVICE)


def _load_tensorizer(path: str, keys: list[str]) -> StateDict:
    from tensorizer import TensorDeserializer

    deserializer = TensorDeserializer(path, device=DEVICE)
    try:
        return {k: t.detach() for k, t in deserializer.items()}
    finally:
        deserializer.close()


def _load_numpy(path: str, keys: list[str]) -> StateDict:
    import torch

    return {k: torch.from_numpy(np.load(os.path.join(path, n))).to(DEVICE)
            for k, n in zip(keys, [f"{i:06d}.npy" for i in range(len(keys))], strict=True)}


Saver = Callable[[StateDict, str], None]
Loader = Callable[[str, list[str]], StateDict]

#: tool: (saver, loader, file name, whether its save is timed).
_TOOLS: dict[str, tuple[Saver, Loader, str, bool]] = {
    "pyfastensor": (_save_pyfastensor, _load_pyfastensor, "ckpt-pft.pt", True),
    "pyfastensor-noverify": (_save_pyfastensor, _load_pyfastensor_noverify, "ckpt-pft-noverify.pt", False),
    "torch": (_save_torch, _load_torch, "ckpt-torch.pt", True),
    "safetensors": (_save_safetensors, _load_safetensors, "ckpt.safetensors", True),
    "tensorizer": (_save_tensorizer, _load_tensorizer, "ckpt.tensors", True),
    "numpy": (_save_numpy, _load_numpy, "ckpt-npy", True),
    "pyfastensor-mmap": (_save_pyfastensor, _load_pyfastensor_mmap, "ckpt-pft-mmap.pt", False),
    "torch-mmap": (_save_torch, _load_torch_mmap, "ckpt-torch-mmap.pt", False),
    "safetensors-mmap": (_save_safetensors, _load_safetensors_mmap, "ckpt-mmap.safetensors", False),
}


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in sorted(os.listdir(path))]
    return [path]


def check_equal(tool: str, want: StateDict, got: Any) -> None:
    """Raise AssertionError unless ``got`` holds the same keys and equal tensors (dtype and shape) as ``want``.

    Key order is not compared: safetensors stores keys sorted.
    """
    import torch

    if not isinstance(got, dict) or set(got) != set(want) or len(got) != len(want):
        raise AssertionError(f"{tool}: loaded keys differ from the saved ones")
    for k, t in want.items():
        u = got[k]
        if not isinstance(u, torch.Tensor) or u.dtype != t.dtype or u.shape != t.shape or not torch.equal(u.cpu(), t):
            raise AssertionError(f"{tool}: tensor {k!r} differs after load")


def read_into_new_memory(path: str) -> float:
    """Seconds to read the whole file at ``path`` with O_DIRECT (8 MiB requests, in parallel)
    into newly mapped memory: what any load that returns new tensors costs at least.

    On a virtual machine whose host takes back freed guest memory (free
    page reporting), the first touch of such memory can cost more than the
    disk's read, so this, not the disk's limit alone, bounds a cold load.
    """
    from pyfastensor.engines import EngineFile

    size = os.path.getsize(path)
    start = time.perf_counter()
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # new memory, page-aligned
    if size >= 2 * MiB and hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)  # as pyfastensor.load's own whole-file area
    buf = np.frombuffer(mapping, dtype=np.uint8)
    with EngineFile(path, engine="direct", task_size=8 * MiB) as f:
        f.read_into(buf)
    seconds = time.perf_counter() - start
    del buf
    mapping.close()
    return seconds


def _fresh_memory(w: Workload) -> None:
    """Touch and free, just before a timed load, the memory it will take (:func:`disk.prime_memory`).

    On the development VM the guest reports memory free for a second or
    two to the host, which takes it back: the next touch of it costs a
    fault on the host too. A GPT-2 read into new memory took 130-150 ms
    right after such memory was freed and 370-440 ms five seconds later.
    Without this, a load's figure depended on whether the tool before it
    had freed anonymous memory (torch's copies) or not (mapped loads).
    """
    disk.prime_memory(min(2 * w.nbytes, available_memory() // 2))


def measure_round(tool: str, w: Workload, directory: str, *, check: bool = False,
                  sized_limit: bool = False) -> dict[str, float]:
    """One round of ``tool`` on ``w``: a durable save, a cold load, a warm load, each load
    touching every page and starting with memory just freed (:func:`_fresh_memory`); for
    pyfastensor, then the read into new memory of a file saved again, in the cold load's
    conditions (the first read after the save's writes ran measurably slower on the
    development VM, whichever reader it was).

    Args:
        check: compare both loads with the saved dict (:func:`check_equal`).
        sized_limit: for pyfastensor, also measure the disk's write limit on a file of
            the checkpoint's size (fio's fixed costs weigh more on 100 MB than on 1 GiB).

    Returns:
        Seconds: ``{"save_s", "cold_s", "warm_s"}``, and ``"newmem_s"`` for pyfastensor;
        with ``sized_limit``, ``"sized_write_mbps"`` too.
    """
    saver, loader, fname, _ = _TOOLS[tool]
    path = os.path.join(directory, fname)
    keys = list(w.state)
    out: dict[str, float] = {}

    def timed_load(what: str) -> float:
        _fresh_memory(w)
        start = time.perf_counter()
        got = loader(path, keys)
        touch_pages(got)
        seconds = time.perf_counter() - start
        if check:
            check_equal(f"{tool} ({what})", w.state, got)
        return seconds

    try:
        remove_saved(path)
        start = time.perf_counter()
        saver(w.state, path)
        out["save_s"] = time.perf_counter() - start
        disk.drop_caches(_files(path))
        out["cold_s"] = timed_load("cold")
        disk.cache_files(_files(path))  # warm: the whole file in the page cache, for every tool
        out["warm_s"] = timed_load("warm")
        if tool == "pyfastensor":
            remove_saved(path)
            saver(w.state, path)
            disk.drop_caches(_files(path))
            _fresh_memory(w)
            out["newmem_s"] = read_into_new_memory(path)
            if sized_limit:
                size = os.path.getsize(path)
                remove_saved(path)
                out["sized_write_mbps"] = disk.measure_limit(directory, size=-(-size // MiB) * MiB).write_mbps
    finally:
        remove_saved(path)
    return out


def summarize(nbytes: int, rounds: dict[str, list[dict[str, float]]],
              limits: list[disk.DiskLimit] | None = None) -> dict[str, dict[str, Any]]:
    """Rows of one workload from its rounds (``tool -> [measure_round result per round]``).

    Each figure is the median over rounds; so is each ratio, taken round by
    round (pyfastensor's figure over the peer's in the same round), and each
    fraction of the disk's limit (the figure over the limit measured at the
    start of the same round, when ``limits`` has one per round): on a
    machine whose disk and memory drift by tens of percent between minutes,
    pairing within a round cancels most of the drift.
    """
    def gbps(sec: float) -> float:
        return nbytes / sec / 1e9

    rows: dict[str, dict[str, Any]] = {}
    for tool, rs in rounds.items():
        timed_save = _TOOLS[tool][3]
        r: dict[str, Any] = {}
        for k in ("save", "cold", "warm", "newmem"):
            secs = [x[f"{k}_s"] for x in rs if f"{k}_s" in x]
            if k == "save" and not timed_save:
                secs = []
            r[f"{k}_s"] = statistics.median(secs) if secs else None
            r[f"{k}_gbps"] = gbps(r[f"{k}_s"]) if secs else None
        r["rounds"] = rs
        for k, lk in (("save", "write_mbps"), ("cold", "read_mbps")):
            fr = [gbps(x[f"{k}_s"]) * 1e3 / getattr(lim, lk) for x, lim in zip(rs, limits or [], strict=False)]
            r[f"{k}_frac"] = statistics.median(fr) if fr and r[f"{k}_gbps"] is not None else None
        rows[tool] = r
    for tool, r in rows.items():
        ours = ours_of(tool)
        pft = rounds.get(ours)
        r["ratio"] = {}
        for k in KEYS:
            ok = pft is not None and tool not in OURS and rows[ours][k] and r[k]
            sk = k.replace("_gbps", "_s")
            r["ratio"][k] = (statistics.median(x[sk] / y[sk] for x, y in zip(rounds[tool], pft, strict=True))
                             if ok else None)
    return rows


def group_of(tool: str) -> str:
    """The group of loads ``tool`` belongs to (:data:`GROUPS`)."""
    return next(g for g, tools in GROUPS.items() if tool in tools)


def ours_of(tool: str) -> str:
    """pyfastensor's row that ``tool`` is compared with: the first of its group."""
    return GROUPS[group_of(tool)][0]


# ---------------------------------------------------------------- run and report


def paired(rows: dict[str, dict[str, Any]], ours: str, peer: str, key: str) -> float | None:
    """Median over rounds of ``ours``'s figure over ``peer``'s (``key``: save, cold, warm), round by round."""
    pairs = paired_rounds(rows, ours, peer, key)
    return statistics.median(pairs) if pairs else None


def paired_rounds(rows: dict[str, dict[str, Any]], ours: str, peer: str, key: str) -> list[float]:
    """``ours``'s figure over ``peer``'s (``key``: save, cold, warm) in each round."""
    a, b = rows[ours]["rounds"], rows[peer]["rounds"]
    return [y[f"{key}_s"] / x[f"{key}_s"] for x, y in zip(a, b, strict=False)
            if f"{key}_s" in x and f"{key}_s" in y]


def slowest_peer(rows: dict[str, dict[str, Any]], ours: str, key: str) -> tuple[str, float] | None:
    """The peer of ``ours``'s group ``ours`` gains least on (smallest :func:`paired` ratio for
    ``key``) and that ratio; for saves, every peer whose save is timed."""
    ratios = {t: paired(rows, ours, t, key) for t in rows
              if t not in OURS and (_TOOLS[t][3] if key == "save" else group_of(t) == group_of(ours))}
    ratios = {t: v for t, v in ratios.items() if v is not None}
    if not ratios:
        return None
    worst = min(ratios, key=lambda t: ratios[t])
    return worst, ratios[worst]


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets, each ``{"workload", "what", "met", "figures"}``, from a :func:`run` result.

    Fractions of the limit and ratios to peers are medians of per-round
    figures (see :func:`summarize`).
    """
    out: list[dict[str, Any]] = []
    for name, m in result["workloads"].items():
        if "pyfastensor" in m["rows"]:
            out += _workload_targets(name, m, result.get("limit") or {}, result.get("crc"))
    return out


def verify_bound(m: dict[str, Any], crc: dict[str, Any] | None, cores: int) -> float | None:
    """The most the paired ratio of a warm load with every CRC checked to the same load with
    ``verify=False`` can be on this machine: per round, ``t / (t + bytes / (CRC rate x cores))``
    with ``t`` the unverified load's seconds, the CRC rate that over a cached 1 MiB block (the
    fastest it runs, summed as it is copied) and every core summing; the median over rounds.
    None without the CRC's speed or the unverified rows.
    """
    rows = m["rows"].get("pyfastensor-noverify")
    if not crc or not rows or not crc.get("cached_gbps"):
        return None
    rate = crc["cached_gbps"] * 1e9 * cores
    best = [x["warm_s"] / (x["warm_s"] + m["nbytes"] / rate) for x in rows["rounds"] if x.get("warm_s")]
    return statistics.median(best) if best else None


def _workload_targets(name: str, m: dict[str, Any], lim: dict[str, Any],
                      crc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rows = m["rows"]

    def add(what: str, met: bool, figures: str) -> None:
        out.append({"workload": name, "what": what, "met": met, "figures": figures})

    def versus(ours: str, peer: str, key: str, at_least: float, what: str, note: str = "") -> None:
        v = paired(rows, ours, peer, key) if peer in rows and ours in rows else None
        if v is not None:
            add(what, v >= at_least, f"{rows[ours][f'{key}_gbps']:.2f} GB/s vs {peer} "
                                     f"{rows[peer][f'{key}_gbps']:.2f} GB/s (paired ratio {v:.2f}, rounds "
                                     f"{spread_text(paired_rounds(rows, ours, peer, key))}){note}")

    pft = rows["pyfastensor"]
    if name in MODELS:
        frac = pft.get("save_frac")
        if "write_mbps" in lim and frac is not None:
            sized = [pft_s for pft_s in (x.get("sized_write_mbps") for x in pft["rounds"]) if pft_s]
            extra = ""
            if sized:
                fr = statistics.median(m["nbytes"] / x["save_s"] / 1e6 / x["sized_write_mbps"]
                                       for x in pft["rounds"] if x.get("sized_write_mbps"))
                extra = (f"; {fr:.0%} of the limit for a file of its size "
                         f"({statistics.median(sized) / 1e3:.2f} GB/s)")
            add(f"durable save >= {SAVE_TARGET:.0%} of the disk's write limit", frac >= SAVE_TARGET,
                f"{pft['save_gbps']:.2f} GB/s = {frac:.0%} of {lim['write_mbps'] / 1e3:.2f} GB/s{extra}")
        if pft.get("newmem_gbps"):
            nm = statistics.median(x["newmem_s"] / x["cold_s"] for x in pft["rounds"])
            add(f"cold load >= {COLD_TARGET:.0%} of the read into new memory", nm >= COLD_TARGET,
                f"{pft['cold_gbps']:.2f} GB/s = {nm:.0%} of {pft['newmem_gbps']:.2f} GB/s"
                + (f" ({pft['cold_frac']:.0%} of the disk's read limit)" if pft.get("cold_frac") else ""))
        for key, doing in (("save", "durable save"), ("cold", "cold load")):
            found = slowest_peer(rows, "pyfastensor", key)
            if found:
                versus("pyfastensor", found[0], key, 1.0 + 1e-9, f"{doing} faster than every peer")
        cores = os.cpu_count() or 1
        bound = verify_bound(m, crc, cores)
        versus("pyfastensor", "pyfastensor-noverify", "warm", 1 / (1 + VERIFY_COST_MAX),
               f"warm load, every CRC checked, within {VERIFY_COST_MAX:.0%} of verify=False",
               "" if bound is None else
               f"; at most {bound:.2f} with every byte summed once at {crc['cached_gbps']:.1f} GB/s "
               f"on each of {cores} cores beside the unverified load")
        versus("pyfastensor", "torch", "warm", WARM_TARGET, f"warm load >= {WARM_TARGET}x torch.load")
        versus("pyfastensor-mmap", "torch-mmap", "warm", 1.0,
               "warm mmap=True load, every CRC checked, no slower than torch.load(mmap=True)")
        versus("pyfastensor-mmap", "safetensors-mmap", "warm", 1 / MAPPED_SAFETENSORS_MAX,
               f"warm mmap=True load within {MAPPED_SAFETENSORS_MAX:g}x of safetensors' load_file")
    elif name in SMALL:
        versus("pyfastensor", "torch", "save", SMALL_SAVE_TARGET, f"durable save >= {SMALL_SAVE_TARGET}x torch")
        versus("pyfastensor", "torch", "cold", 1.0, "cold load no slower than torch")
        versus("pyfastensor", "torch", "warm", 1.0, "warm load no slower than torch")
        if name in SMALL_2X:
            versus("pyfastensor", "torch", "save", SMALL_TARGET, f"durable save >= {SMALL_TARGET:g}x torch")
            versus("pyfastensor", "torch", "cold", SMALL_TARGET, f"cold load >= {SMALL_TARGET:g}x torch")
    return out


def run(directory: str, *, workloads: list[Workload] | None = None, quick: bool = False,
        tools: tuple[str, ...] = TOOLS, repeat: int = 5, limit: bool = True, limit_size: int | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark in ``directory`` (left as found); return the tables as a dict.

    Each round measures the disk's limit, then runs every tool on every
    workload once (:func:`measure_round`), round ``i`` starting with tool
    ``i``; the tables are medians over rounds (:func:`summarize`).

    Args:
        directory: where the checkpoints go; each is removed after its loads.
        workloads: the state dicts (default :func:`~benchmarks.workloads.build_state_dicts` of every workload).
        quick: smaller default workloads and a 256 MiB disk limit.
        tools: rows to run. Default every tool.
        repeat: rounds. Default 5.
        limit: measure the disk's O_DIRECT limit at the start of each round (fio when installed).
        limit_size: bytes per direction for the limit (default 1 GiB; 256 MiB with quick).
        progress: called with a line before each row.

    Returns:
        ``{"workloads": {name: {"nbytes", "params", "tensors", "rows": {tool: {KEYS..., "ratio",
        "save_frac", "cold_frac", "rounds"}}}}, "limit": {...} or absent, "cold_method", "targets": [...]}``.
    """
    repeat = max(1, repeat)
    result: dict[str, Any] = {"workloads": {}, "repeat": repeat, "cold_method": disk.cold_cache_method(),
                              "crc": crc_speeds()}
    loads = workloads if workloads is not None else build_state_dicts(quick=quick)
    # Each row holds a state dict and a loaded copy (plus torch's own
    # buffers): fault that much memory in once so no tool pays the VM's first touch.
    disk.prime_memory(min(3 * max((w.nbytes for w in loads), default=0), available_memory() // 2))
    limits: list[disk.DiskLimit] = []
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {w.name: {t: [] for t in tools} for w in loads}
    failed: dict[tuple[str, str], str] = {}  # (workload, peer) -> why it failed there
    for i in range(repeat):
        if limit and "limit_error" not in result:
            if progress:
                progress(f"round {i + 1}/{repeat}: disk limit")
            try:
                limits.append(disk.measure_limit(directory, size=limit_size or ((256 * MiB) if quick else GiB)))
            except Exception as e:  # noqa: BLE001 - the limit is context; the rows still mean something
                result["limit_error"] = f"disk limit not measured: {e}"
                limits = []
        for w in loads:
            for tool in round_order(tools, i):
                if (w.name, tool) in failed:
                    continue
                if progress:
                    progress(f"round {i + 1}/{repeat}: {w.name}: {tool}")
                try:
                    rounds[w.name][tool].append(measure_round(tool, w, directory, check=i == 0,
                                                              sized_limit=limit and w.name in MODELS))
                except Exception as e:  # noqa: BLE001 - a peer that cannot take a workload is reported, not fatal
                    if tool in OURS:
                        raise
                    failed[(w.name, tool)] = f"{type(e).__name__}: {e}"
                    rounds[w.name][tool] = []
                    remove_saved(os.path.join(directory, _TOOLS[tool][2]))
    if limits:
        result["limit"] = {
            "write_mbps": statistics.median(x.write_mbps for x in limits),
            "read_mbps": statistics.median(x.read_mbps for x in limits),
            "rounds": [{"write_mbps": x.write_mbps, "read_mbps": x.read_mbps} for x in limits],
            "describe": limits[0].describe(),
        }
    for w in loads:
        rows = summarize(w.nbytes, rounds[w.name], limits)
        for (name, tool), why in failed.items():
            if name == w.name:
                rows[tool]["error"] = why
        result["workloads"][w.name] = {"nbytes": w.nbytes, "params": w.params, "tensors": len(w.state),
                                       "rows": rows}
    result["targets"] = targets(result)
    return result


def crc_speeds() -> dict[str, float]:
    """GB/s of the CRC-32 every record is checked with, on one core: over a 1 MiB block
    (in the CPU's cache: summed as it is copied) and over 512 MiB (a second pass over memory)."""
    return {"cached_gbps": crc_speed(1 * MiB) / 1e9, "memory_gbps": crc_speed(512 * MiB, 300) / 1e9}


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_report(result: dict[str, Any]) -> str:
    """The per-workload tables (loads into owned memory, then mapped loads), the disk limit,
    the CRC-32's speed and the targets block."""
    lines = []
    if "limit" in result:
        lim = result["limit"]
        lines.append(lim["describe"].replace("disk limit", "disk limit, first round", 1))
        if len(lim["rounds"]) > 1:
            lines.append("disk limit per round: write " + ", ".join(f"{x['write_mbps']:.0f}" for x in lim["rounds"])
                         + " MB/s; read " + ", ".join(f"{x['read_mbps']:.0f}" for x in lim["rounds"]) + " MB/s")
    elif "limit_error" in result:
        lines.append(result["limit_error"])
    if "crc" in result:
        lines.append(f"CRC-32 per core: {result['crc']['cached_gbps']:.1f} GB/s over a cached 1 MiB block, "
                     f"{result['crc']['memory_gbps']:.1f} GB/s over 512 MiB of memory ({os.cpu_count()} cores)")
    lines.append(f"cold cache: {result['cold_method']}")
    lines.append(f"figures: medians of {result['repeat']} rounds; ratios (pyfastensor/peer, >1: pyfastensor "
                 "faster, against the first row of the group) and fractions of the limit: medians of the "
                 "per-round figures (pyfastensor against the peer, or the limit, of the same round)")
    for name, m in result["workloads"].items():
        lines.append(f"\n{name}: {m['tensors']} tensors, {m['params'] / 1e6:.1f}M elements, "
                     f"{m['nbytes'] / 1e6:.0f} MB")
        nm = m["rows"].get("pyfastensor", {}).get("newmem_gbps")
        if nm:
            lines.append(f"  read limit into new memory: {nm:.2f} GB/s (pyfastensor's file, O_DIRECT into "
                         "newly mapped memory, right after its save and cache drop, as a cold load)")
        for group, tools in GROUPS.items():
            present = [t for t in tools if t in m["rows"]]
            if not present:
                continue
            lines.append(f"  {group:<22}{'save GB/s':>10}{'cold GB/s':>10}{'warm GB/s':>10}"
                         f"{'ratio save':>11}{'cold':>6}{'warm':>6}{'save/wlim':>11}{'cold/rlim':>10}")
            for tool in present:
                r = m["rows"][tool]
                if r.get("error"):
                    lines.append(f"  {tool:<22}failed: {r['error']}")
                    continue
                rt = r["ratio"]
                lines.append(
                    f"  {tool:<22}{_f(r['save_gbps'], '.2f'):>10}{_f(r['cold_gbps'], '.2f'):>10}"
                    f"{_f(r['warm_gbps'], '.2f'):>10}{_f(rt['save_gbps'], '.2f'):>11}{_f(rt['cold_gbps'], '.2f'):>6}"
                    f"{_f(rt['warm_gbps'], '.2f'):>6}{_f(r['save_frac'], '.0%'):>11}{_f(r['cold_frac'], '.0%'):>10}")
    lines.append("\nevery load ends by reading one byte per 4 KiB page of every loaded storage (counts "
                 "mmap's lazy reads); the rows whose save shows '-' load a file their tool saved "
                 "(saves not timed again)")
    if result["targets"]:
        lines.append("\ntargets:")
        for t in result["targets"]:
            lines.append(f"  {'MET   ' if t['met'] else 'MISSED'} {t['workload']:<9}{t['what']}: {t['figures']}")
    return "\n".join(lines)


_DESCRIPTION = __doc__.split("\n", 2)[2] + """
A round measures the disk's limit, then, for each workload and tool, one
durable save, one cold load and one warm load (the same load again after
the tool's files were read once whole, so they sit in the page cache
whatever the cold load did). --repeat N runs N rounds (default 5: the
first round's loads, the first of the process, ran up to twice as slow for
every tool on the development VM, and with 3 rounds that one counted). Each
figure is the median over rounds; each ratio to a peer and each fraction of
the limit is the median of the per-round ratios (pyfastensor and the peer,
or the limit, of the same round), which cancels the drift of a virtual
machine's disk and memory between minutes. The first round's cold and warm
loads are checked against the saved dict (same keys, torch.equal per
tensor), so a fast wrong answer fails the run instead of scoring.

Before the first row, as much anonymous memory as the runs need is faulted
in once and freed: on a virtual machine the first touch of never-used guest
memory is several times slower, and would count against whichever tool ran
first.

Cold cache: as root, sync and `echo 3 > /proc/sys/vm/drop_caches` before
every cold load (the whole page cache goes); otherwise fsync and
posix_fadvise(POSIX_FADV_DONTNEED) of the tool's files, which drops only
their pages. Run as root for figures comparable with the disk's.

The disk's limit: fio, libaio O_DIRECT sequential write (fsync) and read,
in the same directory, at the start of every round (each round then starts
with another tool) (the engines' best at
64 MiB blocks when fio is missing). Columns: GB/s of each tool, pyfastensor's figure over
the peer's (>1: pyfastensor faster), save over the write limit and cold
load over the read limit.

Write limit for a file of the checkpoint's size (gpt2 and resnet50): fio
again, after the loads, on a file of the size pyfastensor saved; reported
beside the save's target (fio's own fixed costs, the fsync's journal
commit among them, weigh more on a 100 MB file than on 1 GiB).

Read limit into new memory (per workload): the pyfastensor file, saved
again, read with O_DIRECT into newly mapped memory after the same cache
drop: the conditions of a cold load. A load that
returns new tensors cannot beat it; on a virtual machine whose host takes
freed guest memory back, the first touch of memory makes it lower than the
disk's limit.

The header also gives the speed of the CRC-32 every record is checked
with, on one core: over a 1 MiB block in the CPU's cache (what summing
bytes just copied costs) and over 512 MiB (a second pass over memory).

Targets, each a median of paired per-round figures: on gpt2 and
resnet50, the durable save >= 85% of the write limit and the cold load >=
90% of the read into new memory, both faster than every peer; the default
warm load (memory of its own, every CRC checked) within 10% of the same
load with verify=False and >= 1.5x torch.load; the mapped warm load (every
CRC checked) no slower than torch.load(mmap=True) and within 2x of
safetensors' load_file (both unchecked). On small, small6k and lora, the
durable save >= 1.5x torch.save + fsync, loads cold and warm no slower than
torch; on small6k and lora, the durable save and the cold load >= 2x torch.
"""


#: The tools drawn, in order, with their colors.
_PLOT_TOOLS = {"pyfastensor": "tab:blue", "torch": "tab:orange", "safetensors": "tab:green",
               "tensorizer": "tab:purple", "numpy": "tab:gray"}


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw GB/s per tool (durable save, cold load, warm load), one panel per workload, beside the disk's limits.

    Args:
        result: what :func:`run` returned.
        path: the PNG to write (its directory is made).

    Returns:
        The PNG's path.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(result["workloads"])
    fig = Figure(figsize=(4.2 * len(names), 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    limit = result.get("limit") or {}
    kinds = [("save", "durable save"), ("cold", "cold load"), ("warm", "warm load")]
    for ax, name in zip(axes, names, strict=True):
        rows = result["workloads"][name]["rows"]
        tools = [t for t in _PLOT_TOOLS if t in rows]
        width = 0.8 / max(len(tools), 1)
        for i, tool in enumerate(tools):
            values = [rows[tool].get(f"{k}_gbps") or 0.0 for k, _ in kinds]
            xs = [j + (i - (len(tools) - 1) / 2) * width for j in range(len(kinds))]
            ax.bar(xs, values, width, color=_PLOT_TOOLS[tool], label=tool)
        for j, key in ((0, "write_mbps"), (1, "read_mbps")):
            if limit.get(key):
                gbps = limit[key] / 1000
                ax.hlines(gbps, j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                          label="disk's limit (same run)" if j == 0 else None)
        ax.set_xticks(range(len(kinds)), [label for _, label in kinds])
        w = result["workloads"][name]
        ax.set_title(f"{name}: {w['tensors']} tensors, {w['nbytes'] / 1e6:.0f} MB", fontsize=10)
        ax.set_ylabel("GB/s (median of rounds)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"python -m benchmarks checkpoint: {result['repeat']} rounds; "
                 "warm loads read the page cache", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``checkpoint`` to the benchmarks' subcommands."""
    p = add_command(sub, "checkpoint", help="pyfastensor.save/load vs torch, safetensors, tensorizer, numpy, owned and mapped",
                    description=_DESCRIPTION, func=_cmd_checkpoint,
                    dir_help="parent directory on the filesystem to measure (default: .); the run uses a "
                             "temporary directory inside it and leaves nothing behind",
                    limit_help="skip measuring the disk's limit")
    p.add_argument("--workloads", default=None,
                   help=f"comma list among {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--tools", default=None,
                   help=f"comma list of rows among {', '.join(TOOLS)} (default: all); pyfastensor's "
                        "ratios need its first row of the group")
    p.add_argument("--repeat", type=int, default=5,
                   help="rounds (disk limit, then every tool); medians count (default 5)")
    p.add_argument("--quick", action="store_true",
                   help="GPT-2 shape with 4 layers and vocab 8192, 1,000 and 600 small tensors, "
                        "a 4-layer LoRA adapter, 256M disk limit")
    p.add_argument("--device", default="cpu", help="where every tool loads to: cpu (default) or cuda[:N]")
    p.add_argument("--plot", default="bench-out/checkpoint.png",
                   help="PNG of GB/s per tool beside the disk's limits (default bench-out/checkpoint.png; "
                        "needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    global DEVICE
    DEVICE = args.device
    names = [n.strip() for n in args.workloads.split(",") if n.strip()] if args.workloads else list(WORKLOADS)
    tools = tuple(t.strip() for t in args.tools.split(",") if t.strip()) if args.tools else TOOLS
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise SystemExit(f"unknown tools {', '.join(unknown)}: expected some of {', '.join(TOOLS)}")
    with temp_dir(args.dir, "checkpoint") as d:
        ws = build_state_dicts(names, quick=args.quick)
        result = run(d, workloads=ws, quick=args.quick, tools=tools, repeat=args.repeat, limit=not args.no_limit,
                     progress=progress)
    return finish(result, args, format_report, plot)

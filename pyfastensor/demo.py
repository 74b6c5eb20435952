"""``python -m pyfastensor demo``: the built-in example the README starts with.

Saves and loads a built-in model's checkpoint with pyfastensor and with
torch, durable and cold-cache both, beside the disk's own limit; then trains
a few steps of a built-in model with and without activation offload and
compares step time, resident saved-tensor memory and gradients; then packs a
built-in dataset of small files and reads one shuffled epoch through
DataLoader workers, from the plain files and from the pack.
``--quick`` does the same on a smaller scale, in well under half a minute on
two cores (what CI runs from the installed wheel).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand to ``sub``."""
    p = sub.add_parser(
        "demo",
        help="save/load a built-in model's checkpoint and train under offload, against torch",
        description=(
            "Builds a transformer-shaped model in code (no download), saves and loads its "
            "state dict with pyfastensor and with torch (durable saves: fsync included for "
            "both; cold-cache loads when root), prints GB/s beside the disk's O_DIRECT limit "
            "measured in the same run, then trains a few steps of an MLP with and without "
            "pyfastensor.offload and compares step time, peak resident saved-tensor bytes "
            "and gradients, then packs a generated dataset of small files and reads one "
            "shuffled epoch (2 DataLoader workers, cold cache) from the files and from "
            "pyfastensor.data.ChunkDataset, checking every sample arrives once."
        ),
    )
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir under .)")
    p.add_argument("--size", default=None, choices=list(_SIZES),
                   help="tiny (~40 MB), small (~200 MB) or gpt2 (~500 MB, GPT-2-small shape); "
                        "default small, tiny with --quick")
    p.add_argument("--quick", action="store_true",
                   help="the same checks on a smaller scale: the tiny model unless --size says "
                        "otherwise, a 64 MiB disk-limit measurement and a smaller training batch")
    p.set_defaults(func=run)


#: --size: (layers, width, attention heads, vocabulary) of the transformer-shaped model.
_SIZES = {"tiny": (2, 512, 8, 8192), "small": (4, 1024, 16, 16384), "gpt2": (12, 768, 12, 50257)}


def _model(size: str) -> Any:
    import torch

    layers, d, heads, vocab = _SIZES[size]
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(vocab, d),
        "blocks": torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
            for _ in range(layers)
        ),
        "norm": torch.nn.LayerNorm(d),
    })


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _torch_save_durable(obj: Any, path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def run(args: argparse.Namespace) -> int:
    """Run the demo; return 0 when every comparison matched."""
    import torch

    import pyfastensor
    from pyfastensor.bench.disk import drop_caches, measure_limit

    base = args.dir or "."
    size = args.size or ("tiny" if args.quick else "small")
    with tempfile.TemporaryDirectory(prefix=".pyfastensor-demo-", dir=base) as tmp:
        d = Path(tmp)
        state = _model(size).state_dict()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        gb = nbytes / 1e9
        print(f"checkpoint: {len(state)} tensors, {nbytes / 2**20:.0f} MiB, in {d}")
        limit = measure_limit(d, size=(64 if args.quick else 512) << 20)
        print(limit.describe())

        t_torch_save, _ = _timed(partial(_torch_save_durable, state, d / "torch.pt"))
        t_ours_save, _ = _timed(partial(pyfastensor.save, state, d / "ours.pt"))
        cold = drop_caches([d / "torch.pt", d / "ours.pt"])
        t_torch_load, from_torch = _timed(partial(torch.load, d / "torch.pt"))
        drop_caches([d / "ours.pt"])
        t_ours_load, from_ours = _timed(partial(pyfastensor.load, d / "ours.pt"))
        same = all(torch.equal(state[k], from_ours[k]) for k in state)
        stock = torch.load(d / "ours.pt")
        readable = all(torch.equal(state[k], stock[k]) for k in state)
        same = same and all(torch.equal(state[k], from_torch[k]) for k in state)

        lw, lr = limit.write_mbps / 1e3, limit.read_mbps / 1e3
        print(f"\n{'':26}{'GB/s':>8}{'vs torch':>10}{'of disk':>9}")
        print(f"{'save, durable  pyfastensor':26}{gb / t_ours_save:8.2f}"
              f"{t_torch_save / t_ours_save:9.2f}x{gb / t_ours_save / lw:8.0%}")
        print(f"{'               torch.save':26}{gb / t_torch_save:8.2f}{'':10}{gb / t_torch_save / lw:8.0%}")
        print(f"{'load, cold     pyfastensor':26}{gb / t_ours_load:8.2f}"
              f"{t_torch_load / t_ours_load:9.2f}x{gb / t_ours_load / lr:8.0%}")
        print(f"{'               torch.load':26}{gb / t_torch_load:8.2f}{'':10}{gb / t_torch_load / lr:8.0%}")
        print(f"(cold cache by {cold})")
        print(f"round trip identical: {same}; stock torch.load reads our file: {readable}")
        del state, from_torch, from_ours, stock

        ok = same and readable and _offload_demo(d, batch=512 if args.quick else 2048)
        ok = _data_demo(d, files=2000 if args.quick else 20000) and ok
    return 0 if ok else 1


def _offload_demo(d: Path, batch: int) -> bool:
    import torch

    import pyfastensor

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.ReLU())])
    x = torch.randn(batch, 1024)

    def step(ctx: Any) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        t = time.perf_counter()
        with ctx:  # one entry per step: the first step records the unpack order, later ones prefetch along it
            model(x).square().mean().backward()
        return time.perf_counter() - t, [p.grad.clone() for p in model.parameters()]

    base = pyfastensor.offload(policy="none")
    off = pyfastensor.offload(tier="ssd", spill_dir=d, policy="all")
    for _ in range(3):
        t_base, g_base = step(base)
        t_off, g_off = step(off)
    base_peak = base.summary().resident_peak_bytes
    s = off.summary()
    base.close()
    off.close()
    same = all(torch.equal(a, b) for a, b in zip(g_base, g_off, strict=True))
    mib = 1 << 20
    print(f"\ntraining an MLP (4x1024, batch {batch}), last of 3 steps:")
    print(f"  no offload   step {t_base * 1e3:7.1f} ms, resident saved tensors {base_peak / mib:6.1f} MiB")
    print(f"  offload ssd  step {t_off * 1e3:7.1f} ms, resident saved tensors "
          f"{s.resident_peak_bytes / mib:6.1f} MiB "
          f"({s.resident_peak_bytes / max(base_peak, 1):.0%}), stall {s.stall_seconds * 1e3:.1f} ms")
    print(f"  gradients bit-identical: {same}")
    return same


class _Files:
    """A map-style dataset over plain files: what a DataLoader reads without a pack."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        return self.paths[i].read_bytes()


def _keep(batch: list) -> list:
    return batch


def _data_demo(d: Path, files: int) -> bool:
    import hashlib
    import random

    import torch

    from pyfastensor.bench.disk import drop_caches
    from pyfastensor.data import ChunkDataset, pack

    rng = random.Random(0)
    src, classes = d / "images", 10
    paths, digests = [], set()
    for i in range(files):  # class-sorted, as a folder of images is
        p = src / f"class{i * classes // files:02d}" / f"{i:06d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(8 << 10, 24 << 10))
        p.write_bytes(data)
        paths.append(p)
        digests.add(hashlib.sha1(data).digest())
    total = sum(p.stat().st_size for p in paths)
    pack(src, d / "packed", chunk_size=64, seed=0, progress=False)
    budget = total // 4  # a quarter of the data: chunks are read, consumed and read again
    print(f"\nreading one shuffled epoch of {files} files ({total / 2**20:.0f} MiB, {classes} classes), "
          "batch 64, 2 DataLoader workers, cold cache:")

    def epoch(ds: Any, unpack: Callable[[Any], bytes]) -> tuple[float, bool]:
        g = torch.Generator().manual_seed(1)
        dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, generator=g, num_workers=2,
                                         collate_fn=_keep)
        drop_caches(paths + sorted((d / "packed").iterdir()))
        t = time.perf_counter()
        got = [hashlib.sha1(unpack(item)).digest() for batch in dl for item in batch]
        seconds = time.perf_counter() - t
        return seconds, len(got) == files and set(got) == digests

    t_files, once_files = epoch(_Files(paths), lambda b: b)
    with ChunkDataset(d / "packed", memory_budget=budget) as ds:
        t_pack, once_pack = epoch(ds, lambda item: item[0].numpy().tobytes())
        st = ds.stats()
    print(f"  DataLoader over the files   {files / t_files:9.0f} samples/s")
    print(f"  ChunkDataset over the pack  {files / t_pack:9.0f} samples/s  {t_files / t_pack:5.2f}x, "
          f"{st['chunk_reads']} chunk reads, peak {st['peak_bytes'] / 2**20:.0f} of {budget / 2**20:.0f} MiB budget")
    print(f"  every sample once: files {once_files}, pack {once_pack}"
          " (the source repository's `python -m benchmarks data` measures this at scale, against its peers)")
    return once_files and once_pack

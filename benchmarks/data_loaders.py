"""The datasets and readers of ``python -m benchmarks data``: one class-sorted dataset, four formats.

Every sample is a file of ``file_size`` bytes whose first 16 bytes are its
index and its label (little-endian int64 each), then pseudo-random bytes:
whichever loader delivers it, the index is read back from the sample itself
(:func:`header_index`), and the dataset is class-sorted (index ``i`` has
label ``i * classes // files``; files, shards and tars are written in index
order).

Formats, written from the same files by :func:`write_datasets`:

- ``files/<class>/<index>.bin``: the plain files (ImageFolder layout), read
  by torch's ``DataLoader`` with a ``RandomSampler``;
- ``mds/``: MosaicML Streaming shards (``MDSWriter``, columns ``data``,
  ``label``, ``index``; ``--shard-size`` bytes per shard);
- ``wds/shard-NNNNNN.tar``: WebDataset tar shards (``<key>.bin``,
  ``<key>.cls``, ``<key>.idx``; as many samples per shard as ``--shard-size``
  holds);
- ``pack/``: a pyfastensor pack (:func:`pyfastensor.data.pack`, chunks of
  ``--chunk-size`` samples).

:func:`read_epoch` reads one epoch through one loader and returns what it
delivered; ``python -m benchmarks.data_loaders read ...`` runs it in a
process of its own, which the benchmark places in its cgroups.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._child import reply_channel

#: Bytes at the start of every sample: its index and its label, int64 little-endian.
HEADER = 16
#: The loaders, in report order.
LOADERS = ("dataloader", "streaming", "webdataset", "litdata", "chunk")
#: Their names in the report.
LOADER_NAMES = {"dataloader": "DataLoader (files)", "streaming": "Streaming (MDS)",
                "webdataset": "WebDataset (tar)", "litdata": "LitData (optimized)", "chunk": "ChunkDataset"}
#: Samples the WebDataset shuffle buffer holds (its documented example's size).
WDS_BUFFER = 1000
#: Shards the WebDataset shard shuffle draws among (its value for shardshuffle=True).
WDS_SHARD_SHUFFLE = 100
#: The peers' Python packages and what installs them.
PEER_MODULES = {"streaming": ("streaming", "pip install mosaicml-streaming"),
                "webdataset": ("webdataset", "pip install webdataset"),
                "litdata": ("litdata", "pip install litdata")}
#: Where each loader's format of the dataset lies under the dataset's root.
FORMAT_DIRS = {"dataloader": "files", "streaming": "mds", "webdataset": "wds", "litdata": "litdata",
               "chunk": "pack"}


def peer_missing(loader: str) -> str:
    """Why ``loader`` cannot run here (its package is not installed), or ``""``."""
    if loader not in PEER_MODULES:
        return ""
    module, how = PEER_MODULES[loader]
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return "" if found else f"{module} is not installed ({how}, or pip install -r benchmarks/requirements.txt)"


def label_of(index: int | np.ndarray, files: int, classes: int) -> Any:
    """The label of sample ``index`` in a class-sorted dataset of ``files`` samples and ``classes`` classes."""
    return index * classes // files


def header_index(data: Any) -> np.ndarray:
    """The sample indices in a batch of samples (a ``[B, file_size]`` uint8 tensor or array)."""
    a = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
    return np.ascontiguousarray(a[:, :8]).view("<i8").reshape(-1).astype(np.int64)


# ---------------------------------------------------------------- writing


def sample_bytes(index: int, label: int, size: int, pool: bytes, rng: np.random.Generator) -> bytes:
    """One sample: the 16-byte header, then ``size - 16`` bytes from a random offset of ``pool``."""
    body = size - HEADER
    start = int(rng.integers(0, len(pool) - body + 1))
    return (np.array([index, label], dtype="<i8").tobytes() + pool[start:start + body])


def write_files(root: Path, *, files: int, file_size: int, classes: int, seed: int = 0,
                make: Callable[[int, int, np.random.Generator], bytes] | None = None) -> list[Path]:
    """Write the plain files, class-sorted: ``root/c<label>/<index>.bin``, in index order.

    Args:
        root: the folder (created).
        files: samples.
        file_size: bytes per sample, at least 16.
        classes: classes, 1 to ``files``; index ``i`` has label ``i * classes // files``.
        seed: seed of the random contents. Default 0.
        make: ``make(index, label, rng)`` returns a sample's bytes instead of random
            ones (the convergence check's images); each must be ``file_size`` long.

    Returns:
        The paths, by index.
    """
    if file_size < HEADER:
        raise ValueError(f"file size {file_size}: at least {HEADER} bytes (the index and label)")
    if not 1 <= classes <= files:
        raise ValueError(f"{classes} classes for {files} files: expected 1 to {files}")
    rng = np.random.default_rng(seed)
    pool = rng.bytes(max(4 * file_size, 16 << 20))
    width = len(str(classes - 1))
    paths = []
    for label in range(classes):
        (root / f"c{label:0{width}d}").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        label = int(label_of(i, files, classes))
        p = root / f"c{label:0{width}d}" / f"{i:08d}.bin"
        data = make(i, label, rng) if make is not None else sample_bytes(i, label, file_size, pool, rng)
        p.write_bytes(data)
        paths.append(p)
    return paths


def write_mds(out: Path, paths: list[Path], labels: np.ndarray, shard_bytes: int) -> None:
    """Write MosaicML Streaming MDS shards of the files, in index order (columns data, label, index)."""
    from streaming import MDSWriter

    cols = {"data": "bytes", "label": "int", "index": "int"}
    with MDSWriter(out=str(out), columns=cols, size_limit=shard_bytes, progress_bar=False) as w:
        for i, p in enumerate(paths):
            w.write({"data": p.read_bytes(), "label": int(labels[i]), "index": i})


def mds_shard_starts(out: Path) -> np.ndarray:
    """The first sample index of each MDS shard (from its ``index.json``)."""
    doc = json.loads((out / "index.json").read_text())
    counts = [s["samples"] for s in doc["shards"]]
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def write_wds(out: Path, paths: list[Path], labels: np.ndarray, per_shard: int) -> int:
    """Write WebDataset tar shards of ``per_shard`` samples, in index order; return the shard count.

    Each sample is ``<key>.bin`` (the file), ``<key>.cls`` and ``<key>.idx``
    (label and index as text), ``key`` the 8-digit index.
    """
    out.mkdir(parents=True, exist_ok=True)
    shards = 0
    for lo in range(0, len(paths), per_shard):
        with tarfile.open(out / f"shard-{shards:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(lo, min(lo + per_shard, len(paths))):
                key = f"{i:08d}"
                for ext, data in ((".bin", paths[i].read_bytes()), (".cls", str(int(labels[i])).encode()),
                                  (".idx", str(i).encode())):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards += 1
    return shards


def _litdata_sample(item: tuple[str, int, int]) -> dict[str, Any]:
    """One LitData sample from ``(path, label, index)`` (a top-level function: optimize's workers pickle it)."""
    path, label, index = item
    with open(path, "rb") as f:
        return {"data": f.read(), "label": label, "index": index}


def write_litdata(out: Path, paths: list[Path], labels: np.ndarray, shard_bytes: int) -> None:
    """Write LitData's optimized chunks of the files with ``litdata.optimize``, in index order.

    One worker, so that the chunks hold the samples in index order (as the
    MDS and tar shards do); ``chunk_bytes`` is the shards' size.
    """
    import multiprocessing

    import litdata

    # optimize sets the process's start method (to spawn) for good: put it back,
    # or every DataLoader with workers started after it would spawn.
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=_litdata_sample, inputs=[(str(p), int(labels[i]), i) for i, p in enumerate(paths)],
                         output_dir=str(out), chunk_bytes=shard_bytes, num_workers=1, mode="overwrite",
                         keep_data_ordered=True, verbose=False)
    finally:
        multiprocessing.set_start_method(before, force=True)


def litdata_chunk_starts(out: Path) -> np.ndarray:
    """The first sample index of each LitData chunk (from its ``index.json``)."""
    doc = json.loads((out / "index.json").read_text())
    counts = [c["chunk_size"] for c in doc["chunks"]]
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def write_datasets(root: Path, *, files: int, file_size: int, classes: int, shard_bytes: int,
                   chunk_size: int, seed: int = 0, formats: tuple[str, ...] = LOADERS,
                   make: Callable[[int, int, np.random.Generator], bytes] | None = None,
                   say: Callable[[str], None] = lambda _s: None) -> dict[str, Any]:
    """Write the dataset in every format of ``formats`` under ``root`` (reused when already there).

    ``root/layout.json`` records the parameters; a root written with other
    parameters is refused, so a stale dataset is never measured.

    Returns:
        The layout: ``files``, ``file_size``, ``classes``, ``shard_bytes``,
        ``chunk_size``, ``seed``, ``per_shard`` (WebDataset), ``formats``
        (those written), ``dataset_bytes`` and ``pack`` (its stats) where written.
    """
    params = {"files": files, "file_size": file_size, "classes": classes, "shard_bytes": shard_bytes,
              "chunk_size": chunk_size, "seed": seed}
    root.mkdir(parents=True, exist_ok=True)
    meta_path = root / "layout.json"
    meta: dict[str, Any] = {}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in params} != params:
            raise ValueError(f"{root} holds a dataset of other parameters ({meta_path}): remove it "
                             "or pass another --dir")
    meta.update(params)
    meta.setdefault("formats", [])
    meta["dataset_bytes"] = files * file_size
    meta["per_shard"] = max(1, shard_bytes // file_size)

    def done(fmt: str) -> None:
        meta["formats"] = sorted(set(meta["formats"]) | {fmt})
        meta_path.write_text(json.dumps(meta, indent=2))

    labels = label_of(np.arange(files, dtype=np.int64), files, classes)
    width = len(str(classes - 1))
    paths = [root / "files" / f"c{int(labels[i]):0{width}d}" / f"{i:08d}.bin" for i in range(files)]
    if "dataloader" not in meta["formats"]:
        say(f"writing {files} files of {file_size} bytes in {classes} classes ...")
        write_files(root / "files", files=files, file_size=file_size, classes=classes, seed=seed, make=make)
        done("dataloader")
    if "streaming" in formats and "streaming" not in meta["formats"] and not peer_missing("streaming"):
        say("writing the MDS shards (Streaming) ...")
        write_mds(root / "mds", paths, labels, shard_bytes)
        done("streaming")
    if "webdataset" in formats and "webdataset" not in meta["formats"]:
        say("writing the tar shards (WebDataset) ...")
        meta["wds_shards"] = write_wds(root / "wds", paths, labels, meta["per_shard"])
        done("webdataset")
    if "litdata" in formats and "litdata" not in meta["formats"] and not peer_missing("litdata"):
        say("writing LitData's optimized chunks ...")
        write_litdata(root / "litdata", paths, labels, shard_bytes)
        done("litdata")
    if "chunk" in formats and "chunk" not in meta["formats"]:
        say(f"packing (chunks of {chunk_size}) ...")
        from pyfastensor.data import pack

        stats = pack(root / "files", root / "pack", chunk_size=chunk_size, seed=seed, progress=False)
        meta["pack"] = {k: v for k, v in stats.items() if k != "classes"}
        done("chunk")
    os.sync()
    return meta


# ---------------------------------------------------------------- reading


class _Files:
    """The plain files as a map-style dataset: item ``i`` is ``(bytes of file i, label, i)``."""

    def __init__(self, paths: list[str], labels: list[int], transform: Callable[[Any], Any] | None) -> None:
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int, int]:
        import torch

        with open(self.paths[i], "rb", buffering=0) as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return (self.transform(data) if self.transform else data), self.labels[i], i


def file_paths(root: Path, files: int, classes: int) -> list[str]:
    """The plain files' paths, by index."""
    width = len(str(classes - 1))
    return [str(root / "files" / f"c{int(label_of(i, files, classes)):0{width}d}" / f"{i:08d}.bin")
            for i in range(files)]


def _to_tensor(b: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def _litdata_item(transform: Callable[[Any], Any] | None, s: dict[str, Any]) -> tuple[Any, int, int]:
    data = _to_tensor(s["data"])
    return (transform(data) if transform else data), int(s["label"]), int(s["index"])


def make_loader(loader: str, root: Path, layout: dict[str, Any], *, batch_size: int, workers: int,
                seed: int, budget: int, transform: Callable[[Any], Any] | None = None,
                epoch: int = 0) -> tuple[Any, Any, Callable[[Any], int], str]:
    """Build one loader over its format of the dataset in ``root``.

    Every loader yields batches ``(data, label, position)``: ``position`` is
    where the sample lies on disk in the loader's own format (the index for
    files, MDS and tar shards, written in index order; the place in the pack
    for ChunkDataset). ``workers`` may be lowered for ChunkDataset (see
    :func:`chunk_workers_supported`).

    Returns:
        ``(dataloader, dataset, group_of, note)``: ``group_of(position)``
        gives the shard or chunk of a sample (-1 for plain files); ``note``
        says what was adapted, or ``""``.
    """
    import torch

    files, classes = layout["files"], layout["classes"]
    note = ""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    common = {"batch_size": batch_size, "num_workers": workers,
              "persistent_workers": False, "pin_memory": False}
    if loader == "dataloader":
        ds: Any = _Files(file_paths(root, files, classes),
                         [int(x) for x in label_of(np.arange(files), files, classes)], transform)
        dl = torch.utils.data.DataLoader(ds, shuffle=True, generator=g, **common)
        return dl, ds, lambda p: -1, note
    if loader == "streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()

        class _MDS(StreamingDataset):
            def get_item(self, idx: int) -> tuple[Any, int, int]:
                s = super().get_item(idx)
                data = _to_tensor(s["data"])
                return (transform(data) if transform else data), int(s["label"]), int(s["index"])

        ds = _MDS(local=str(root / "mds"), shuffle=True, shuffle_seed=seed + epoch, batch_size=batch_size)
        starts = mds_shard_starts(root / "mds")
        dl = torch.utils.data.DataLoader(ds, **common)
        return dl, ds, lambda p: int(np.searchsorted(starts, p, side="right") - 1), note
    if loader == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in (root / "wds").glob("shard-*.tar"))
        if workers > len(urls):
            note = f"{len(urls)} shards for {workers} workers: workers without a shard idle"

        def sample(s: dict[str, Any]) -> tuple[Any, int, int]:
            data = _to_tensor(s["bin"])
            return (transform(data) if transform else data), int(s["cls"]), int(s["idx"])

        ds = (wds.WebDataset(urls, shardshuffle=WDS_SHARD_SHUFFLE, seed=seed + epoch, empty_check=False)
              .shuffle(WDS_BUFFER).map(sample))
        dl = torch.utils.data.DataLoader(ds, **common)
        per = layout["per_shard"]
        return dl, ds, lambda p: p // per, note
    if loader == "litdata":
        import functools

        import litdata

        ds = litdata.StreamingDataset(str(root / "litdata"), shuffle=True, seed=seed + epoch,
                                      transform=functools.partial(_litdata_item, transform))
        dl = litdata.StreamingDataLoader(ds, **common)
        starts = litdata_chunk_starts(root / "litdata")
        return dl, ds, lambda p: int(np.searchsorted(starts, p, side="right") - 1), note
    if loader == "chunk":
        from pyfastensor.data import ChunkDataset

        ds = ChunkDataset(root / "pack", memory_budget=budget, seed=seed, transform=transform,
                          with_index=True)
        ds.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(ds, shuffle=True, generator=g, **common)
        chunk = layout["chunk_size"]
        return dl, ds, lambda p: p // chunk, note
    raise ValueError(f"unknown loader {loader!r}: expected one of {', '.join(LOADERS)}")


def _probe_chunk_worker(root: str, budget: int) -> None:  # a DataLoader worker's first request
    import torch

    from pyfastensor.data import ChunkDataset

    ds = ChunkDataset(root, memory_budget=budget, with_index=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=1)
    try:
        next(iter(dl))
    finally:
        ds.close()


def chunk_workers_supported(pack: Path, budget: int) -> str:
    """Whether ChunkDataset serves DataLoader workers here: ``""`` if so, else why not.

    Asks one worker for one sample (reading one chunk; run it before the caches are dropped).
    """
    from pyfastensor.errors import UnsupportedError

    try:
        _probe_chunk_worker(str(pack), budget)
    except UnsupportedError as e:
        # Re-raised by DataLoader as "Caught ... Original Traceback ...", the message last.
        last = str(e).strip().splitlines()[-1].split("UnsupportedError: ", 1)[-1]
        return last.split(". ")[0]
    return ""


def read_epoch(loader: str, root: Path, layout: dict[str, Any], *, batch_size: int, workers: int,
               seed: int, budget: int, epoch: int = 0,
               ready: Callable[[], None] | None = None) -> dict[str, Any]:
    """Read one epoch through ``loader`` and return what it delivered, in delivery order.

    ``ready`` is called once the loader is built (its imports done, its index
    read), before the clock starts: the benchmark's child waits there while
    the caches are dropped and the counters reset.

    Returns:
        ``seconds`` (from creating the loader's iterator to its last batch),
        ``samples``, ``bytes`` (sample bytes delivered), ``index`` (each
        sample's index, read from its header), ``label``, ``position`` (on
        disk, see :func:`make_loader`), ``group`` (shard or chunk, -1 for
        plain files), ``batch_sizes``, ``workers``, ``note``, ``mismatch``
        (samples whose carried index or label disagrees with their header)
        and ``chunk_stats`` (ChunkDataset's ``stats()``, else None).
    """
    dl, ds, group_of, note = make_loader(loader, root, layout, batch_size=batch_size, workers=workers,
                                         seed=seed, budget=budget, epoch=epoch)
    if loader == "chunk":
        len(ds)  # opens the server (reads the index) before the clock starts, as the others do
    if ready is not None:
        ready()
    idx, lab, pos, sizes = [], [], [], []
    nbytes = 0
    mismatch = 0
    start = time.perf_counter()
    for data, label, position in dl:
        h = header_index(data)
        idx.append(h)
        lab.append(label.numpy().astype(np.int64))
        pos.append(position.numpy().astype(np.int64))
        sizes.append(len(h))
        nbytes += data.numel()
    seconds = time.perf_counter() - start
    index = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    label = np.concatenate(lab) if lab else np.zeros(0, np.int64)
    position = np.concatenate(pos) if pos else np.zeros(0, np.int64)
    want = label_of(index, layout["files"], layout["classes"])
    mismatch += int(np.count_nonzero(want != label))
    if loader != "chunk":
        mismatch += int(np.count_nonzero(position != index))
    stats = ds.stats() if loader == "chunk" else None
    if loader == "chunk":
        ds.close()
    return {"loader": loader, "seconds": seconds, "samples": int(index.size), "bytes": nbytes,
            "index": index, "label": label, "position": position,
            "group": np.array([group_of(int(p)) for p in position], dtype=np.int64),
            "batch_sizes": np.array(sizes, dtype=np.int64), "workers": workers, "note": note,
            "mismatch": mismatch, "chunk_stats": stats}


def save_result(result: dict[str, Any], out: Path) -> None:
    """Write :func:`read_epoch`'s result: arrays to ``out.npz``, the rest to ``out`` (JSON)."""
    arrays = {k: v for k, v in result.items() if isinstance(v, np.ndarray)}
    np.savez(str(out) + ".npz", **arrays)
    out.write_text(json.dumps({k: v for k, v in result.items() if k not in arrays}))


def load_result(out: Path) -> dict[str, Any]:
    """Read what :func:`save_result` wrote."""
    result = json.loads(out.read_text())
    with np.load(str(out) + ".npz") as z:
        result.update({k: z[k] for k in z.files})
    return result


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_loaders",
                                description="Read one epoch through one loader (the benchmark's child).")
    acts = p.add_subparsers(dest="action", required=True)
    r = acts.add_parser("read")
    r.add_argument("--loader", choices=LOADERS, required=True)
    r.add_argument("--root", required=True)
    r.add_argument("--batch-size", type=int, required=True)
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--epoch", type=int, default=0)
    r.add_argument("--budget", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--handshake", action="store_true",
                   help="print 'ready' once the loader is built and wait for 'go' on stdin")
    args = p.parse_args(argv)
    root = Path(args.root)
    layout = json.loads((root / "layout.json").read_text())

    reply = reply_channel() if args.handshake else None

    def ready() -> None:  # tell the benchmark, then wait for its go (caches dropped)
        if reply is not None:
            print("ready", file=reply, flush=True)
            if sys.stdin.readline().strip() != "go":
                sys.exit(3)

    result = read_epoch(args.loader, root, layout, batch_size=args.batch_size, workers=args.workers,
                        seed=args.seed, budget=args.budget, epoch=args.epoch, ready=ready)
    save_result(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(_main())

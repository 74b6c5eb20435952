"""The StorageWriter: each rank's items as raw records through the Go engines."""

from __future__ import annotations

import dataclasses
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from .. import config, errors
from . import _engines, _native
from ._format import METADATA, Prefix, Record, dtypes
from ._staging import Staging, waves

#: DCP's metadata version of the checkpoints written (filesystem.py's CURRENT_DCP_VERSION).
DCP_VERSION = "1.0.0"


def item_name(index: MetadataIndex) -> str:
    """An item's name in errors: its key, and the chunk's offset when it is a shard."""
    return index.fqn if index.offset is None else f"{index.fqn}@{list(index.offset)}"


class Writer(StorageWriter, BlockingAsyncStager):
    """A :class:`~torch.distributed.checkpoint.StorageWriter` that writes through pyfastensor's engines.

    Each rank writes its items into data files of its own,
    ``__<rank>_<n>_<save id>.pfd``: raw records, each starting on a 4 KiB boundary, no
    pickling of tensors (non-contiguous tensors and views are written as their
    values, conj and neg views resolved). Device tensors pass through pinned host memory in waves of at most
    ``PYFASTENSOR_DCP_STAGING`` bytes (default 1G; read when the writer is made), a data
    file each, so a rank pins that much whatever its share of the state; host tensors
    are written from their own memory, in the file of the wave they fall in. DCP's
    metadata records,
    per item, the file, offset, length, dtype, shape, CRC-32 and the CRC-32 of every
    4 KiB page, so a resharded load reads and checks only the pages it needs. Items
    DCP serializes itself (``WriteItemType.BYTE_IO``) are records of those bytes.

    Durability: each data file is committed (temporary name, fsync, rename, directory
    fsync) before the coordinator writes ``.metadata`` the same way, last; then the
    data files of earlier saves in the directory are removed. A crash at any point
    leaves the previous checkpoint or the new one loadable, never a torn one. With
    ``durable=False`` the fsyncs are skipped (the renames still switch atomically, but
    a power loss may lose the new checkpoint or, on some filesystems, tear it).

    Only the collective protocol is supported (a process group, or none at all); DCP's
    ``use_collectives=False`` mode is refused.

    Args:
        path: the checkpoint directory (made if missing).
        thread_count: transfers in flight per rank; default: the Go core's
            (``transfer.WriteWorkers``).
        engine: None (default: chosen by size, as :func:`pyfastensor.save` does), an
            engine name (``"posix"``, ``"direct"``, ``"uring"``...), ``"dictionaries"``
            (the adaptive dictionaries, rank 0's broadcast where nodes are alike: see
            :mod:`pyfastensor.dcp._engines`), or a
            :class:`~pyfastensor.dictionary.Dictionaries` used as given.
        durable: fsync data files, metadata and directory. Default: ``True``.

    Every dtype of the running torch is saved but quantized ones and those DCP's planner
    cannot size (``uint1``..``uint7``, ``int1``..``int7``, ``bits8``...): a save refuses them
    before writing anything.

    Raises:
        ValueError: ``thread_count`` below 1, or ``PYFASTENSOR_DCP_STAGING`` malformed or
            below 1M.
        UnsupportedError: (from :func:`torch.distributed.checkpoint.save`, wrapped by DCP) an
            item of a dtype that cannot be saved; the message names the item and the dtype.

    Example::

        >>> import torch, torch.distributed.checkpoint as dcp
        >>> from pyfastensor.dcp import Writer, Reader
        >>> sd = {"w": torch.arange(6.0).view(2, 3)}
        >>> dcp.save(sd, storage_writer=Writer("/tmp/ckpt"))
        >>> out = {"w": torch.empty(2, 3)}
        >>> dcp.load(out, storage_reader=Reader("/tmp/ckpt"))
        >>> bool((out["w"] == sd["w"]).all())
        True
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        thread_count: int | None = None,
        engine: Any = None,
        durable: bool = True,
    ) -> None:
        StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=False)
        if thread_count is not None and thread_count < 1:
            raise ValueError(f"thread_count={thread_count}: expected a count >= 1, or None for the default")
        _engines.check(engine)
        self.path = Path(path)
        self.thread_count = thread_count
        self.engine = engine
        self.durable = durable
        self.staging_bytes = config.dcp_staging()
        self.save_id = uuid.uuid4().hex[:12]
        self.rank: int | None = None
        self.is_coordinator = False
        #: How this rank's engine was chosen in the last save (see _engines.Shared.mode).
        self.engine_mode = ""
        #: Stats of this rank's last data file write (bytes, engines, seconds).
        self.last_stats: dict[str, Any] = {}
        self._shared: _engines.Shared | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save, to ``checkpoint_id`` when given."""
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = uuid.uuid4().hex[:12]

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Learn this rank's role; with ``engine="dictionaries"``, share the dictionaries (a collective)."""
        if not kwargs.get("use_collectives", True):
            raise NotImplementedError("pyfastensor.dcp.Writer supports DCP's collective protocol only "
                                      "(use_collectives=False writes per-rank metadata)")
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self._close_shared()
        self.path.mkdir(parents=True, exist_ok=True)
        self._shared = _engines.resolve(self.engine, self.path, self.rank)
        self.engine_mode = self._shared.mode

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Make the directory; the plan is DCP's.

        Raises:
            UnsupportedError: an item's dtype cannot be saved, naming the item and the dtype:
                a quantized one (a record has no room for its scale and zero point), or one
                DCP's planner cannot size (``torch.iinfo`` does not know ``uint4``, ``bits8``...).
        """
        for item in plan.items:  # refused here, before DCP's global plan and any rank's writes
            if item.tensor_data is not None:
                _check_dtype(item, item.tensor_data.properties.dtype)
        self.path.mkdir(parents=True, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give each rank its data file prefix, one save id for all (the coordinator's)."""
        return [dataclasses.replace(p, storage_data=Prefix(i, self.save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items: one native call per data file, device tensors staged
        through pinned memory in waves of at most ``PYFASTENSOR_DCP_STAGING`` bytes, each wave
        a data file of its own (host items go with the wave they fall in)."""
        prefix: Prefix = plan.storage_data if plan.storage_data is not None else Prefix(0, self.save_id)
        staging = Staging()
        data = {id(item): planner.resolve_data(item).detach()  # the tensors; BYTE_IO is resolved when written
                for item in plan.items if item.type != WriteItemType.BYTE_IO}

        def staged(item: Any) -> int:
            t = data.get(id(item))
            return t.numel() * t.element_size() if t is not None and staging.on_device(t) else 0

        results: list[WriteResult] = []
        stats: list[dict[str, Any]] = []
        try:
            for k, wave in enumerate(waves(plan.items, staged, self.staging_bytes)):
                results += self._write_wave(prefix.data_file(k), wave, data, planner, staging, stats)
        finally:
            self._close_shared()
        self.last_stats = _joined(stats)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _write_wave(self, name: str, items: list[Any], data: dict[int, Any], planner: SavePlanner,
                    staging: Staging, stats: list[dict[str, Any]]) -> list[WriteResult]:
        """Write ``items`` as the data file ``name``, in one native call; return their results."""
        keep: list[Any] = []  # the host memory handed to Go, alive until the call returns
        metas: list[tuple[str, tuple[int, ...]]] = []
        addrs: list[int] = []
        sizes: list[int] = []
        for item in items:
            if item.type == WriteItemType.BYTE_IO:
                raw = planner.resolve_data(item).getvalue()
                arr = np.frombuffer(raw, dtype=np.uint8)
                keep.append(raw)
                addrs.append(arr.ctypes.data if arr.size else 0)
                sizes.append(arr.size)
                metas.append(("bytes", ()))
                continue
            t = data[id(item)]
            host = staging.to_host(t)
            keep.append(host)
            addrs.append(host.data_ptr() if host.numel() else 0)
            sizes.append(host.numel() * host.element_size())
            metas.append((str(t.dtype), tuple(t.shape)))
        staging.wait()
        try:
            recs, st = _native.save_items(
                str(self.path / name), [item_name(i.index) for i in items], addrs, sizes,
                durable=self.durable, engine=self._shared.engine if self._shared else None,
                workers=self.thread_count or 0)
        finally:
            del keep
        stats.append(st)
        return [WriteResult(index=item.index, size_in_bytes=rec["length"],
                            storage_data=Record(name, rec["offset"], rec["length"], rec["crc32"], rec["pages"],
                                                dtype, shape))
                for item, rec, (dtype, shape) in zip(items, recs, metas, strict=True)]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit the checkpoint: ``.metadata`` written last, durably; then the data files of
        earlier saves removed."""
        storage: dict[MetadataIndex, Record] = {}
        for per_rank in results:
            for wr in per_rank:
                storage[wr.index] = wr.storage_data
        metadata.version = DCP_VERSION
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        keep = sorted({r.relative_path for r in storage.values()})
        _native.commit(self.path, METADATA, pickle.dumps(metadata), keep, durable=self.durable)

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint id (the directory) and this save's id."""
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike[str]:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` can name a checkpoint directory (a path)."""
        return isinstance(checkpoint_id, str | os.PathLike)

    def _close_shared(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None


def _check_dtype(item: WriteItem, dtype: torch.dtype) -> None:
    """Refuse a tensor item whose dtype a record cannot hold or DCP cannot plan.

    Args:
        item: the item, as DCP planned it.
        dtype: its tensor's dtype.

    Raises:
        UnsupportedError: naming the item, the dtype and why.
    """
    if str(dtype) not in dtypes():
        why = ("a raw record holds a tensor's bytes only, not a quantized tensor's scale and zero point; "
               "dequantize it first")
    else:
        try:
            item.tensor_storage_size()  # what DCP's planner asks of every item (dedup_save_plans)
            return
        except (TypeError, ValueError, RuntimeError) as e:
            why = f"DCP's planner cannot tell its element size ({type(e).__name__}: {e})"
    raise errors.UnsupportedError(
        f"item {item_name(item.index)}: pyfastensor.dcp cannot save a tensor of dtype {dtype}: {why}")


def _joined(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The stats of several data file writes as one: numbers summed, bytes per engine summed."""
    out: dict[str, Any] = {}
    for st in stats:
        for k, v in st.items():
            if isinstance(v, dict):
                d = out.setdefault(k, {})
                for e, n in v.items():
                    d[e] = d.get(e, 0) + n
            elif isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            else:
                out.setdefault(k, v)
    return out

"""The StorageReader: only the byte ranges a load needs, merged, read and checked by Go."""

from __future__ import annotations

import io
import os
import pickle
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from .. import _torch, config, errors
from . import _engines, _native
from ._format import METADATA, Record, dtypes
from ._staging import Staging, is_plain, waves
from ._writer import item_name


def byte_runs(shape: Sequence[int], offsets: Sequence[int], lengths: Sequence[int],
              itemsize: int) -> tuple[np.ndarray, int]:
    """The byte ranges of a hypercube of a row-major tensor.

    The box ``[offsets, offsets + lengths)`` of a contiguous tensor of ``shape`` is a
    set of equal runs: the inner dimensions the box covers whole join its innermost
    partial one into one run, and every index of the dimensions outside gives one
    run. A slice of rows is one run; a slice of columns one run per row.

    Returns:
        The runs' byte offsets, in the box's row-major order (so run ``k`` lands at
        ``k * run_bytes`` of a packed tensor of shape ``lengths``), and ``run_bytes``.
    """
    d = len(shape)
    if d == 0:
        return np.zeros(1, dtype=np.int64), itemsize
    if any(n == 0 for n in lengths):
        return np.zeros(0, dtype=np.int64), 0
    strides = [1] * d
    for j in range(d - 2, -1, -1):
        strides[j] = strides[j + 1] * int(shape[j + 1])
    k = d - 1
    while k > 0 and offsets[k] == 0 and lengths[k] == shape[k]:
        k -= 1
    run = int(lengths[k]) * strides[k]
    starts = np.array([int(offsets[k]) * strides[k]], dtype=np.int64)
    for j in range(k - 1, -1, -1):
        idx = (int(offsets[j]) + np.arange(int(lengths[j]), dtype=np.int64)) * strides[j]
        starts = (idx[:, None] + starts[None, :]).ravel()
    return starts * itemsize, run * itemsize


def _metadata_error(cls: type[Exception], msg: str) -> Exception:
    """A ``cls`` of ``msg``, a failure to read ``.metadata``; ``msg`` is said in a warning too where
    this torch's DCP would hide the error."""
    if _torch.DCP_HIDES_METADATA_ERRORS:  # this torch's DCP would say only that metadata is missing
        warnings.warn(f"pyfastensor.dcp.Reader: {msg}", RuntimeWarning, stacklevel=3)
    return cls(msg)


class Reader(StorageReader):
    """A :class:`~torch.distributed.checkpoint.StorageReader` for checkpoints of :class:`Writer`.

    A load reads only the byte ranges its plan needs: DCP's read items (a saved chunk,
    an offset and a length per dimension) become byte runs of the saved record (one
    for a slice of rows, one per row for a slice of columns), which the Go core widens
    to the 4 KiB pages around them, merges where pages touch, sorts by offset and reads
    through the engine chosen per size. Every byte read is checked: a whole record
    against its CRC-32, any other read against the sums of its pages recorded at save
    time (``verify=False`` skips both). Ranges land in place in contiguous host
    destinations of the saved dtype; other destinations (views, conj and neg views, other
    dtypes, device tensors) get a packed copy, copied in with ``copy_``. Device destinations go through pinned memory in waves of
    at most ``PYFASTENSOR_DCP_STAGING`` bytes (default 1G; read when the reader is made),
    each wave read and copied to the device before the next.

    ``.metadata`` is a pickle (as with DCP's FileSystemReader): load checkpoints you trust.

    Args:
        path: the checkpoint directory.
        engine: as for :class:`Writer` (None: chosen by size; ``"dictionaries"``:
            rank 0's dictionaries broadcast where nodes are alike).
        verify: check CRC-32s. Default: ``True``.

    Raises:
        ValueError: ``PYFASTENSOR_DCP_STAGING`` is malformed or below 1M.
        CorruptFileError: (from :func:`torch.distributed.checkpoint.load`, wrapped by DCP
            when several ranks run) a checksum failed or a data file ends early; the
            message names the file, the item and the offset. Or ``.metadata`` is empty,
            truncated or unreadable; the message names it.
    """

    def __init__(self, path: str | os.PathLike[str], *, engine: Any = None, verify: bool = True) -> None:
        super().__init__()
        _engines.check(engine)
        self.path = Path(path)
        self.engine = engine
        self.verify = verify
        self.staging_bytes = config.dcp_staging()
        self.storage_data: dict[MetadataIndex, Record] = {}
        self.load_id = uuid.uuid4().hex[:12]
        self.rank: int | None = None
        #: How this rank's engine was chosen in the last load.
        self.engine_mode = ""
        #: Stats of this rank's last read, summed over data files: ``requested_bytes``
        #: (asked for), ``data_bytes`` (read from the files), ``extents``.
        self.last_stats: dict[str, Any] = {}
        self._shared: _engines.Shared | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load, from ``checkpoint_id`` when given."""
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = uuid.uuid4().hex[:12]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Unpickle ``.metadata``.

        Raises:
            NotFoundError: the directory holds no committed checkpoint of ours.
            CorruptFileError: ``.metadata`` is empty, truncated or not a pickle; the message
                names it and quotes the unpickler's error.
        """
        p = self.path / METADATA
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            raise _metadata_error(errors.NotFoundError,
                                  f"{p}: no checkpoint here (no {METADATA}; was the save committed?)") from None
        try:
            md = pickle.loads(raw)
        except Exception as e:  # what a damaged pickle raises varies: EOFError, UnpicklingError, ...
            what = "empty" if not raw else "truncated or unreadable"
            raise _metadata_error(errors.CorruptFileError,
                                  f"{p}: {what} checkpoint metadata ({len(raw)} bytes), not a pickle DCP can "
                                  f"load ({type(e).__name__}: {e})") from e
        if not isinstance(md, Metadata):
            raise errors.CorruptFileError(f"{p}: not a torch.distributed.checkpoint Metadata ({type(md).__name__})")
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Keep the items' records; with ``engine="dictionaries"``, share the dictionaries (a collective)."""
        self.storage_data = metadata.storage_data
        if self.storage_data is None:
            raise errors.CorruptFileError(f"{self.path / METADATA}: no storage data")
        foreign = next((r for r in self.storage_data.values() if not isinstance(r, Record)), None)
        if foreign is not None:
            raise errors.InvalidArgumentError(
                f"{self.path}: not a checkpoint of pyfastensor.dcp.Writer (its items are "
                f"{type(foreign).__name__}); read it with torch.distributed.checkpoint.FileSystemReader")
        self.rank = kwargs.get("rank")
        if self._shared is not None:
            self._shared.close()
        self._shared = _engines.resolve(self.engine, self.path, self.rank)
        self.engine_mode = self._shared.mode

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """DCP's plan, as it is."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """DCP's plans, as they are."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the plan's items: per data file, one native call for all its ranges."""
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self._record(req).relative_path, []).append(req)
        totals: dict[str, Any] = {"requested_bytes": 0, "data_bytes": 0, "extents": 0}
        try:
            for rel, reqs in per_file.items():
                st = self._read_file(rel, reqs, planner)
                for k in totals:
                    totals[k] += st.get(k, 0)
        finally:
            if self._shared is not None:
                self._shared.close()
                self._shared = None
        self.last_stats = totals
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _record(self, req: ReadItem) -> Record:
        try:
            return self.storage_data[req.storage_index]
        except KeyError:
            raise errors.CorruptFileError(
                f"{self.path / METADATA}: no record for item {item_name(req.storage_index)}") from None

    def _read_file(self, rel: str, reqs: list[ReadItem], planner: LoadPlanner) -> dict[str, Any]:
        """Read ``reqs``, ranges of the data file ``rel``: device destinations in waves of at
        most ``PYFASTENSOR_DCP_STAGING`` staged bytes, one native call per wave."""
        staging = Staging()
        targets = {id(req): None if req.type == LoadItemType.BYTE_IO else planner.resolve_tensor(req).detach()
                   for req in reqs}

        def staged(req: ReadItem) -> int:
            t = targets[id(req)]
            return t.numel() * t.element_size() if t is not None and staging.on_device(t) else 0

        totals: dict[str, Any] = {}
        for wave in waves(reqs, staged, self.staging_bytes):
            for k, v in self._read_wave(rel, wave, targets, planner, staging).items():
                totals[k] = totals.get(k, 0) + v if isinstance(v, int | float) else v
        return totals

    def _read_wave(self, rel: str, reqs: list[ReadItem], targets: dict[int, Any], planner: LoadPlanner,
                   staging: Staging) -> dict[str, Any]:
        records: list[dict[str, Any]] = []
        index: dict[MetadataIndex, int] = {}
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        after: list[tuple[ReadItem, Any, Any]] = []  # (request, destination, what was read into)
        for req in reqs:
            rec = self._record(req)
            ri = index.get(req.storage_index)
            if ri is None:
                ri = index[req.storage_index] = len(records)
                records.append({"name": item_name(req.storage_index), "offset": rec.offset, "length": rec.length,
                                "crc32": rec.crc32, "pages": rec.pages})
            if req.type == LoadItemType.BYTE_IO:
                buf = np.empty(rec.length, dtype=np.uint8)
                starts, run = np.zeros(1 if rec.length else 0, dtype=np.int64), rec.length
                base = buf.ctypes.data
                after.append((req, None, buf))
            else:
                dtype = dtypes().get(rec.dtype)
                if dtype is None:
                    raise errors.CorruptFileError(f"{self.path / rel}: item {item_name(req.storage_index)}: "
                                                  f"unknown dtype {rec.dtype!r} (not one of torch "
                                                  f"{torch.__version__}'s)")
                target = targets[id(req)]
                lengths = tuple(int(n) for n in req.lengths)
                if tuple(target.shape) != lengths:
                    raise errors.InvalidArgumentError(
                        f"item {item_name(req.storage_index)}: destination of shape {tuple(target.shape)} for a "
                        f"read of {lengths}")
                starts, run = byte_runs(rec.shape, req.storage_offsets, lengths, dtype.itemsize)
                if (not staging.on_device(target) and target.dtype == dtype and target.is_contiguous()
                        and is_plain(target)):
                    dst = target  # in place (a conj or neg view's memory must hold other values)
                else:
                    dst = staging.host_buffer(target, torch.Size(lengths), dtype)
                base = dst.data_ptr()
                after.append((req, target, dst))
            n = len(starts)
            if n:
                parts.append((np.full(n, ri, dtype=np.int64), starts, base + np.arange(n, dtype=np.int64) * run,
                              np.full(n, run, dtype=np.int64)))
        st: dict[str, Any] = {}
        if parts:
            rec_a, off_a, addr_a, size_a = (np.concatenate(c) for c in zip(*parts, strict=True))
            st = _native.read_ranges(str(self.path / rel), records, rec_a, off_a, addr_a, size_a,
                                     verify=self.verify, engine=self._shared.engine if self._shared else None)
        for req, target, dst in after:
            if target is None:
                planner.load_bytes(req, io.BytesIO(dst.tobytes()))
                continue
            if dst is not target:
                staging.copy_to(target, dst)
        staging.wait()
        for req, target, _ in after:
            if target is not None:
                planner.commit_tensor(req, target)
        return st

    @property
    def checkpoint_id(self) -> str | os.PathLike[str]:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` can name a checkpoint directory (a path)."""
        return isinstance(checkpoint_id, str | os.PathLike)

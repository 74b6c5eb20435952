"""Staged saves: a checkpoint whose storage records are written in parts (checkpoint/staged.go).

``async_save`` of a CUDA state larger than its pinned staging buffer writes
each wave of device-to-host copies to the file, then reuses the buffer for
the next: the archive is laid out first (:class:`StagedSave`), the staged
records' bytes written part after part, the rest at :meth:`StagedSave.commit`,
which commits the file durably as :func:`pyfastensor.save` does. The file
is the one ``save`` writes for the same skeleton.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from .. import _lib
from ._native import Records, _arrays


class StagedSave(_lib.Handle):
    """A staged save to ``path`` in progress; closing it without :meth:`commit` aborts it (the
    temporary file is removed, ``path`` untouched).

    Not safe for concurrent use. The memory of the parts that are not staged
    is read at :meth:`commit`: the caller keeps it alive until then.

    Args:
        path: the target.
        records: the records, in order (:func:`~pyfastensor.checkpoint.save.skeleton_records`).
        staged: the records whose bytes :meth:`write` brings, in parts (their addresses
            are ignored); the others are written from their memory at commit.
        durable: fsync the file and its directory at commit. Default ``True``.
        engine: one I/O engine for every record; default: chosen by size.
    """

    _close_fn = "pft_ckpt_stage_abort"

    def __init__(self, path: str, records: Records, staged: Sequence[bool], *, durable: bool = True,
                 engine: str | None = None) -> None:
        super().__init__()
        self.path = path
        n = len(records.names)
        names = records.joined_names()
        addrs, sizes = _arrays([0 if st else a for a, st in zip(records.addrs, staged, strict=True)], records.sizes)
        handle = _lib.u64()
        _lib.call(
            "pft_ckpt_stage_begin", _lib.cstr(path), n, names, addrs, sizes,
            (ctypes.c_int64 * n)(*records.aligns), (ctypes.c_int * n)(*[int(st) for st in staged]),
            _lib.options(engine, durable=durable), ctypes.byref(handle),
        )
        self._handle = handle.value

    def write(self, index: int, offset: int, addr: int, nbytes: int) -> None:
        """Write ``nbytes`` at ``addr`` as staged record ``index``'s bytes from ``offset`` (in order)."""
        _lib.call("pft_ckpt_stage_write", self._live(), index, offset, addr, nbytes)

    def commit(self) -> dict[str, Any]:
        """Write the rest and commit the file; return the save's stats. The save is over either way."""
        with self._lock:
            h, self._handle = self._live(), 0
        return dict(_lib.call_json("pft_ckpt_stage_commit", h))

    def _closed_message(self) -> str:
        return f"staged save of {os.path.basename(self.path)!r} is over"

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
import json
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any

from .. import _lib, config
from ._native import _engine, data_align
from ._skeleton import Skeleton

_P = ctypes.POINTER
_lib.register({
    "pft_ckpt_stage_begin": [_lib.c_char_p, _lib.i64, _lib.c_char_p, _P(_lib.c_void_p), _P(_lib.i64), _P(_lib.i64),
                             _P(_lib.c_int), _lib.c_int, _lib.c_char_p, _lib.c_int, _lib.i64, _lib.c_int,
                             _P(_lib.u64)],
    "pft_ckpt_stage_write": [_lib.u64, _lib.i64, _lib.i64, _lib.c_void_p, _lib.i64],
    "pft_ckpt_stage_commit": [_lib.u64, _P(_lib.c_void_p)],
    "pft_ckpt_stage_abort": [_lib.u64],
})

ARCHIVE = "archive"


@dataclass(frozen=True)
class Part:
    """One record of a staged save: bytes at ``addr`` (written at commit), or, ``staged``, ``nbytes``
    written later by :meth:`StagedSave.write`."""

    name: str
    nbytes: int
    align: int = 0
    addr: int = 0
    staged: bool = False


def skeleton_parts(skel: Skeleton, staged: dict[str, bool]) -> tuple[list[Part], list[Any], dict[str, int]]:
    """The records :func:`pyfastensor.checkpoint.save.write_skeleton` writes for ``skel``, in its
    order: ``(parts, owners of their memory, record index of each storage key)``. Storages whose key
    ``staged`` marks are staged; the others are written from their memory at commit."""
    keep: list[Any] = []

    def meta(name: str, data: bytes) -> Part:
        buf = ctypes.create_string_buffer(data, len(data))
        keep.append(buf)
        return Part(f"{ARCHIVE}/{name}", len(data), 0, ctypes.addressof(buf) if data else 0)

    align = data_align()
    parts = [meta("data.pkl", skel.data), meta(".format_version", b"1"),
             meta(".storage_alignment", str(align).encode()), meta("byteorder", sys.byteorder.encode())]
    index: dict[str, int] = {}
    for key, storage in skel.storages.items():
        index[key] = len(parts)
        if staged.get(key):
            parts.append(Part(f"{ARCHIVE}/data/{key}", storage.nbytes(), align, staged=True))
        else:
            keep.append(storage)
            parts.append(Part(f"{ARCHIVE}/data/{key}", storage.nbytes(), align, storage.data_ptr()))
    parts.append(meta("version", b"3\n"))
    parts.append(meta(".data/serialization_id", "".join(str(secrets.randbelow(10)) for _ in range(40)).encode()))
    return parts, keep, index


class StagedSave(_lib.Handle):
    """A staged save to ``path`` in progress; closing it without :meth:`commit` aborts it (the
    temporary file is removed, ``path`` untouched).

    Not safe for concurrent use. The memory of the parts that are not staged
    is read at :meth:`commit`: the caller keeps it alive until then.

    Args:
        path: the target.
        parts: the records, in order.
        durable: fsync the file and its directory at commit. Default ``True``.
        engine: one I/O engine for every record; default: chosen by size.
    """

    _close_fn = "pft_ckpt_stage_abort"

    def __init__(self, path: str, parts: list[Part], *, durable: bool = True, engine: str | None = None) -> None:
        super().__init__()
        if any("\n" in p.name for p in parts):
            raise ValueError("record names cannot contain a newline")
        self.path = path
        n = len(parts)
        handle = _lib.u64()
        _lib.call(
            "pft_ckpt_stage_begin", _lib.cstr(path), n, "\n".join(p.name for p in parts).encode(),
            (ctypes.c_void_p * n)(*[p.addr or None for p in parts]), (ctypes.c_int64 * n)(*[p.nbytes for p in parts]),
            (ctypes.c_int64 * n)(*[p.align for p in parts]), (ctypes.c_int * n)(*[int(p.staged) for p in parts]),
            int(durable), _engine(engine), config.threads(), config.task_size(), 0, ctypes.byref(handle),
        )
        self._handle = handle.value

    def write(self, index: int, offset: int, addr: int, nbytes: int) -> None:
        """Write ``nbytes`` at ``addr`` as staged record ``index``'s bytes from ``offset`` (in order)."""
        _lib.call("pft_ckpt_stage_write", self._live(), index, offset, addr, nbytes)

    def commit(self) -> dict[str, Any]:
        """Write the rest and commit the file; return the save's stats. The save is over either way."""
        with self._lock:
            h, self._handle = self._live(), 0
        out = ctypes.c_void_p()
        _lib.call("pft_ckpt_stage_commit", h, ctypes.byref(out))
        return dict(json.loads(_lib.take_string(out)))

    def _closed_message(self) -> str:
        return f"staged save of {os.path.basename(self.path)!r} is over"

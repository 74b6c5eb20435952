"""Staged saves: a checkpoint whose storage records are written in parts (checkpoint/staged.go,
checkpoint/stagedraw.go).

A save of CUDA tensors writes each wave of device-to-host copies to the file,
then reuses the pinned buffer for the next (:mod:`._from_device`): the archive
is laid out first (:class:`StagedSave`), the staged storages' bytes written
part after part, the rest at :meth:`StagedSave.commit`, which commits the file
durably as :func:`pyfastensor.save` does. The file is the one ``save`` writes
for the same skeleton. :class:`StagedSafetensors` does the same for a
safetensors file (:func:`pyfastensor.safetensors.save_file`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from .. import _lib
from ._native import STensor, TorchArchive, safetensors_spec


class StagedSave(_lib.Handle):
    """A staged save to ``path`` in progress; closing it without :meth:`commit` aborts it (the
    temporary file is removed, ``path`` untouched).

    The Go core lays the archive out as :func:`pyfastensor.save` does (torch's records, the
    storages aligned for direct I/O). Not safe for concurrent use. The pickle and the memory of
    the storages that are not staged are read at :meth:`commit`: the caller keeps that memory
    alive until then (the archive itself is kept here).

    Args:
        path: the target.
        archive: the archive (:func:`~pyfastensor.checkpoint.save.torch_archive`).
        staged: per storage of ``archive.keys``, whether :meth:`write` brings its bytes, in parts
            (its address is ignored); the others are written from their memory at commit.
        durable: fsync the file and its directory at commit. Default ``True``.
        engine: one I/O engine for every record; default: chosen by size.
        crc32: sum each record and write its CRC-32; ``False`` writes 0 (torch's
            ``set_crc32_options(False)``). Default ``True``.
    """

    _close_fn = "pft_ckpt_stage_abort"

    def __init__(self, path: str, archive: TorchArchive, staged: Sequence[bool], *,
                 durable: bool = True, engine: str | None = None, crc32: bool = True) -> None:
        super().__init__()
        self.path = path
        n = len(archive.keys)
        if len(staged) != n:
            raise ValueError(f"{len(staged)} staged flags for {n} storages")
        self._archive = archive  # the core reads the pickle and the storages' addresses at commit
        handle = _lib.u64()
        _lib.call(
            "pft_ckpt_stage_begin", _lib.cstr(path), *archive.call_args(),
            (ctypes.c_int * n)(*[int(st) for st in staged]),
            _lib.options(engine, durable=durable, crc32=crc32),
            ctypes.byref(handle),
        )
        self._handle = handle.value

    def write(self, index: int, offset: int, addr: int, nbytes: int) -> None:
        """Write ``nbytes`` at ``addr`` as staged storage ``index``'s bytes (its place in the
        archive's keys) from ``offset`` (in order)."""
        self.write_parts([(index, offset, addr, nbytes)])

    def write_parts(self, parts: Sequence[tuple[int, int, int, int]]) -> None:
        """Write ``(index, offset, addr, nbytes)`` parts of staged storages in one native call
        (parallel pieces, as a whole save writes): small storages packed in one buffer, or
        the slots of a ring, reach the disk together. Parts of a storage come in order, here
        and from call to call. The memory is read during the call only."""
        n = len(parts)
        if not n:
            return
        index, offset, addr, size = zip(*parts, strict=True)
        _lib.call("pft_ckpt_stage_write", self._live(), n, (ctypes.c_int64 * n)(*index),
                  (ctypes.c_int64 * n)(*offset), (ctypes.c_void_p * n)(*addr), (ctypes.c_int64 * n)(*size))

    def commit(self) -> dict[str, Any]:
        """Write the rest and commit the file; return the save's stats. The save is over either way."""
        with self._lock:
            h, self._handle = self._live(), 0
        return dict(_lib.call_json("pft_ckpt_stage_commit", h))

    def _closed_message(self) -> str:
        return f"staged save of {os.path.basename(self.path)!r} is over"


class StagedSafetensors(StagedSave):
    """A staged save of a safetensors file to ``path`` (``checkpoint/stagedraw.go``): the Go core
    lays it out as :func:`pyfastensor.safetensors.save_file` does, and writes the header and the
    tensors not staged (from their memory, during the call); :meth:`write` and
    :meth:`write_parts` take the staged ones' bytes by tensor (its place in ``tensors``), then
    :meth:`commit`. Closing it without :meth:`commit` aborts it.

    Args:
        path: the target.
        tensors: every tensor of the file (a staged one's address is ignored).
        metadata: the header's metadata (None: none).
        staged: per tensor, whether its bytes come through :meth:`write`.
        durable: fsync the file and its directory at commit. Default ``True``.
        engine: one I/O engine for every tensor; default: chosen by size.
    """

    def __init__(self, path: str, tensors: Sequence[STensor], metadata: dict[str, str] | None,
                 staged: Sequence[bool], *, durable: bool = True, engine: str | None = None) -> None:
        _lib.Handle.__init__(self)
        self.path = path
        if len(staged) != len(tensors):
            raise ValueError(f"{len(staged)} staged flags for {len(tensors)} tensors")
        spec, addrs = safetensors_spec(tensors, metadata)
        handle = _lib.u64()
        _lib.call("pft_safetensors_stage_begin", _lib.cstr(path), spec, len(tensors), addrs,
                  (ctypes.c_int * len(tensors))(*[int(st) for st in staged]), _lib.options(engine, durable=durable),
                  ctypes.byref(handle))
        self._handle = handle.value

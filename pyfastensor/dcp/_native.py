"""The DCP calls into the Go core (gofastensor/dcp.go, checkpoint/dcp.go).

Memory crosses as addresses, read (save) or filled (read) during the call
only: the callers here keep the owning objects alive until it returns.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _lib

_P = ctypes.POINTER


def save_items(
    path: str, names: Sequence[str], addrs: Sequence[int], sizes: Sequence[int], *,
    durable: bool, engine: Any, workers: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Write items (name, address, nbytes) as a DCP data file at ``path``, committed durably.

    Returns:
        Each item's record ``{"offset", "length", "crc32", "pages"}`` (``pages``: the
        little-endian CRC-32 of each 4 KiB page, as bytes) and the stats.
    """
    if any("\n" in n for n in names):
        raise ValueError("item names cannot contain a newline")
    n = len(names)
    c_addrs = (ctypes.c_void_p * n)(*[a or None for a in addrs])
    c_sizes = (ctypes.c_int64 * n)(*sizes)
    doc = _lib.call_json("pft_dcp_save", _lib.cstr(path), n, "\n".join(names).encode(), c_addrs, c_sizes,
                         _lib.options(engine, durable=durable, workers=workers), None)
    recs = doc["records"] or []
    for r in recs:
        r["pages"] = base64.b64decode(r.get("pages") or "")
    return recs, doc["stats"]


def read_ranges(
    path: str, records: Sequence[dict[str, Any]], rec: np.ndarray, off: np.ndarray, addr: np.ndarray,
    size: np.ndarray, *, verify: bool, engine: Any, workers: int = 0,
) -> dict[str, Any]:
    """Fill ranges of records of the data file at ``path``: range ``i`` is bytes
    ``[off[i], off[i] + size[i])`` of ``records[rec[i]]`` into the memory at ``addr[i]``.

    ``records`` are ``{"name", "offset", "length", "crc32", "pages"}``. With ``verify`` every
    byte read is checked (whole records by CRC-32, the rest by page sums).

    Raises:
        CorruptFileError: a checksum failed or the file ends early; the message names the
            file, the item and the offset.
    """
    doc = [{"name": r["name"], "offset": r["offset"], "length": r["length"], "crc32": r["crc32"],
            "pages": base64.b64encode(r["pages"]).decode()} for r in records]
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (rec, off, addr, size)]
    p64 = [a.ctypes.data_as(_P(_lib.i64)) for a in arrays]
    return _lib.call_json("pft_dcp_read", _lib.cstr(path), json.dumps(doc).encode(), len(arrays[0]), p64[0], p64[1],
                          arrays[2].ctypes.data_as(_P(_lib.c_void_p)), p64[3],
                          _lib.options(engine, verify=verify, workers=workers), None)


def commit(directory: str | os.PathLike[str], name: str, blob: bytes, keep: Sequence[str], *,
           durable: bool) -> list[str]:
    """Write ``blob`` as ``directory/name`` (temporary name, fsync, rename, directory fsync),
    then remove the data files of earlier saves (not in ``keep``); return the paths removed."""
    buf = ctypes.create_string_buffer(blob, len(blob)) if blob else None
    return list(_lib.call_json("pft_dcp_commit", _lib.cstr(directory), name.encode(), buf, len(blob),
                               "\n".join(keep).encode(), _lib.options(durable=durable)))

"""The checkpoint calls into the Go core: write a whole archive, open one, read records.

Memory crosses as addresses: the Go side reads (save) or fills (load) it
during the call only, and the callers here keep the owning objects alive
until the call returns.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _lib
from .._buffers import PageArena


class Entry(NamedTuple):
    """One record of an opened archive, from its validated central directory.

    A named tuple: an archive of 10,000 records makes 10,000 of them per load.
    ``memory`` is where a load puts the record's bytes, as the Go core's load
    planner decided (checkpoint/loadplan.go): ``"aligned"`` (page-aligned memory
    of its own, filled in place by a direct read), ``"allocator"`` (torch's
    memory), ``"pages"`` (its own pages of the area a whole-file read filled),
    or ``""`` when the archive was not opened for a load.
    """

    name: str
    offset: int
    size: int
    crc32: int
    memory: str = ""


def _arrays(addrs: Sequence[int], sizes: Sequence[int]) -> tuple[Any, Any]:
    n = len(addrs)
    return (ctypes.c_void_p * n)(*[a or None for a in addrs]), (ctypes.c_int64 * n)(*sizes)


#: Name of the directory every record lives under, as torch names it for buffers.
ARCHIVE = "archive"


@dataclass
class TorchArchive:
    """What torch.save puts in its zip, for :func:`write_archive` and staged saves: the pickle,
    the byte order record (None: none), the serialization id, the storages' keys with the
    addresses and lengths of their bytes, and the directory the records live under. The Go core
    adds the other records and aligns the storages."""

    pickle: bytes
    byteorder: str | None
    serialization_id: str
    keys: list[str]
    addrs: Any  # ctypes array of c_void_p
    sizes: Any  # ctypes array of c_int64
    #: The directory every record lives under.
    prefix: str = ARCHIVE

    def call_args(self) -> tuple[Any, ...]:
        """The archive as the native writers take it: prefix, pickle and its length, byte order,
        serialization id, the number of storages, their keys, addresses and lengths.

        Raises:
            ValueError: a key holds a newline.
        """
        return (self.prefix.encode(), self.pickle, len(self.pickle),
                self.byteorder.encode() if self.byteorder is not None else None, self.serialization_id.encode(),
                len(self.keys), joined_keys(self.keys), self.addrs, self.sizes)


def joined_keys(keys: Sequence[str]) -> bytes:
    """Storage keys as the native calls take them: one per line.

    Raises:
        ValueError: a key holds a newline.
    """
    joined = "\n".join(keys)
    if joined.count("\n") != max(len(keys) - 1, 0):
        raise ValueError("storage keys cannot contain a newline")
    return joined.encode()


def write_archive(
    path: str, archive: TorchArchive, *, durable: bool, engine: str | None,
    counter: ctypes.c_int64 | None = None, crc32: bool = True,
) -> dict[str, Any]:
    """Write ``archive`` as torch.save's zip at ``path``, its records under ``archive.prefix``
    (see checkpoint/torchzip.go); return stats. ``crc32=False`` writes every CRC-32 as 0.

    Raises:
        ValueError: a key holds a newline.
    """
    return _lib.call_json(
        "pft_ckpt_save_torch", _lib.cstr(path), *archive.call_args(),
        _lib.options(engine, durable=durable, crc32=crc32),
        ctypes.byref(counter) if counter is not None else None)


def read_raw(
    path: str, extents: Sequence[tuple[int, int, int]], *, engine: str | None,
    counter: ctypes.c_int64 | None = None,
) -> dict[str, Any]:
    """Fill memory from ``extents`` (offset, address, nbytes) of the file at ``path``, in parallel."""
    n = len(extents)
    offs = (ctypes.c_int64 * n)(*[e[0] for e in extents])
    addrs, sizes = _arrays([e[1] for e in extents], [e[2] for e in extents])
    return _lib.call_json("pft_raw_read", _lib.cstr(path), n, offs, addrs, sizes, _lib.options(engine),
                          ctypes.byref(counter) if counter is not None else None)


@dataclass(frozen=True)
class STensor:
    """One tensor of a safetensors file to write: its name, safetensors dtype name, shape,
    and the address and length of its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    addr: int
    nbytes: int


def write_safetensors(
    path: str,
    tensors: Sequence[STensor],
    metadata: dict[str, str] | None,
    *,
    durable: bool,
    engine: str | None,
    counter: ctypes.c_int64 | None = None,
) -> dict[str, Any]:
    """Write ``tensors`` and ``metadata`` as a safetensors file at ``path``, laid out by the
    Go core (checkpoint/safetensors.go), committed durably; return stats.

    ``metadata`` keeps its order; None writes no ``__metadata__``.
    """
    spec, addrs = safetensors_spec(tensors, metadata)
    return _lib.call_json("pft_safetensors_save", _lib.cstr(path), spec, len(tensors), addrs,
                          _lib.options(engine, durable=durable),
                          ctypes.byref(counter) if counter is not None else None)


def safetensors_spec(tensors: Sequence[STensor], metadata: dict[str, str] | None) -> tuple[bytes, Any]:
    """The JSON spec of a safetensors file the Go core lays out, and the tensors' addresses."""
    spec = {
        "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "size": t.nbytes} for t in tensors],
        "metadata": None if metadata is None else [{"key": k, "value": v} for k, v in metadata.items()],
    }
    return json.dumps(spec).encode(), (ctypes.c_void_p * len(tensors))(*[t.addr or None for t in tensors])


def layout_safetensors(tensors: Sequence[STensor], metadata: dict[str, str] | None) -> tuple[bytes, list[int], int]:
    """The header, each tensor's offset and the total size of the safetensors bytes of
    ``tensors`` and ``metadata``, laid out by the Go core as the safetensors package lays them
    out in memory (``pft_safetensors_layout``); the tensors' addresses are not read."""
    spec, _ = safetensors_spec(tensors, metadata)
    out = _lib.call_json("pft_safetensors_layout", spec)
    return base64.b64decode(out["header"]), out["offsets"], out["size"]


def parse_safetensors(name: str, data: Any, nbytes: int) -> dict[str, Any]:
    """The validated header of the ``nbytes`` safetensors bytes at address ``data``, as
    :class:`SafetensorsFile` describes a file's (offsets from ``data``); ``name`` is what an
    error calls them (``pft_safetensors_parse``)."""
    return _lib.call_json("pft_safetensors_parse", _lib.cstr(name), data, nbytes)


class SafetensorsFile(_lib.Handle):
    """A safetensors file opened by the Go core, its header validated (checkpoint/safetensors.go).

    The file stays open until :meth:`close`: read the tensors from :attr:`source`, which
    names the file parsed even after a save has replaced it at ``path``.

    Raises:
        CorruptFileError: the header is malformed or inconsistent, or the file is truncated.
    """

    _close_fn = "pft_safetensors_close"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)
        handle = _lib.u64()
        desc = _lib.call_json("pft_safetensors_open", _lib.cstr(self.path), ctypes.byref(handle))
        self._handle = handle.value
        self.size: int = desc["file_size"]
        #: ``{"name", "dtype", "shape", "begin", "end"}`` of each tensor in the header's order;
        #: ``begin`` and ``end`` are file offsets.
        self.tensors: list[dict[str, Any]] = desc["tensors"]
        self.metadata: dict[str, str] | None = desc["metadata"]
        #: A name that opens the file parsed, while it is open (:func:`same_file`).
        self.source = same_file(desc.get("fd", -1), self.path)

    def _closed_message(self) -> str:
        return f"safetensors file {self.path!r} is closed"


def same_file(fd: int, path: str) -> str:
    """A name that opens the file open as ``fd`` (read from ``path``) even after a save's
    rename has replaced it there: ``/proc/self/fd/<fd>``, or ``path`` without /proc."""
    name = f"/proc/self/fd/{fd}"
    return name if fd >= 0 and os.path.exists(name) else path


class Archive(_lib.Handle):
    """An archive opened by the Go core, its central directory validated.

    The file stays open until :meth:`close`: reads go to the file that was
    parsed, even after a save has replaced it at ``path``. :meth:`load` opens
    one for a load, deciding how (``checkpoint/load.go``).

    Args:
        path: the zip file.

    Raises:
        CorruptFileError: when the central directory, a local header or a data
            descriptor fails a check, or the file is truncated.
    """

    _close_fn = "pft_ckpt_close"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.fspath(path)
        handle = _lib.u64()
        desc = _lib.call_json("pft_ckpt_open", _lib.cstr(self.path), ctypes.byref(handle))
        self._handle = handle.value
        self._describe(desc)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, parse_only: bool = False, verify: bool = True,
        engine: Any = None, counter: ctypes.c_int64 | None = None,
    ) -> Archive:
        """Open the file at ``path`` for a load, in one native call (``checkpoint.Load``): one
        open, one read of the end records. :attr:`fallback` says why :func:`torch.load` must
        take the file instead (nothing else was read then). Otherwise :attr:`plan` says how
        the load goes: a cold file of ours is read whole, through ``engine``'s default, into
        :attr:`arena` (its records' CRC-32s summed as it lands, with ``verify``; ``counter``
        counts its bytes) and parsed from there; other files are parsed in place, each
        entry's :attr:`Entry.memory` planned.

        Args:
            path: the file.
            parse_only: the caller reads the records its own way (a mapped load, one to a
                device): parsed in place, no memory planned, never read whole.
            verify: see above.
            engine: an engine name or dictionaries chosen by the caller (never read whole).
            counter: see above.

        Raises:
            CorruptFileError: as :class:`Archive`.
            FileNotFoundError: no file at ``path``.
        """
        self = cls.__new__(cls)
        _lib.Handle.__init__(self)
        self.path = os.fspath(path)
        handle = _lib.u64()
        desc = _lib.call_json("pft_ckpt_load", _lib.cstr(self.path), int(parse_only),
                              _lib.options(engine, verify=verify),
                              ctypes.byref(counter) if counter is not None else None, ctypes.byref(handle))
        self._handle = handle.value
        self._describe(desc)
        return self

    def _describe(self, desc: dict[str, Any]) -> None:
        self.size: int = desc["file_size"]
        #: How :meth:`load` planned the load: ``{"whole", "request", "engine", "resident", "reason"}``.
        self.plan: dict[str, Any] = desc.get("plan") or {}
        #: The memory :meth:`load` read the file whole into, owned here: closed after the archive.
        self.arena: PageArena | None = PageArena.adopt(desc["arena"], self.size) if desc.get("arena") else None
        #: A name that opens the file parsed, while the archive is open (:func:`same_file`).
        self.source = same_file(desc.get("fd", -1), self.path)
        self.entries: list[Entry] = [
            Entry(e["name"], e["offset"], e["size"], e["crc32"], e.get("memory", ""))
            for e in desc["entries"] or []
        ]
        self.index: dict[str, int] = {e.name: i for i, e in enumerate(self.entries)}
        #: The directory of torch's records, with its slash (``"archive/"``).
        self.prefix: str = desc.get("prefix", "")
        #: Why a load hands the file to :func:`torch.load` (not a zip archive, a TorchScript
        #: archive, compressed records, not torch's layout), as the Go core found when parsing
        #: it; ``""``: read here.
        self.fallback: str = desc.get("fallback", "")

    @property
    def read_whole(self) -> bool:
        """Whether the file was read whole into :attr:`arena`."""
        return self.arena is not None

    def close(self) -> None:
        """Release the native archive, then the pages of :attr:`arena` no tensor took (idempotent)."""
        super().close()
        arena = getattr(self, "arena", None)
        if arena is not None:
            arena.close()

    def read(
        self,
        reads: Sequence[tuple[int, int, int]],
        *,
        verify: bool = True,
        engine: str | None = None,
        counter: ctypes.c_int64 | None = None,
    ) -> dict[str, Any]:
        """Fill memory with records: ``reads`` holds ``(entry index, address, nbytes)``.

        The caller keeps the destination memory alive until this returns.
        """
        n = len(reads)
        idx = (ctypes.c_int64 * n)(*[r[0] for r in reads])
        addrs, sizes = _arrays([r[1] for r in reads], [r[2] for r in reads])
        return _lib.call_json(
            "pft_ckpt_read", self._live(), n, idx, addrs, sizes, _lib.options(engine, verify=verify),
            ctypes.byref(counter) if counter is not None else None)

    def verify(self, records: Sequence[tuple[int, int, int]], *, counter: ctypes.c_int64 | None = None) -> None:
        """Check the CRC-32s of records already in memory: ``records`` holds
        ``(entry index, address, nbytes)``, typically over a mapping of the file.

        Raises:
            CorruptFileError: a record's bytes do not match its CRC-32.
            OSError: the memory faulted (the mapped file was truncated).
        """
        n = len(records)
        idx = (ctypes.c_int64 * n)(*[r[0] for r in records])
        addrs, sizes = _arrays([r[1] for r in records], [r[2] for r in records])
        _lib.call("pft_ckpt_verify", self._live(), n, idx, addrs, sizes, _lib.options(),
                  ctypes.byref(counter) if counter is not None else None)

    def resident(self) -> list[float]:
        """The share of each entry's data in the page cache now, from 0 to 1 (cachestat, or
        mincore), for inspection: a load takes its decisions from the planner instead."""
        return [float(x) for x in _lib.call_json("pft_ckpt_resident", self._live())]

    def read_bytes(self, name: str, *, verify: bool = True) -> bytes:
        """Return the bytes of the record called ``name``."""
        i = self.index[name]
        buf = ctypes.create_string_buffer(max(self.entries[i].size, 1))
        self.read([(i, ctypes.addressof(buf), self.entries[i].size)], verify=verify)
        return buf.raw[: self.entries[i].size]

    def _closed_message(self) -> str:
        return f"archive {self.path!r} is closed"


class RingRead(_lib.Handle):
    """A file read through a ring of slots reused from fill to fill, all in one native transfer
    (``transfer/ring.go``): its pieces stay in flight across fills, and a fill starts landing
    in its slot only once the fill before it there has been released. Made by
    :meth:`of_archive` (records of an archive, their CRC-32s checked) or :meth:`of_file` (raw
    extents of a file).

    Take the fills in order with :meth:`next`, copy each out of its slot, and release it in a
    later call. Closing (at the end of a ``with`` block too) stops the reads and returns once
    none is in flight: the slots' memory must outlive it.
    """

    _close_fn = "pft_ring_close"

    def __init__(self, fn: str, first: Any, slots: Sequence[int], slot_bytes: int, fill_slots: Sequence[int],
                 columns: Sequence[Sequence[int]], options: bytes, counter: ctypes.c_int64 | None,
                 what: str) -> None:
        super().__init__()
        self.what = what
        i64 = ctypes.c_int64
        n = len(columns[0]) if columns else 0
        cols = [(i64 * n)(*col) if n else None for col in columns]
        handle = _lib.u64()
        _lib.call(fn, first, len(slots), (ctypes.c_void_p * len(slots))(*slots), slot_bytes, len(fill_slots),
                  (i64 * len(fill_slots))(*fill_slots), n, *cols, options,
                  ctypes.byref(counter) if counter is not None else None, ctypes.byref(handle))
        self._handle = handle.value

    @classmethod
    def of_archive(cls, archive: Archive, slots: Sequence[int], slot_bytes: int, fill_slots: Sequence[int],
                   parts: Sequence[tuple[int, int, int, int, int]], *, verify: bool = True, engine: Any = None,
                   counter: ctypes.c_int64 | None = None) -> RingRead:
        """Read records of ``archive`` (kept open by the Go core until :meth:`close`).

        Args:
            archive: the opened archive.
            slots: the address of each slot, each ``slot_bytes`` long.
            slot_bytes: the slots' size.
            fill_slots: the slot of each fill.
            parts: ``(fill, entry index, offset in the record, bytes, offset in the slot)``, in
                fill order; the parts of a record in order and covering it.
            verify: check each record's CRC-32 as :meth:`next` completes it. Default ``True``.
            engine: an engine name or open dictionaries; None: the default choice.
            counter: advanced by the bytes landed, from the reads' threads.

        Raises:
            ValueError: a plan that breaks the rules above (from the Go core).
        """
        fill, rec, off, n, at = zip(*parts, strict=True) if parts else ((),) * 5
        r = cls("pft_ckpt_ring_start", archive._live(), slots, slot_bytes, fill_slots, (fill, rec, off, n, at),
                _lib.options(engine, verify=verify), counter, archive.path)
        r.archive = archive  # the handle it holds stays valid while the read runs
        return r

    @classmethod
    def of_file(cls, path: str, slots: Sequence[int], slot_bytes: int, fill_slots: Sequence[int],
                parts: Sequence[tuple[int, int, int, int]], *, engine: Any = None,
                counter: ctypes.c_int64 | None = None) -> RingRead:
        """Read raw extents of the file at ``path``: ``parts`` holds ``(fill, file offset, bytes,
        offset in the slot)``, in fill order; the other arguments are :meth:`of_archive`'s.

        Raises:
            CorruptFileError: (from :meth:`next`) the file ends before an extent's end.
        """
        fill, off, n, at = zip(*parts, strict=True) if parts else ((),) * 4
        return cls("pft_raw_ring_start", _lib.cstr(path), slots, slot_bytes, fill_slots, (fill, off, n, at),
                   _lib.options(engine), counter, path)

    def next(self, release: int = -1) -> int:
        """Release fill ``release``'s slot (-1: none), then wait for the next fill in order and
        return its index, or -1 once every fill has been returned.

        Raises:
            CorruptFileError: a record the fill completes does not match its CRC-32, or the file
                ends inside what it reads.
            OSError: a read failed.
        """
        out = _lib.i64()
        _lib.call("pft_ring_next", self._live(), release, ctypes.byref(out))
        return int(out.value)

    def _closed_message(self) -> str:
        return f"ring read of {self.what!r} is closed"

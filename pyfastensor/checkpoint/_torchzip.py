"""The zip reader torch.serialization._load expects, served from records read by the Go core.

torch's ``_load`` does the unpickling that makes ``pyfastensor.load`` a true
drop-in (persistent ids, ``map_location``, byte order, the weights-only
unpickler, storages shared between tensors). It asks its zip reader for
records by name; :class:`PreloadedZip` answers from memory that one
parallel, CRC-checked native read filled beforehand: small records as
bytes, storage records as uint8 tensors allocated once and never copied
again.
"""

from __future__ import annotations

import ctypes
import re
import sys
from typing import Any

import torch

from .. import _torch
from .._buffers import PageArena, empty_aligned
from ..errors import CorruptFileError
from ._native import Archive

#: Device types other than the CPU, as storage locations name them.
_DEVICE_NAMES = tuple(d.encode() for d in (
    "cuda", "mps", "xpu", "hpu", "meta", "xla", "lazy", "mtia", "ipu", "ve", "maia", "vulkan",
    "privateuseone", _torch.privateuse1_backend_name(),
))


class PreloadedZip:
    """Records of ``archive`` under its prefix, in the shape of ``torch._C.PyTorchFileReader``;
    taken from its arena when the file was read whole into one."""

    def __init__(self, archive: Archive, *, storages: bool = True) -> None:
        self.archive = archive
        self.prefix = prefix = archive.prefix
        self.arena = arena = archive.arena
        data = prefix + "data/"
        self._small: dict[str, Any] = {}  # name -> ctypes buffer, then bytes
        self._tensors: dict[str, torch.Tensor] = {}
        #: Entry indices of the storage records.
        self.storage_indices = [i for i, e in enumerate(archive.entries) if e.name.startswith(data)]
        #: Bytes of storage records.
        self.data_bytes = sum(archive.entries[i].size for i in self.storage_indices)
        if arena is not None:
            self._from_arena(arena, data)
            return
        # Each storage goes where the load planner put it (Entry.memory):
        # page-aligned memory of its own, in huge pages, that a direct read
        # fills in place or the page cache copies into ("aligned": large
        # records), or torch's memory (the rest).
        # A mapped load (storages=False) takes its storages from the mapping
        # instead.
        for e in archive.entries:
            if e.name.startswith(data):
                if not storages:
                    continue
                self._tensors[e.name] = (empty_aligned(e.size) if e.memory == "aligned"
                                         else torch.empty(e.size, dtype=torch.uint8))
            else:
                self._small[e.name] = ctypes.create_string_buffer(max(e.size, 1))

    def _from_arena(self, arena: PageArena, data: str) -> None:
        """Take the records from the whole file in ``arena`` (read, not yet verified): storages
        the planner gave their pages (``"pages"``) get them; the other storages get torch's
        memory, which :meth:`read_storages` fills from the arena; the other records are
        copied out now."""
        #: Entry indices of the storages whose pages are theirs in the arena.
        self._carved: list[int] = []
        #: ``(entry index, address, nbytes)`` of the storages to copy out of the arena.
        self._copies: list[tuple[int, int, int]] = []
        for i, e in enumerate(self.archive.entries):
            if not e.name.startswith(data):
                self._small[e.name] = ctypes.string_at(arena.addr + e.offset, e.size)
            elif e.memory == "pages":
                self._tensors[e.name] = arena.take(e.offset, e.size)
                self._carved.append(i)
            else:
                t = self._tensors[e.name] = torch.empty(e.size, dtype=torch.uint8)
                self._copies.append((i, t.data_ptr(), e.size))

    def _verify_arena(self, indices: list[int], counter: ctypes.c_int64 | None) -> None:
        """Check the CRC-32s of records in the arena (the bytes every copy was made from)."""
        assert self.arena is not None
        es = self.archive.entries
        self.archive.verify([(i, self.arena.addr + es[i].offset, es[i].size) for i in indices], counter=counter)

    def read_small(self, *, verify: bool) -> None:
        """Fill the records that are not storages (the pickle, the byte order...)."""
        idx = self.archive.index
        if self.arena is not None:
            if verify:
                self._verify_arena([idx[n] for n in self._small], None)
            return
        reads = [(idx[n], ctypes.addressof(b), self.archive.entries[idx[n]].size)
                 for n, b in self._small.items() if not isinstance(b, bytes)]
        if reads:
            self.archive.read(reads, verify=verify)
        self._small = {n: b if isinstance(b, bytes) else b.raw[: self.archive.entries[idx[n]].size]
                       for n, b in self._small.items()}

    def read_storages(self, *, verify: bool, engine: str | None, counter: ctypes.c_int64 | None) -> None:
        """Fill the storage records, in one parallel native read, straight into their tensors
        (with an arena: check them, the file having been read whole)."""
        idx = self.archive.index
        if self.arena is not None:
            # The Go core copies the others out of the arena in parallel, each checked
            # from the page sums taken as the file landed.
            if self._copies:
                self.archive.read(self._copies, verify=verify, counter=counter)
            if verify:
                self._verify_arena(self._carved, counter)
            elif counter is not None:
                counter.value = self.data_bytes
            return
        reads = [(idx[n], t.data_ptr(), t.numel()) for n, t in self._tensors.items()]
        self.archive.read(reads, verify=verify, engine=engine, counter=counter)

    def native_order(self) -> bool:
        """Whether torch would leave the storages' bytes as they are: the ``byteorder`` record
        is this machine's, or, without one, ``torch.serialization.get_default_load_endianness()`` is."""
        order = self._small.get(self.prefix + "byteorder")
        if order is None:
            ends = torch.serialization.LoadEndianness
            default = torch.serialization.get_default_load_endianness()
            if default == ends.NATIVE:
                return True
            order = b"big" if default == ends.BIG else b"little"
        return order == sys.byteorder.encode()

    def cpu_only(self) -> bool:
        """Whether every storage was saved from the CPU, and torch leaves their bytes in this
        machine's byte order (:meth:`native_order`).

        Read from the pickle's bytes without unpickling: any device name
        other than ``cpu`` in them (even inside a key) answers no. Torch's
        ``_load`` then moves no storage (a map location of the CPU), which
        is only half of what lets a load unpickle while its records are
        still being read: the unpickler must not read them either (see
        ``load.py``).
        """
        pkl = self._small.get(self.prefix + "data.pkl", b"")
        return self.native_order() and not any(d in pkl for d in _DEVICE_NAMES)

    # The reader interface torch.serialization._load uses.

    def has_record(self, name: str) -> bool:
        return self.prefix + name in self.archive.index

    def get_record(self, name: str) -> bytes:
        try:
            return self._small[self.prefix + name]
        except KeyError:
            raise RuntimeError(f"record {name} not found in {self.archive.path}") from None

    def get_storage_from_record(self, name: str, numel: int, _cls: Any) -> torch.Tensor:
        full = self.prefix + name
        t = self._tensors.get(full)
        if t is None:
            raise CorruptFileError(
                f"checkpoint: {self.archive.path} is corrupt: record {full!r} is referenced by the "
                "pickle but missing from the archive"
            )
        if t.numel() != numel:
            raise CorruptFileError(
                f"checkpoint: {self.archive.path} is corrupt: record {full!r} has {t.numel()} "
                f"bytes, the pickle expects {numel}"
            )
        return t

    def get_record_offset(self, name: str) -> int:
        return self.archive.entries[self.archive.index[self.prefix + name]].offset

    def get_all_records(self) -> list[str]:
        return [n[len(self.prefix):] for n in self.archive.index]

    def serialization_id(self) -> str:
        return self._small.get(self.prefix + ".data/serialization_id", b"").decode("ascii", "replace")


class _MetaZip(PreloadedZip):
    """Like PreloadedZip, with storages on the meta device: the skeleton without the data."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.prefix = prefix = archive.prefix
        self._small = {prefix + n: archive.read_bytes(prefix + n)
                       for n in ("data.pkl", "byteorder", ".format_version", ".storage_alignment")
                       if prefix + n in archive.index}
        self.storages: dict[str, torch.Tensor] = {}

    def get_storage_from_record(self, name: str, numel: int, _cls: Any) -> torch.Tensor:
        t = self.storages.setdefault(name, torch.empty(numel, dtype=torch.uint8, device="meta"))
        return t


def key_paths(archive: Archive, message: str) -> list[str]:
    """Key paths (``['model']['w']``) of the tensors whose storage is the record ``message`` names."""
    prefix = archive.prefix
    m = re.search(r'record "([^"]+)"', message)
    if not m or not m.group(1).startswith(prefix + "data/"):
        return []
    name = m.group(1)[len(prefix):]
    zf = _MetaZip(archive)
    obj = _torch.load_records(zf, "cpu", _torch.weights_only_unpickler, weights_only=True,
                              encoding="utf-8")
    target = zf.storages.get(name)
    if target is None:
        return []
    want = target.untyped_storage()._cdata
    out: list[str] = []
    _walk(obj, "", want, out, 0)
    return out


def _walk(obj: Any, path: str, want: int, out: list[str], depth: int) -> None:
    if depth > 50:
        return
    if isinstance(obj, torch.Tensor):
        if obj.untyped_storage()._cdata == want:
            out.append(path or "<root>")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", want, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", want, out, depth + 1)

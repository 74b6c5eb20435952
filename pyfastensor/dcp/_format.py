"""What a pyfastensor DCP checkpoint holds, beside DCP's own metadata.

A checkpoint directory holds each rank's data files of a save,
``__<rank>_<n>_<save id>.pfd`` (raw records, each on a 4 KiB boundary, see
checkpoint/dcp.go; a file per wave of device tensors staged through pinned
memory, :mod:`pyfastensor.dcp._staging`), and ``.metadata``: DCP's :class:`Metadata`, pickled, whose
``storage_data`` maps each item's :class:`MetadataIndex` to a :class:`Record`.
Only Python reads ``.metadata`` (as DCP's FileSystemReader does: it is a
pickle, to be loaded from trusted directories only).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

#: The metadata's file name (DCP's own).
METADATA = ".metadata"

#: Data files end with this (checkpoint.DataFileSuffix).
SUFFIX = ".pfd"


def _plain(dtype: torch.dtype) -> bool:
    """Whether a host tensor of ``dtype`` is its bytes and nothing else: ``torch.empty`` makes one
    and it is not quantized (whose scale and zero point a record has no room for)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental" (complex32), "deprecated" (qint8)
            t = torch.empty(0, dtype=dtype)
    except (RuntimeError, TypeError, ValueError):
        return False
    return not t.is_quantized


@functools.cache
def dtypes() -> dict[str, torch.dtype]:
    """The dtypes a record can hold, by ``str(dtype)``: every dtype of the running torch (read from
    ``torch``'s own attributes, so a new release adds its own) but the quantized ones."""
    found = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    return {str(d): d for d in sorted(found, key=str) if _plain(d)}


@dataclass(frozen=True)
class Record:
    """Where one item lies and how to check it.

    Attributes:
        relative_path: the data file, relative to the checkpoint directory.
        offset: the record's file offset (a multiple of 4 KiB).
        length: its bytes.
        crc32: the CRC-32 (IEEE) of its bytes.
        pages: the CRC-32 of each 4 KiB page of it, little-endian, 4 bytes each
            (the last page partial when ``length`` is not a multiple of 4 KiB): what a
            read of part of the record is checked against.
        dtype: the tensor's dtype as ``str(torch.dtype)``, or ``"bytes"`` for an
            item DCP serialized (WriteItemType.BYTE_IO).
        shape: the saved chunk's shape (``()`` for bytes).
    """

    relative_path: str
    offset: int
    length: int
    crc32: int
    pages: bytes
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Prefix:
    """A rank's share of a save, set by the coordinator (``SavePlan.storage_data``)."""

    rank: int
    save_id: str

    def data_file(self, n: int = 0) -> str:
        """The name of the rank's ``n``-th data file of this save."""
        return f"__{self.rank}_{n}_{self.save_id}{SUFFIX}"

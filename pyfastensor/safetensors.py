"""safetensors files through pyfastensor's engines: ``save_file`` / ``load_file``.

Signature-compatible with :mod:`safetensors.torch`, and the files are plain
safetensors files (the ``safetensors`` package reads them and validates
them). What differs is how bytes move: tensors are written and read in
parallel through the I/O engines, straight from and into tensor memory,
and saves are durable (temporary file, fsync, rename, directory fsync).
The JSON header is padded with spaces so the data region starts on 4 KiB.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, BinaryIO

import torch

from ._buffers import empty_bytes
from .checkpoint import _progress
from .checkpoint._native import read_raw, same_file, write_raw
from .errors import CorruptFileError

#: safetensors dtype names.
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}
_NAMES = {v: k for k, v in DTYPES.items()}

#: The data region starts on this boundary.
ALIGN = 4096
_MAX_HEADER = 100_000_000


def _check(tensors: dict[str, torch.Tensor]) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    spans: dict[tuple[Any, int], list[tuple[int, int, str]]] = {}
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise ValueError(f"Key {k!r} is invalid: keys must be str")
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            raise ValueError(f"You are trying to save a sparse tensor: `{k}`; call .to_dense() first")
        if not v.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{k}`; call .contiguous() first")
        if v.dtype not in _NAMES:
            raise ValueError(f"Key `{k}`: dtype {v.dtype} has no safetensors name")
        if v.numel() and v.device.type != "meta":
            start = v.data_ptr()
            spans.setdefault((v.device, v.untyped_storage().data_ptr()), []).append(
                (start, start + v.numel() * v.element_size(), k))
    for group in spans.values():
        group.sort()
        for (_, end, a), (start, _, b) in zip(group, group[1:], strict=False):
            if start < end:
                raise RuntimeError(
                    f"Some tensors share memory ({a!r} and {b!r}): this would duplicate memory on disk. "
                    "Save clones, or use pyfastensor.save, which keeps sharing."
                )


def save_file(
    tensors: dict[str, torch.Tensor],
    filename: str | os.PathLike[str],
    metadata: dict[str, str] | None = None,
    *,
    durable: bool = True,
    engine: str | None = None,
    progress: bool | None = None,
) -> None:
    """Save a dict of tensors as a safetensors file, like :func:`safetensors.torch.save_file`.

    Args:
        tensors: names to contiguous, dense tensors that do not share memory.
        filename: the file to write.
        metadata: text-only metadata for the header. Default: none.
        durable: fsync the file and its directory. Default: ``True``.
        engine: one I/O engine for every tensor; default: chosen by size.
        progress: progress bar for long saves. Default: ``PYFASTENSOR_PROGRESS``.

    Example::

        >>> import torch
        >>> from pyfastensor.safetensors import save_file, load_file
        >>> save_file({"w": torch.zeros(2, 2)}, "/tmp/w.safetensors")
        >>> load_file("/tmp/w.safetensors")["w"].shape
        torch.Size([2, 2])
    """
    _check(tensors)
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map str to str")
        header["__metadata__"] = metadata
    off = 0
    host: dict[str, torch.Tensor] = {}  # alive until the native call returns
    for k in order:
        t = tensors[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        host[k] = t.detach().cpu() if t.device.type != "cpu" else t.detach()
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % ALIGN)
    head = torch.frombuffer(bytearray(struct.pack("<Q", len(text)) + text), dtype=torch.uint8)
    start = len(head)
    extents = [(0, head.data_ptr(), start)]
    for k in order:
        t = host[k]
        if t.numel():
            extents.append((start + header[k]["data_offsets"][0], t.data_ptr(), t.numel() * t.element_size()))
    _progress.run(
        lambda c: write_raw(os.fspath(filename), start + off, extents, durable=durable, engine=engine, counter=c),
        off, f"save {os.path.basename(filename)}", progress,
    )


def load_file(
    filename: str | os.PathLike[str],
    device: str | int | torch.device = "cpu",
    *,
    engine: str | None = None,
    progress: bool | None = None,
) -> dict[str, torch.Tensor]:
    """Load a safetensors file, like :func:`safetensors.torch.load_file`.

    The header is validated (offsets contiguous, sizes matching shapes and
    dtypes, within the file) before any tensor is read; each tensor is then
    read in parallel straight into its destination.

    Args:
        filename: the file to read.
        device: where to put the tensors. Default: ``"cpu"``.
        engine: one I/O engine for every tensor; default: chosen by size.
        progress: progress bar for long loads. Default: ``PYFASTENSOR_PROGRESS``.

    Returns:
        A dict of names to tensors, in the file's header order.

    Raises:
        CorruptFileError: the header is malformed or inconsistent, or the file is truncated.
    """
    path = os.fspath(filename)
    # One open file for the header and the data: a save replacing the file
    # meanwhile (a rename) cannot pair this header with another file's bytes.
    with open(path, "rb") as f:
        return _load_open(f, path, device, engine, progress)


def _load_open(f: BinaryIO, path: str, device: str | int | torch.device, engine: str | None,
               progress: bool | None) -> dict[str, torch.Tensor]:
    """:func:`load_file` of the file open as ``f``, opened from ``path``."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) < 8:
        raise CorruptFileError(f"{path} is not a safetensors file: {size} bytes")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER or 8 + n > size:
        raise CorruptFileError(f"{path}: header length {n} does not fit a file of {size} bytes")
    try:
        header = json.loads(f.read(n))
    except ValueError as e:
        raise CorruptFileError(f"{path}: header is not valid JSON: {e}") from None
    header.pop("__metadata__", None)
    start = 8 + n
    out: dict[str, torch.Tensor] = {}
    extents = []
    spans = []
    for k, info in header.items():
        try:
            dtype = DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            b, e = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptFileError(f"{path}: tensor {k!r}: bad header entry {info!r}") from None
        numel = math.prod(shape)
        if e - b != numel * dtype.itemsize or b < 0 or any(d < 0 for d in shape):
            raise CorruptFileError(f"{path}: tensor {k!r}: offsets {b}..{e} do not match shape {shape} {dtype}")
        t = empty_bytes(e - b).view(dtype).view(shape)
        spans.append((b, e, k))
        out[k] = t
        if t.numel():
            extents.append((start + b, t.data_ptr(), e - b))
    spans.sort()
    pos = 0
    for b, e, k in spans:
        if b != pos:
            raise CorruptFileError(f"{path}: tensor {k!r} starts at {b}, expected {pos} (holes or overlaps)")
        pos = e
    if start + pos != size:
        raise CorruptFileError(f"{path}: data region is {size - start} bytes, the header describes {pos}"
                               f"{' (truncated)' if start + pos > size else ''}")
    source = same_file(f.fileno(), path)
    _progress.run(lambda c: read_raw(source, extents, engine=engine, counter=c),
                  pos, f"load {os.path.basename(path)}", progress)
    dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if dev.type != "cpu":
        out = {k: v.to(dev) for k, v in out.items()}
    return out

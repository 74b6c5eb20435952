"""safetensors files through pyfastensor's engines: ``save_file`` / ``load_file``.

Signature-compatible with :mod:`safetensors.torch`, and the files are plain
safetensors files (the ``safetensors`` package reads them and validates
them). What differs is how bytes move: tensors are written and read in
parallel through the I/O engines, straight from and into tensor memory,
and saves are durable (temporary file, fsync, rename, directory fsync).

The format is the Go core's (checkpoint/safetensors.go): it lays the file
out, padding the JSON header with spaces so the data region starts on the
alignment of O_DIRECT and GDS (``pyfastensor._lib.settings()["alignment"]``),
and parses and validates headers. This module maps torch dtypes to the
format's dtype names, checks what only torch can tell (contiguity, shared
memory), and hands the Go core names, shapes and addresses.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ._buffers import empty_bytes
from .checkpoint import _from_device, _progress
from .checkpoint._native import RingRead, SafetensorsFile, STensor, read_raw, write_safetensors
from .errors import UnsupportedError

#: safetensors dtype names, those of the format the running torch has (``float8_e8m0fnu``,
#: MXFP8's scales, from torch 2.7; ``float4_e2m1fn_x2`` from 2.8). ``F6_E2M3`` and ``F6_E3M2``
#: have no torch dtype: a file with them is refused as unsupported.
DTYPES: dict[str, torch.dtype] = {
    name: dtype for name, dtype in {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
        "BOOL": torch.bool, "C64": torch.complex64,
        "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
        "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
        "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
        "F4": getattr(torch, "float4_e2m1fn_x2", None),
    }.items() if dtype is not None
}
_NAMES = {v: k for k, v in DTYPES.items()}
#: The dtype whose torch elements each hold two of the file's (``float4_e2m1fn_x2``, ``"F4"``):
#: the header's shape has the last dimension twice torch's, as the safetensors package writes it.
_PACKED = DTYPES.get("F4")
#: The format's dtypes a newer torch than the floor has.
_NEWER_TORCH = {"F8_E8M0": " (torch 2.7 and later have float8_e8m0fnu)",
                "F4": " (torch 2.8 and later have float4_e2m1fn_x2)"}


def _header_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape the header records for ``t`` (see :data:`_PACKED`)."""
    if t.dtype != _PACKED:
        return tuple(t.shape)
    return (*t.shape[:-1], 2 * t.shape[-1])


def _torch_layout(path: str, info: dict[str, Any]) -> tuple[torch.dtype, tuple[int, ...]]:
    """The torch dtype and shape of a header's tensor ``info`` of the file at ``path``."""
    dtype = DTYPES.get(info["dtype"])
    if dtype is None:
        hint = _NEWER_TORCH.get(info["dtype"], "")
        raise UnsupportedError(f"{path}: tensor {info['name']!r} has dtype {info['dtype']}, which torch "
                               f"{torch.__version__} has no dtype for{hint}")
    shape = tuple(info["shape"])
    if dtype == _PACKED:
        if not shape or shape[-1] % 2:
            raise UnsupportedError(
                f"{path}: tensor {info['name']!r} of dtype F4 has shape {list(shape)}: torch's float4_e2m1fn_x2 "
                "holds two F4 values per element, so the last dimension must be even")
        shape = (*shape[:-1], shape[-1] // 2)
    return dtype, shape


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
        if v.dtype == _PACKED and v.dim() == 0:
            raise ValueError(f"Key `{k}`: a 0-dim {v.dtype} tensor has no safetensors shape (F4 values "
                             "are counted along the last dimension); reshape it to (1,)")
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
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map str to str")
    path = os.fspath(filename)
    if any(_from_device.on_device(t.untyped_storage()) for t in tensors.values()):
        _save_from_cuda(tensors, path, metadata, durable, engine, progress)
        return
    # Host copies of other devices' tensors: alive, as the tensors are, until the native call returns.
    host = {k: t.detach().cpu() if t.device.type != "cpu" else t.detach() for k, t in tensors.items()}
    specs = [STensor(k, _NAMES[t.dtype], _header_shape(t), t.data_ptr() if t.numel() else 0,
                     t.numel() * t.element_size()) for k, t in host.items()]
    _progress.run(
        lambda c: write_safetensors(path, specs, metadata, durable=durable, engine=engine, counter=c),
        sum(s.nbytes for s in specs), f"save {os.path.basename(path)}", progress,
    )


def _save_from_cuda(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None, durable: bool,
                    engine: str | None, progress: bool | None) -> None:
    """:func:`save_file` of a dict with CUDA tensors: a staged save whose CUDA tensors go through
    the process's pinned ``"save"`` ring (as :func:`pyfastensor.save`'s do), their copies
    pipelined with the writes; the others are written first, from their memory."""
    from . import _device
    from .checkpoint._staged import StagedSafetensors

    b = _device.backend()
    cuda = [_from_device.on_device(t.untyped_storage()) for t in tensors.values()]
    host = {k: t.detach() if on or t.device.type == "cpu" else t.detach().cpu()
            for (k, t), on in zip(tensors.items(), cuda, strict=True)}
    specs = [STensor(k, _NAMES[t.dtype], _header_shape(t), 0 if on or not t.numel() else t.data_ptr(),
                     t.numel() * t.element_size()) for (k, t), on in zip(host.items(), cuda, strict=True)]
    bar = _progress.Manual(sum(s.nbytes for s in specs), f"save {os.path.basename(path)}", progress)
    try:
        staged = StagedSafetensors(path, specs, metadata, cuda, durable=durable, engine=engine)
        bar.add(sum(s.nbytes for s, on in zip(specs, cuda, strict=True) if not on))
        _from_device.drain_into(b, staged, ((i, t.reshape(-1).view(torch.uint8))
                                            for i, (t, on) in enumerate(zip(host.values(), cuda, strict=True))
                                            if on and t.numel()), bar.add)
    finally:
        bar.close()


def load_file(
    filename: str | os.PathLike[str],
    device: str | int | torch.device = "cpu",
    *,
    engine: str | None = None,
    progress: bool | None = None,
) -> dict[str, torch.Tensor]:
    """Load a safetensors file, like :func:`safetensors.torch.load_file`.

    The header is validated (offsets contiguous, sizes matching shapes and
    dtypes, within the file) before any tensor is read. To the CPU, each
    tensor is read in parallel straight into its memory. To a CUDA device,
    each tensor is allocated there and filled through the pinned ring of
    :func:`pyfastensor.load` (one native read of the file into pinned slots,
    each slot copied to the device while the next ones are read), never
    through pageable host memory; other devices get the CPU tensors moved
    with ``.to(device)``.

    Args:
        filename: the file to read.
        device: where to put the tensors (a CUDA device number is ``"cuda:N"``). Default: ``"cpu"``.
        engine: one I/O engine for every tensor; default: chosen by size.
        progress: progress bar for long loads. Default: ``PYFASTENSOR_PROGRESS``.

    Returns:
        A dict of names to tensors, in the file's header order.

    Raises:
        CorruptFileError: the header is malformed or inconsistent, or the file is truncated.
        UnsupportedError: a tensor's dtype is one pyfastensor does not know, or one the
            running torch has no dtype for (``F6_E2M3``, ``F6_E3M2``; ``F8_E8M0`` before
            torch 2.7, ``F4`` before 2.8), or an ``F4`` shape with an odd last dimension
            (torch's ``float4_e2m1fn_x2`` holds two); the message names the file, the tensor
            and the dtype.
    """
    path = os.fspath(filename)
    dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    # One open file for the header and the data: a save replacing the file
    # meanwhile (a rename) cannot pair this header with another file's bytes.
    with SafetensorsFile(path) as f:
        layouts = [_torch_layout(path, info) for info in f.tensors]  # refused before anything is read
        total = sum(info["end"] - info["begin"] for info in f.tensors)
        desc = f"load {os.path.basename(path)}"
        if dev.type == "cuda":
            return _load_to_cuda(f, layouts, dev, engine, _progress.Manual(total, desc, progress))
        out: dict[str, torch.Tensor] = {}
        extents = []
        for info, (dtype, shape) in zip(f.tensors, layouts, strict=True):
            n = info["end"] - info["begin"]
            t = empty_bytes(n).view(dtype).view(shape)
            out[info["name"]] = t
            if n:
                extents.append((info["begin"], t.data_ptr(), n))
        _progress.run(lambda c: read_raw(f.source, extents, engine=engine, counter=c), total, desc, progress)
    if dev.type != "cpu":
        out = {k: v.to(dev) for k, v in out.items()}
    return out


def _load_to_cuda(f: SafetensorsFile, layouts: list[tuple[torch.dtype, tuple[int, ...]]], dev: torch.device,
                  engine: str | None, bar: _progress.Manual) -> dict[str, torch.Tensor]:
    """The tensors of ``f`` on ``dev``, through the pinned ring (see :func:`load_file`)."""
    from . import _device, config
    from .checkpoint._ring import upload

    b = _device.backend()
    target = b.device(str(dev))  # torch's check of the device, and its index for a bare "cuda"
    out: dict[str, torch.Tensor] = {}
    records: list[tuple[int, int, torch.Tensor]] = []  # (file offset, the same, device memory)
    for info, (dtype, shape) in zip(f.tensors, layouts, strict=True):
        n = info["end"] - info["begin"]
        mem = b.empty(n, target)
        out[info["name"]] = mem.view(dtype).view(shape)
        records.append((info["begin"], info["begin"], mem))

    def start(slots: list[int], slot_bytes: int, fills: list[int], parts: list[tuple[int, ...]]) -> RingRead:
        raw = [(fill, at_file + off, n, at) for fill, at_file, off, n, at in parts]
        return RingRead.of_file(f.source, slots, slot_bytes, fills, raw, engine=engine)

    try:
        with _device.slab(b).hold() as buf:
            upload(_device.Ring(buf, config.PINNED_RING_SLOTS), b, records, start, bar.add)
    finally:
        bar.close()
    return out

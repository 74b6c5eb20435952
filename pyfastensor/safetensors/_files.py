"""safetensors files through the Go core's engines: :func:`save_file` and :func:`load_file`."""

from __future__ import annotations

import os
from typing import Any

import torch

from .._buffers import empty_bytes
from ..checkpoint import _from_device, _progress
from ..checkpoint._native import RingRead, SafetensorsFile, STensor, read_raw, write_safetensors
from ..errors import NotFoundError
from ._format import (
    NAMES,
    SafetensorsNotFoundError,
    as_safetensors_errors,
    check_backend,
    check_save,
    header_shape,
    torch_layout,
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

    The file is the safetensors package's, byte for byte, but for the
    header's padding where a tensor is 1 MiB or more: the data region then
    starts on 4 KiB, so that O_DIRECT and GPUDirect Storage read tensors in
    place. Tensors are written in parallel straight from their memory (CUDA
    ones through the pinned ring of :func:`pyfastensor.save`), and the save
    is durable: a temporary file, fsync, rename, directory fsync.

    Args:
        tensors: names to contiguous, dense tensors that do not share memory.
        filename: the file to write.
        metadata: text-only metadata for the header. Default: none.
        durable: fsync the file and its directory. Default: ``True``.
        engine: one I/O engine for every tensor; default: chosen by size.
        progress: progress bar for long saves. Default: ``PYFASTENSOR_PROGRESS``.

    Raises:
        ValueError: a tensor is sparse or not contiguous, a key is not a string, or ``tensors``
            is not a dict.
        RuntimeError: two tensors share memory (:func:`save_model` keeps one of them).

    Example::

        >>> import torch
        >>> from pyfastensor.safetensors import save_file, load_file
        >>> save_file({"w": torch.zeros(2, 2)}, "/tmp/w.safetensors")
        >>> load_file("/tmp/w.safetensors")["w"].shape
        torch.Size([2, 2])
    """
    check_save(tensors, metadata)
    path = os.fspath(filename)
    if any(_from_device.on_device(t.untyped_storage()) for t in tensors.values()):
        _save_from_cuda(tensors, path, metadata, durable, engine, progress)
        return
    # Host copies of other devices' tensors: alive, as the tensors are, until the native call returns.
    host = {k: t.detach().cpu() if t.device.type != "cpu" else t.detach() for k, t in tensors.items()}
    specs = stensors(host)
    _progress.run(
        lambda c: write_safetensors(path, specs, metadata, durable=durable, engine=engine, counter=c),
        sum(s.nbytes for s in specs), f"save {os.path.basename(path)}", progress,
    )


def stensors(host: dict[str, torch.Tensor]) -> list[STensor]:
    """What the Go core lays out for host tensors: name, dtype name, header shape, memory."""
    return [STensor(k, NAMES[t.dtype], header_shape(t), t.data_ptr() if t.numel() else 0,
                    t.numel() * t.element_size()) for k, t in host.items()]


def _save_from_cuda(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None, durable: bool,
                    engine: str | None, progress: bool | None) -> None:
    """:func:`save_file` of a dict with CUDA tensors: a staged save whose CUDA tensors go through
    the process's pinned ``"save"`` ring (as :func:`pyfastensor.save`'s do), their copies
    pipelined with the writes; the others are written first, from their memory."""
    from .. import _device
    from ..checkpoint._staged import StagedSafetensors

    b = _device.backend()
    cuda = [_from_device.on_device(t.untyped_storage()) for t in tensors.values()]
    host = {k: t.detach() if on or t.device.type == "cpu" else t.detach().cpu()
            for (k, t), on in zip(tensors.items(), cuda, strict=True)}
    specs = [STensor(k, NAMES[t.dtype], header_shape(t), 0 if on or not t.numel() else t.data_ptr(),
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


def open_file(filename: str | os.PathLike[str]) -> SafetensorsFile:
    """The safetensors file at ``filename``, its header validated, held open.

    Raises:
        FileNotFoundError: no such file (the safetensors package's text).
        CorruptSafetensorsError: the header is malformed or inconsistent, or the file truncated.
    """
    path = os.fspath(filename)
    try:
        with as_safetensors_errors():
            return SafetensorsFile(path)
    except NotFoundError:
        raise SafetensorsNotFoundError(f"No such file or directory: {path}") from None


def device_of(device: str | int | torch.device) -> torch.device:
    """The torch device a safetensors ``device=`` names (an int is a CUDA device's index)."""
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


def load_file(
    filename: str | os.PathLike[str],
    device: str | int | torch.device = "cpu",
    *,
    backend: str = "mmap",
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
        backend: the safetensors package's way of serving bytes (``"mmap"`` or ``"pread"``),
            accepted for its callers; the Go core reads the file either way, into memory of the
            tensors' own (never a mapping of the file). Default: ``"mmap"``.
        engine: one I/O engine for every tensor; default: chosen by size.
        progress: progress bar for long loads. Default: ``PYFASTENSOR_PROGRESS``.

    Returns:
        A dict of names to tensors, in the file's header order.

    Raises:
        CorruptSafetensorsError: the header is malformed or inconsistent, or the file is
            truncated (a :class:`~pyfastensor.CorruptFileError`, and the safetensors package's
            ``SafetensorError`` where it is installed).
        UnsupportedSafetensorsError: a tensor's dtype is one pyfastensor does not know, or one
            the running torch has no dtype for (``F6_E2M3``, ``F6_E3M2``; ``F8_E8M0`` before
            torch 2.7, ``F4`` before 2.8), or an ``F4`` shape with an odd last dimension
            (torch's ``float4_e2m1fn_x2`` holds two); the message names the file, the tensor
            and the dtype.
        FileNotFoundError: there is no such file.

    Example::

        >>> from pyfastensor.safetensors import load_file
        >>> load_file("/tmp/w.safetensors", device="cpu")["w"].dtype
        torch.float32
    """
    check_backend(backend)
    dev = device_of(device)
    # One open file for the header and the data: a save replacing the file
    # meanwhile (a rename) cannot pair this header with another file's bytes.
    with open_file(filename) as f:
        return read_tensors(f, f.tensors, dev, engine, progress)


def read_tensors(f: SafetensorsFile, infos: list[dict[str, Any]], dev: torch.device, engine: str | None,
                 progress: bool | None) -> dict[str, torch.Tensor]:
    """The tensors ``infos`` (entries of ``f.tensors``, or parts of them: ``begin``/``end`` and
    ``shape`` narrowed to rows) of the open file ``f``, on ``dev``."""
    layouts = [torch_layout(f.path, info) for info in infos]  # refused before anything is read
    total = sum(info["end"] - info["begin"] for info in infos)
    desc = f"load {os.path.basename(f.path)}"
    if dev.type == "cuda":
        return _load_to_cuda(f, infos, layouts, dev, engine, _progress.Manual(total, desc, progress))
    out: dict[str, torch.Tensor] = {}
    extents = []
    for info, (dtype, shape) in zip(infos, layouts, strict=True):
        n = info["end"] - info["begin"]
        t = empty_bytes(n).view(dtype).view(shape)
        out[info["name"]] = t
        if n:
            extents.append((info["begin"], t.data_ptr(), n))
    with as_safetensors_errors():
        _progress.run(lambda c: read_raw(f.source, extents, engine=engine, counter=c), total, desc, progress)
    if dev.type != "cpu":
        out = {k: v.to(dev) for k, v in out.items()}
    return out


def _load_to_cuda(f: SafetensorsFile, infos: list[dict[str, Any]], layouts: list[tuple[torch.dtype, tuple[int, ...]]],
                  dev: torch.device, engine: str | None, bar: _progress.Manual) -> dict[str, torch.Tensor]:
    """The tensors ``infos`` of ``f`` on ``dev``, through the pinned ring (see :func:`load_file`)."""
    from .. import _device, config
    from ..checkpoint._ring import upload

    b = _device.backend()
    target = b.device(str(dev))  # torch's check of the device, and its index for a bare "cuda"
    out: dict[str, torch.Tensor] = {}
    records: list[tuple[int, int, torch.Tensor]] = []  # (file offset, the same, device memory)
    for info, (dtype, shape) in zip(infos, layouts, strict=True):
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

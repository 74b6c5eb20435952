"""safetensors in memory: :func:`save` to bytes, :func:`load` from bytes."""

from __future__ import annotations

import ctypes

import torch

from ..checkpoint._native import layout_safetensors, parse_safetensors
from ._files import stensors
from ._format import as_safetensors_errors, check_save, torch_layout


def save(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file of ``tensors``, like :func:`safetensors.torch.save`.

    The bytes are the safetensors package's for the same tensors and
    metadata (its order, spelling and 8-byte padding), laid out by the Go
    core.

    Args:
        tensors: names to contiguous, dense tensors that do not share memory.
        metadata: text-only metadata for the header. Default: none.

    Returns:
        The file's bytes.

    Raises:
        ValueError, RuntimeError: as :func:`save_file`.

    Example::

        >>> import torch
        >>> from pyfastensor.safetensors import save, load
        >>> load(save({"w": torch.ones(2)}))["w"]
        tensor([1., 1.])
    """
    check_save(tensors, metadata)
    host = {k: t.detach().cpu() for k, t in tensors.items()}  # alive until the copies below are done
    specs = stensors(host)
    header, offsets, size = layout_safetensors(specs, metadata)
    out = bytearray(size)
    out[:len(header)] = header
    base = ctypes.addressof(ctypes.c_char.from_buffer(out)) if size else 0
    for spec, off in zip(specs, offsets, strict=True):
        if spec.nbytes:
            ctypes.memmove(base + off, spec.addr, spec.nbytes)
    return bytes(out)


def load(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes, like :func:`safetensors.torch.load`.

    The header is validated as a file's is (:func:`load_file`); each tensor
    is a copy on the CPU, owning its memory.

    Args:
        data: the bytes of a safetensors file (``bytes``, ``bytearray`` or any buffer).

    Returns:
        A dict of names to CPU tensors, in the header's order.

    Raises:
        CorruptSafetensorsError: the bytes are not a valid safetensors file.

    Example::

        >>> from pyfastensor.safetensors import load
        >>> load(open("/tmp/w.safetensors", "rb").read())["w"].shape
        torch.Size([2, 2])
    """
    keep, base, n = _address(data)  # keep: what owns the memory at base, alive to the end
    name = "<safetensors bytes>"
    with as_safetensors_errors():
        header = parse_safetensors(name, base, n)
    out: dict[str, torch.Tensor] = {}
    for info in header["tensors"]:
        dtype, shape = torch_layout(name, info)
        nbytes = info["end"] - info["begin"]
        t = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            ctypes.memmove(t.data_ptr(), base + info["begin"], nbytes)
        out[info["name"]] = t.view(dtype).view(shape)
    return out


def _address(data: bytes | bytearray | memoryview) -> tuple[object, int, int]:
    """An object owning ``data``'s bytes, their address and their length: ``bytes`` in place,
    a writable buffer in place, any other buffer copied to ``bytes``."""
    if not isinstance(data, bytes):
        view = memoryview(data).cast("B")
        if not view.readonly and view.nbytes:
            return view, ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes
        data = bytes(view)
    return data, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0, len(data)

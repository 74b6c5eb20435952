"""What the safetensors format means to torch: dtype names, shapes, what a save may hold, errors.

The layout itself (header, order, padding) is the Go core's
(checkpoint/safetensors.go); this module maps torch dtypes to the format's
names and checks what only torch can tell (layout, contiguity, shared
memory).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from ..errors import CorruptFileError, FastensorError, NotFoundError, UnsupportedError

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
NAMES = {v: k for k, v in DTYPES.items()}
#: The dtype whose torch elements each hold two of the file's (``float4_e2m1fn_x2``, ``"F4"``):
#: the header's shape has the last dimension twice torch's, as the safetensors package writes it.
_PACKED = DTYPES.get("F4")
#: The format's dtypes a newer torch than the floor has.
_NEWER_TORCH = {"F8_E8M0": " (torch 2.7 and later have float8_e8m0fnu)",
                "F4": " (torch 2.8 and later have float4_e2m1fn_x2)"}
#: What ``framework=`` names torch, as the safetensors package reads it.
TORCH_FRAMEWORKS = frozenset({"pt", "torch", "pytorch"})
#: The ``backend=`` values of the safetensors package (0.8): how it serves a tensor's bytes. Ours
#: reads them through the Go core's engines whichever is named; both give the same tensors.
BACKENDS = frozenset({"mmap", "pread"})


@functools.cache
def package() -> ModuleType | None:
    """The safetensors package with its ``torch`` module loaded, or None where it is not
    installed. Its functions are read from it where needed, through :func:`peer`, never through
    names a program may have rebound (:func:`pyfastensor.route`)."""
    try:
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError:
        return None
    return safetensors


@functools.cache
def peer() -> dict[str, Any]:
    """The safetensors package's own ``safe_open`` and ``SafetensorError``, from its native
    module (which nothing rebinds): ``{}`` where it is not installed."""
    if package() is None:
        return {}
    from safetensors import _safetensors_rust as rust

    return {"safe_open": rust.safe_open, "SafetensorError": rust.SafetensorError}


def _peer_error() -> tuple[type[Exception], ...]:
    error = peer().get("SafetensorError")
    return (error,) if error is not None else ()


class SafetensorError(FastensorError, *_peer_error()):  # type: ignore[misc]
    """An error the safetensors package raises as its ``SafetensorError`` (a closed
    :class:`safe_open`, a slice out of range, an unknown ``backend``): a subclass of that class
    too where safetensors is installed, so ``except safetensors.SafetensorError`` catches it."""


class CorruptSafetensorsError(CorruptFileError, SafetensorError):
    """A safetensors file or buffer that fails the format's checks: a
    :class:`~pyfastensor.CorruptFileError` and a :class:`SafetensorError`."""


class UnsupportedSafetensorsError(UnsupportedError, SafetensorError):
    """A safetensors file with a dtype this torch or pyfastensor has none for: an
    :class:`~pyfastensor.UnsupportedError` and a :class:`SafetensorError`."""


@contextlib.contextmanager
def as_safetensors_errors() -> Iterator[None]:
    """Raise the Go core's :class:`~pyfastensor.CorruptFileError` and
    :class:`~pyfastensor.UnsupportedError` as their safetensors kinds, message unchanged."""
    try:
        yield
    except (CorruptSafetensorsError, UnsupportedSafetensorsError):
        raise
    except CorruptFileError as e:
        raise CorruptSafetensorsError(str(e)) from None
    except UnsupportedError as e:
        raise UnsupportedSafetensorsError(str(e)) from None


class SafetensorsNotFoundError(NotFoundError):
    """A safetensors file that does not exist: a ``FileNotFoundError`` (``errno.ENOENT``) whose
    text is the safetensors package's, ``No such file or directory: <path>``."""

    def __str__(self) -> str:
        return self.strerror


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SafetensorError(f"backend {backend!r} is not one of {sorted(BACKENDS)}")


def header_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape the header records for ``t`` (see :data:`_PACKED`)."""
    if t.dtype != _PACKED:
        return tuple(t.shape)
    return (*t.shape[:-1], 2 * t.shape[-1])


def torch_layout(path: str, info: dict[str, Any]) -> tuple[torch.dtype, tuple[int, ...]]:
    """The torch dtype and shape of a header's tensor ``info`` of the file at ``path``."""
    dtype = DTYPES.get(info["dtype"])
    if dtype is None:
        hint = _NEWER_TORCH.get(info["dtype"], "")
        raise UnsupportedSafetensorsError(
            f"{path}: tensor {info['name']!r} has dtype {info['dtype']}, which torch "
            f"{torch.__version__} has no dtype for{hint}")
    shape = tuple(info["shape"])
    if dtype == _PACKED:
        if not shape or shape[-1] % 2:
            raise UnsupportedSafetensorsError(
                f"{path}: tensor {info['name']!r} of dtype F4 has shape {list(shape)}: torch's float4_e2m1fn_x2 "
                "holds two F4 values per element, so the last dimension must be even")
        shape = (*shape[:-1], shape[-1] // 2)
    return dtype, shape


def check_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
    """Refuse, before anything is written, what the safetensors package refuses to save: a
    tensor that is not dense, not contiguous or shares memory with another; a key that is not a
    string; metadata that is not strings. Messages as the package's where it has one."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    spans: dict[tuple[Any, int], list[tuple[int, int, str]]] = {}
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise ValueError(f"Key {k!r} is invalid: keys must be str")
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
            continue
        if not v.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{k}`; call .contiguous() first")
        if v.dtype not in NAMES:
            raise ValueError(f"Key `{k}`: dtype {v.dtype} has no safetensors name")
        if v.dtype == _PACKED and v.dim() == 0:
            raise ValueError(f"Key `{k}`: a 0-dim {v.dtype} tensor has no safetensors shape (F4 values "
                             "are counted along the last dimension); reshape it to (1,)")
        if v.numel() and v.device.type != "meta":
            start = v.data_ptr()
            spans.setdefault((v.device, v.untyped_storage().data_ptr()), []).append(
                (start, start + v.numel() * v.element_size(), k))
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. You can "
            "make it a dense tensor before saving with `.to_dense()` but be aware this might make a much larger "
            "file than needed.")
    for group in spans.values():
        group.sort()
        for (_, end, a), (start, _, b) in zip(group, group[1:], strict=False):
            if start < end:
                raise RuntimeError(
                    f"Some tensors share memory ({a!r} and {b!r}): this would duplicate memory on disk. "
                    "Save clones, or use save_model (which keeps one of each), or pyfastensor.save, which "
                    "keeps sharing.")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("metadata must map str to str")

"""Lazy access to a safetensors file: :class:`safe_open` and its slices."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import torch

from ..checkpoint._native import SafetensorsFile
from ._files import device_of, open_file, read_tensors
from ._format import TORCH_FRAMEWORKS, SafetensorError, check_backend, peer, torch_layout

Index = int | slice | tuple[Any, ...] | list[Any] | type(Ellipsis)  # type: ignore[valid-type]


class safe_open:  # noqa: N801 - the safetensors package's name, which callers import
    """A safetensors file opened for reading tensors one at a time, like :class:`safetensors.safe_open`.

    The header is read and validated when the file is opened, and the file
    is held open until :meth:`close` (or the end of a ``with`` block): every
    tensor comes from the file that was opened, even after a save has
    replaced it. Each :meth:`get_tensor` reads that tensor's bytes alone,
    through the Go core's engines, into memory of its own; a slice
    (:meth:`get_slice`) reads the rows it spans.

    ``framework`` other than torch's (``"np"``, ``"tf"``, ``"flax"``,
    ``"mlx"``, ``"paddle"``) opens the file with the safetensors package's
    own ``safe_open``, where it is installed.

    Args:
        filename: the file to open.
        framework: ``"pt"`` (or ``"torch"``, ``"pytorch"``) for torch tensors.
        device: where tensors go (``"cpu"``, ``"cuda:0"``, or a CUDA device's index). Default: ``"cpu"``.
        backend: the safetensors package's way of serving bytes, ``"mmap"`` or ``"pread"``;
            accepted for its callers, the Go core reads the file either way. Default: ``"mmap"``.

    Raises:
        FileNotFoundError: there is no such file.
        CorruptSafetensorsError: its header is malformed or inconsistent, or it is truncated.
        SafetensorError: ``backend`` is neither ``"mmap"`` nor ``"pread"``.

    Example::

        >>> from pyfastensor.safetensors import safe_open
        >>> with safe_open("/tmp/w.safetensors", framework="pt") as f:
        ...     rows = f.get_slice("w")[:1]         # reads the first row only
        ...     print(f.keys(), f.metadata(), rows.shape)
        ['w'] None torch.Size([1, 2])
    """

    def __new__(cls, filename: str | os.PathLike[str], framework: str, device: str | int | torch.device = "cpu",
                *, backend: str = "mmap") -> Any:
        if framework not in TORCH_FRAMEWORKS:
            theirs = peer().get("safe_open")
            if theirs is None:
                raise SafetensorError(f"framework {framework!r} needs the safetensors package (pip install "
                                      "safetensors); pyfastensor reads safetensors files for torch ('pt')")
            return theirs(filename, framework=framework, device=device, backend=backend)
        return super().__new__(cls)

    def __init__(self, filename: str | os.PathLike[str], framework: str, device: str | int | torch.device = "cpu",
                 *, backend: str = "mmap") -> None:
        check_backend(backend)
        self._device = device_of(device)
        self._file: SafetensorsFile | None = open_file(filename)
        self._index = {info["name"]: i for i, info in enumerate(self._file.tensors)}

    # ------------------------------------------------------------------ context

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; every method but this one then raises :class:`SafetensorError`."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> SafetensorsFile:
        if self._file is None:
            raise SafetensorError("File is closed")
        return self._file

    # ------------------------------------------------------------------ header

    def keys(self) -> list[str]:
        """The tensors' names, sorted."""
        return sorted(self._index) if self._open() else []

    def offset_keys(self) -> list[str]:
        """The tensors' names, in the order of their data in the file."""
        f = self._open()
        return [info["name"] for info in sorted(f.tensors, key=lambda info: info["begin"])]

    def metadata(self) -> dict[str, str] | None:
        """The header's ``__metadata__``, or None where it has none."""
        return self._open().metadata

    # ------------------------------------------------------------------ tensors

    def _position(self, name: str) -> int:
        f = self._open()
        i = self._index.get(name)
        if i is None:
            raise SafetensorError(f"File {f.path!r} does not contain tensor {name}")
        return i

    def get_tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name``, read from the file onto the device.

        Raises:
            SafetensorError: the file has no tensor ``name``, or it is closed.
        """
        f = self._open()
        return read_tensors(f, [f.tensors[self._position(name)]], self._device, None, False)[name]

    def get_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the file, read in one parallel pass, by name in offset order."""
        f = self._open()
        return read_tensors(f, sorted(f.tensors, key=lambda info: info["begin"]), self._device, None, None)

    def get_slice(self, name: str) -> TensorSlice:
        """A view of tensor ``name`` that reads only what it is indexed with.

        Raises:
            SafetensorError: the file has no tensor ``name``, or it is closed.
        """
        return TensorSlice(self, self._position(name))


class TensorSlice:
    """Tensor ``index`` of an open :class:`safe_open`, read when indexed: ``s[2:5]``, ``s[:, :8]``.

    Indexing takes integers (negative from the end), slices (with steps) and
    an empty list, one per leading dimension, as the safetensors package
    does; it reads the rows of the first dimension the index spans, then
    applies the rest in memory. An integer or a slice's bound outside its
    dimension is refused, as the package refuses it (a slice is not clipped).
    """

    def __init__(self, opened: safe_open, index: int) -> None:
        self._opened = opened
        f = opened._open()
        self._info = f.tensors[index]
        self._dtype, self._shape = torch_layout(f.path, self._info)

    def get_shape(self) -> list[int]:
        """The tensor's shape (as the header records it)."""
        return list(self._info["shape"])

    def get_dtype(self) -> str:
        """The tensor's dtype name in the format (``"F32"``, ``"BF16"``...)."""
        return str(self._info["dtype"])

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __getitem__(self, index: Index) -> torch.Tensor:
        items = _normalise(index, self._shape)
        device = self._opened._device
        if items and isinstance(items[0], list):  # an empty list: no row
            return torch.empty((0, *self._shape[1:]), dtype=self._dtype, device=device)
        if not self._shape:
            lo, hi, first = 0, 0, None
        elif not items or isinstance(items[0], slice):
            start, stop, step = (items[0] if items else slice(None)).indices(self._shape[0])
            span = range(start, stop, step)
            lo, hi = (min(span), max(span) + 1) if span else (0, 0)
            first = slice(start - lo, None if stop - lo < 0 else stop - lo, step)
        else:
            lo, hi, first = items[0], items[0] + 1, 0
        out = self._rows(lo, hi)
        if first is not None:
            out = out[(first, *items[1:])]
        out = out.contiguous()
        # A part of the rows read (a column, an element): its own memory, not theirs.
        return out.clone() if out.untyped_storage().nbytes() > out.numel() * out.element_size() else out

    def _rows(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``lo:hi`` of the first dimension (the whole of a 0-d tensor): one read of the
        bytes they span."""
        info = self._info
        f = self._opened._open()
        if not self._shape:
            return read_tensors(f, [info], self._opened._device, None, False)[info["name"]]
        row = (info["end"] - info["begin"]) // self._shape[0] if self._shape[0] else 0
        first = (hi - lo) * info["shape"][0] // self._shape[0]  # the header's count (F4: twice torch's)
        part = dict(info, begin=info["begin"] + lo * row, end=info["begin"] + hi * row,
                    shape=[first, *info["shape"][1:]])
        return read_tensors(f, [part], self._opened._device, None, False)[info["name"]]


def _normalise(index: Index, shape: tuple[int, ...]) -> list[Any]:
    """``index`` as one item per leading dimension, each checked against its dimension.

    Raises:
        SafetensorError: an integer outside its dimension, a slice bound beyond it, a non-empty
            list, or more items than dimensions (the safetensors package's messages).
    """
    items = list(index) if isinstance(index, tuple) else [index]
    if len(items) > len(shape):
        raise SafetensorError(f"Error during slicing {_show(items)} with shape {list(shape)}: too many indices "
                              f"for a tensor of {len(shape)} dimensions")
    out: list[Any] = []
    for dim, item in enumerate(items):
        size = shape[dim]
        if isinstance(item, bool) or item is Ellipsis:
            raise SafetensorError(f"Error during slicing {_show(items)}: {item!r} is not an index")
        if isinstance(item, int):
            if not -size <= item < size:
                raise SafetensorError(f"Invalid index {item} for dimension {dim} of size {size}")
            out.append(item % size)
        elif isinstance(item, slice):
            for bound in (item.start, item.stop):
                if bound is not None and bound > size:
                    raise SafetensorError(
                        f"Error during slicing {_show(items)} with shape {list(shape)}: index {bound - 1} out of "
                        f"bounds for tensor dimension #{dim} of size {size}")
            out.append(item)
        elif isinstance(item, list):
            if item:
                raise SafetensorError("Non empty lists are not implemented")
            out.append(item)
        else:
            raise SafetensorError(f"Error during slicing {_show(items)}: {type(item).__name__} is not an index")
    return out


def _show(items: list[Any]) -> str:
    def one(x: Any) -> str:
        if isinstance(x, slice):
            text = f"{'' if x.start is None else x.start}:{'' if x.stop is None else x.stop}"
            return text + (f":{x.step}" if x.step is not None else "")
        return repr(x)
    return "[" + ", ".join(one(x) for x in items) + "]"

"""Raw byte transfers through one named I/O engine.

The engines are the Go core's ways of moving bytes between memory and a
file: ``posix`` (page cache), ``direct`` (O_DIRECT), ``uring`` (io_uring),
``mmap`` (read only) and ``cufile`` (GPUDirect Storage). Checkpoints and
offload choose engines for you; this module is for benchmarks and for code
that moves raw bytes.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Any

from . import _lib, config
from ._buffers import address_of

ENGINES = ("posix", "direct", "uring", "mmap", "cufile")

_cufile_warned = threading.Lock()


def cufile_fallback(reason: str) -> None:
    """Warn, once per process, that cuFile is installed but did not work and the CPU
    engines served instead (staging device memory through pinned host memory).

    The one place that decides the warning: the CUDA load and the spill store call it
    with the reason the Go core recorded (:func:`pyfastensor.info` reports the same
    reason for the filesystem). Nothing fails: the operation went through the CPU path.

    Args:
        reason: why cuFile was not used, as the Go core says it.
    """
    if _cufile_warned.acquire(blocking=False):  # held for good: the first caller warns
        warnings.warn(f"pyfastensor: cuFile does not work here, the CPU engines serve instead: {reason}",
                      RuntimeWarning, stacklevel=3)


def cufile_driver_works(directory: str | os.PathLike[str]) -> bool:
    """Whether libcufile loaded and its driver opened (the library level of
    ``info(directory)["dir"]``), so a cuFile failure there is worth a warning; where
    libcufile or the NVIDIA driver is simply missing, the CPU path is the normal one."""
    d = _lib.call_json("pft_info", _lib.cstr(directory), None)
    return bool(d.get("dir", {}).get("cufile_driver"))

_MODES = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "x": os.O_RDWR | os.O_CREAT | os.O_EXCL,
}


class EngineFile(_lib.Handle):
    """A file opened through one I/O engine.

    Transfers release the GIL and may be issued from several threads at once
    on disjoint ranges. ``sync``, ``truncate`` and ``close`` must not overlap
    transfers. Through ``direct`` and ``uring``, an unaligned write reads and
    rewrites its edge 4 KiB blocks, serialised within this object only:
    unaligned writes whose ranges share a block go through one ``EngineFile``.

    Args:
        path: the file.
        mode: ``"r"`` (read), ``"r+"`` (read and write), ``"w"`` (create or
            truncate), ``"x"`` (create, fail if it exists). Default ``"r"``.
        engine: one of :data:`ENGINES`. Default ``"posix"``.
        threads: goroutines per transfer (default ``PYFASTENSOR_THREADS`` or
            the number of CPUs).
        task_size: bytes per parallel piece (default ``PYFASTENSOR_TASK_SIZE``
            or 8 MiB).
        queue_depth: io_uring requests in flight (default 32).

    Example::

        >>> import numpy as np, pyfastensor.engines as pe
        >>> with pe.EngineFile("/tmp/x.bin", "w", engine="direct") as f:
        ...     f.write(np.arange(1000, dtype=np.float32))
        4000
    """

    _close_fn = "pft_file_close"

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: str = "r",
        *,
        engine: str = "posix",
        threads: int | None = None,
        task_size: int | None = None,
        queue_depth: int | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(_MODES)}")
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
        super().__init__()
        self.path = os.fspath(path)
        out = _lib.u64()
        _lib.call(
            "pft_file_open", _lib.cstr(self.path), _MODES[mode], 0o644,
            # no cufile_library: the Go core's one resolution (info()["dir"]["cufile_library"])
            _lib.options(engine, threads=threads, task_size=task_size,
                         queue_depth=config.queue_depth() if queue_depth is None else queue_depth),
            ctypes.byref(out),
        )
        self._handle = out.value
        desc = _lib.call_json("pft_file_describe", self._handle)
        #: The engine actually serving transfers (differs after a fallback).
        self.engine: str = desc["engine"]
        #: Why the file is served by another engine than asked, or "".
        self.fallback: str = desc["fallback"]

    def read_into(self, buf: Any, offset: int = 0) -> int:
        """Fill ``buf`` (tensor, array or writable buffer) from ``offset``; return bytes read.

        Raises:
            EndOfFileError: when the file ends before ``buf`` is full.
        """
        addr, n, keep = address_of(buf, writable=True)
        done = _lib.size_t()
        _lib.call("pft_file_read", self._live(), addr, n, offset, ctypes.byref(done))
        del keep  # held until the native call above returned
        return done.value

    def write(self, buf: Any, offset: int = 0) -> int:
        """Write all of ``buf`` at ``offset``; return bytes written.

        Raises:
            NoSpaceError: when the filesystem is full (the message says how
                much was written).
        """
        addr, n, keep = address_of(buf, writable=False)
        done = _lib.size_t()
        _lib.call("pft_file_write", self._live(), addr, n, offset, ctypes.byref(done))
        del keep
        return done.value

    def sync(self) -> None:
        """Flush written data to stable storage (fsync)."""
        _lib.call("pft_file_sync", self._live())

    def size(self) -> int:
        """Return the file's length in bytes."""
        out = _lib.i64()
        _lib.call("pft_file_size", self._live(), ctypes.byref(out))
        return out.value

    def truncate(self, size: int) -> None:
        """Set the file's length."""
        _lib.call("pft_file_truncate", self._live(), size)

    def _closed_message(self) -> str:
        return f"I/O operation on closed file {self.path!r}"

    def __enter__(self) -> EngineFile:
        return self

    def __repr__(self) -> str:
        state = "closed" if not self._handle else self.engine
        return f"EngineFile({self.path!r}, engine={state!r})"

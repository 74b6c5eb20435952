"""What pyfastensor can do on this machine, and why not where it cannot."""

from __future__ import annotations

import os
from typing import Any

from . import _lib, config
from ._version import __version__


def info(path: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """Describe the library, the machine and the filesystem holding ``path``.

    Args:
        path: a directory (or file) whose filesystem to examine. Default ``"."``.

    Returns:
        A dict with ``version``, ``go_version``, ``cpu`` (brand and the features
        that matter), ``engines`` (each engine's availability and, when not
        available, the reason in words; ``cufile`` is available only where it
        works on ``path``'s filesystem), ``dir`` (the directory's probe, the one
        every engine choice uses: filesystem type, whether O_DIRECT works and
        with what alignment, io_uring, cuFile, the fallback with its reason),
        ``settings`` (the data path's thresholds) and ``python`` (versions,
        library path, the libcufile candidates found).

        cuFile in ``dir``, in two levels:

        - ``cufile_driver`` (bool) and ``cufile_driver_reason``: the library
          level, once per process: libcufile (``cufile_library``, found by
          ``cufile_library_source``) loads and ``cuFileDriverOpen`` returns
          success (guarded: first in a child process, killed after 10 s).
        - ``cufile`` (bool) and ``cufile_reason``: whether cuFile moves bytes on
          this filesystem, once per filesystem (by ``st_dev``) and process: a
          temporary file in ``path`` is registered with cuFile, 64 KiB are
          written to it from device memory and read back through cuFile, and
          the bytes compared. ``cufile_verdict`` says how it was decided:
          ``"library"`` (the library level failed; nothing tried here),
          ``"probe"``, or ``"failure"`` (a file's registration or transfer
          failed since, e.g. ``CU_FILE_HANDLE_NOT_REGISTERED (5027)`` where
          GPUDirect Storage is not installed; the engine choices stopped using
          cuFile there and the CPU engines served instead).

    Example::

        >>> import pyfastensor
        >>> pyfastensor.info("/tmp")["engines"]["direct"]["available"]
        True
    """
    d = os.fspath(path)
    if os.path.isfile(d):
        d = os.path.dirname(os.path.abspath(d))
    result: dict[str, Any] = _lib.call_json("pft_info", _lib.cstr(d), None)
    result["python"] = {
        "package_version": __version__,
        "library": str(_lib.library_path()),
        "cufile_candidates": config.cufile_candidates(),
        "torch": _torch_version(),
    }
    return result


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def available_memory() -> int:
    """``MemAvailable`` from /proc/meminfo, in bytes: memory the kernel can give without
    swapping (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

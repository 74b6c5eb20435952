"""Loading of the native library and the shape of every call into it.

The Go core is a shared library inside this package (``_native*.so``), loaded
with ctypes on first use, not at import: importing pyfastensor costs nothing
and starts no Go runtime. ctypes releases the GIL for the duration of every
call, so native I/O runs in parallel with Python threads.

Every native function returns a status code and writes its message into a
caller-provided buffer; :func:`check` turns a non-zero status into the
matching exception from :mod:`pyfastensor.errors`.

Fork: a child forked after the library was loaded cannot use the parent's Go
runtime (its first call would hang), so :func:`lib` raises
:class:`~pyfastensor.errors.ForkedProcessError` there instead. A child that
never calls in (a DataLoader worker) is unaffected.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import json
import os
import threading
from pathlib import Path
from typing import Any

from . import errors

_ERRLEN = 4096

# Status codes: keep in step with gofastensor/abi.go.
_STATUS: dict[int, type[Exception]] = {
    1: errors.FastensorError,
    2: errors.InvalidArgumentError,
    3: errors.EndOfFileError,
    4: errors.NoSpaceError,
    5: errors.EngineUnavailableError,
    6: errors.NotFoundError,
    7: errors.PermissionDeniedError,
    8: errors.InvalidArgumentError,  # bad handle
    9: errors.InternalError,
    10: errors.InternalError,  # poisoned by an earlier panic
    11: errors.UnsupportedError,
    12: errors.CorruptFileError,
    13: errors.InternalError,  # a bug caught without a panic at the boundary
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_loaded_pid: int | None = None
_forked = False

u64 = ctypes.c_uint64
i64 = ctypes.c_int64
size_t = ctypes.c_size_t
c_int = ctypes.c_int
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
errbuf_t = ctypes.c_char_p


def _after_fork_in_child() -> None:
    global _forked
    if _lib is not None:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def library_path() -> Path:
    """Return the path of the native library (``PYFASTENSOR_LIB`` overrides it)."""
    override = os.environ.get("PYFASTENSOR_LIB")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    # setup.py names it _native.so (it uses no CPython ABI); builds before that
    # carried the interpreter's suffix (_native.cpython-311-x86_64-linux-gnu.so).
    for suffix in (".so", *importlib.machinery.EXTENSION_SUFFIXES):
        candidate = here / f"_native{suffix}"
        if candidate.exists():
            return candidate
    raise ImportError(
        f"pyfastensor's native library (_native*.so) is missing from {here}: the package was "
        "not built. Install it with `pip install .` (or `pip install -e .`) from the source "
        "tree, with Go on PATH, or install a prebuilt wheel (README: 'Installing without Go')."
    )


# Prototypes: name -> argtypes. Every function returns the int status and
# takes (char *errbuf, size_t errlen) last, except where noted.
_PROTOTYPES: dict[str, list[Any]] = {
    "pft_info": [c_char_p, c_char_p, ctypes.POINTER(c_void_p)],
    "pft_file_open": [c_char_p, c_char_p, c_int, c_int, c_int, i64, c_int, c_char_p,
                      ctypes.POINTER(u64)],
    "pft_file_read": [u64, c_void_p, size_t, i64, ctypes.POINTER(size_t)],
    "pft_file_write": [u64, c_void_p, size_t, i64, ctypes.POINTER(size_t)],
    "pft_file_sync": [u64],
    "pft_file_size": [u64, ctypes.POINTER(i64)],
    "pft_file_truncate": [u64, i64],
    "pft_file_describe": [u64, ctypes.POINTER(c_void_p)],
    "pft_file_close": [u64],
    "pft_debug_panic": [],  # test-only (gofastensor/debug.go)
    "pft_debug_inject": [c_char_p],  # test-only: tests/conftest.py's inject fixture
    "pft_configure": [c_char_p],
    "pft_settings": [c_char_p, ctypes.POINTER(c_void_p)],
    "pft_crc_speed": [i64, c_int, ctypes.POINTER(ctypes.c_double)],
}


def register(prototypes: dict[str, list[Any]]) -> None:
    """Declare more native functions (each area's module declares its own)."""
    _PROTOTYPES.update(prototypes)
    if _lib is not None:
        _declare(_lib, prototypes)


def _declare(cdll: ctypes.CDLL, prototypes: dict[str, list[Any]]) -> None:
    for name, argtypes in prototypes.items():
        fn = getattr(cdll, name)
        fn.argtypes = [*argtypes, errbuf_t, size_t]
        fn.restype = c_int
    cdll.pft_free.argtypes = [c_void_p]
    cdll.pft_free.restype = None
    cdll.pft_handle_count.argtypes = []
    cdll.pft_handle_count.restype = i64


def lib() -> ctypes.CDLL:
    """Return the loaded native library, loading it on first use.

    Raises:
        ForkedProcessError: in a process forked after the library was loaded.
    """
    global _lib, _loaded_pid
    if _forked:
        raise errors.ForkedProcessError(
            f"pyfastensor's native library was loaded in process {_loaded_pid}, and this process "
            f"({os.getpid()}) was forked from it: a forked child cannot use the parent's Go "
            "runtime. Start worker processes with the 'spawn' or 'forkserver' method "
            "(multiprocessing.get_context('spawn'), or DataLoader(multiprocessing_context="
            "'spawn')), or call pyfastensor only in the parent."
        )
    if _lib is None:
        with _lock:
            if _lib is None:
                cdll = ctypes.CDLL(str(library_path()))
                _declare(cdll, _PROTOTYPES)
                _configure(cdll)
                _loaded_pid = os.getpid()
                _lib = cdll
    return _lib


def _configure(cdll: ctypes.CDLL) -> None:
    """Hand the library what only Python can find: the libcufile copies torch's CUDA
    wheels install (the Go side resolves which libcufile to load, once, for every use)."""
    from . import config

    buf = ctypes.create_string_buffer(_ERRLEN)
    doc = json.dumps({"cufile_candidates": config.cufile_candidates()}).encode()
    if cdll.pft_configure(doc, buf, _ERRLEN) != 0:
        raise errors.InternalError(buf.value.decode("utf-8", "replace"))


_settings: dict[str, Any] | None = None


def crc_speed(block: int, millis: int = 200) -> float:
    """Bytes per second of the CRC-32 every record is checked with, on one thread, over a
    block of ``block`` bytes summed again and again for about ``millis`` ms (the Go core's
    ``transfer.CRCSpeed``)."""
    out = ctypes.c_double()
    call("pft_crc_speed", block, millis, ctypes.byref(out))
    return out.value


def settings(**overrides: int) -> dict[str, Any]:
    """The data path's thresholds, as the Go core defines them (``transfer/settings.go``).

    Keyword arguments override the few that tests may change
    (``whole_min``, ``whole_average_min``) and return the new values.
    """
    global _settings
    if _settings is None or overrides:
        out = c_void_p()
        call("pft_settings", json.dumps(overrides).encode() if overrides else None, ctypes.byref(out))
        _settings = json.loads(take_string(out))
    return _settings


def loaded() -> bool:
    """Whether the native library has been loaded in this process."""
    return _lib is not None


def call(name: str, *args: Any) -> None:
    """Call native function ``name`` with ``args`` and raise on a non-zero status."""
    fn = getattr(lib(), name)
    buf = ctypes.create_string_buffer(_ERRLEN)
    status = fn(*args, buf, _ERRLEN)
    if status != 0:
        raise _STATUS.get(status, errors.FastensorError)(buf.value.decode("utf-8", "replace"))


def take_string(ptr: c_void_p) -> str:
    """Copy and free a string the library allocated."""
    try:
        return ctypes.string_at(ptr.value).decode()
    finally:
        lib().pft_free(ptr)


def handle_count() -> int:
    """Number of live native handles (for leak checks)."""
    return int(lib().pft_handle_count())


def cstr(s: str | os.PathLike[str] | None) -> bytes | None:
    """Encode a str or path for a ``char *`` argument (None stays NULL)."""
    return None if s is None else os.fsencode(s)


class Handle:
    """Base of the Python objects that own a Go object through a handle.

    Subclasses name the native function that releases it (``_close_fn``)
    and store the handle in ``self._handle`` once the native call that made
    it returned. The handle is released once: by :meth:`close`, at the end
    of a ``with`` block, or when the object is collected (never in a forked
    child, which cannot call in).
    """

    _close_fn = ""
    _handle = 0

    def __init__(self) -> None:
        self._handle = 0
        self._lock = threading.Lock()

    def _closed_message(self) -> str:
        return f"{type(self).__name__} is closed"

    def _live(self) -> int:
        """The handle, or ``ValueError`` once closed."""
        if not self._handle:
            raise ValueError(self._closed_message())
        return self._handle

    def close(self) -> None:
        """Release the native object (idempotent)."""
        with self._lock:
            h, self._handle = self._handle, 0
        if h:
            call(self._close_fn, h)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", 0) and loaded() and not _forked:
            try:
                self.close()
            except Exception:
                pass

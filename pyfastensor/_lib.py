"""Loading of the native library and the shape of every call into it.

The Go core is a shared library inside this package (``_native*.so``), loaded
with ctypes on first use, not at import: importing pyfastensor costs nothing
and starts no Go runtime. ctypes releases the GIL for the duration of every
call, so native I/O runs in parallel with Python threads.

Every native function returns a status code and, on failure, its whole
message as a string the caller frees; :func:`call` turns a non-zero status
into the matching exception from :mod:`pyfastensor.errors`, and
:func:`call_json` also parses the JSON result a function returns. The
argument and return types of every function come from one table,
:mod:`pyfastensor._abi`, which the build generates from cgo's header.

Exit: objects that own native resources and are still alive when the
interpreter exits are closed at exit (:func:`close_at_exit`), newest first,
while the modules their ``close`` needs are intact (from Python 3.12 the
interpreter clears module globals before it collects what they held, so a
``__del__`` then finds its functions gone).

Fork: a child forked after the library was loaded cannot use the parent's Go
runtime (its first call would hang), so :func:`lib` raises
:class:`~pyfastensor.errors.ForkedProcessError` there instead. A child that
never calls in (a DataLoader worker) is unaffected.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.machinery
import itertools
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from . import errors

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
    1000: errors.SystemCallError,  # plus the errno: another operating-system error
}
_ERRNO_BASE, _ERRNO_MAX = 1000, 2000

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


# C types as the header writes them (pyfastensor/_abi.py) -> ctypes. A string the
# library allocates (char**) is taken as a void pointer, to be freed with pft_free.
_CTYPES: dict[str, Any] = {
    "void": None,
    "int": c_int,
    "int64_t": i64,
    "uint64_t": u64,
    "size_t": size_t,
    "double": ctypes.c_double,
    "char*": c_char_p,
    "void*": c_void_p,
    "char**": ctypes.POINTER(c_void_p),
    "void**": ctypes.POINTER(c_void_p),
    "int*": ctypes.POINTER(c_int),
    "int64_t*": ctypes.POINTER(i64),
    "uint64_t*": ctypes.POINTER(u64),
    "size_t*": ctypes.POINTER(size_t),
    "double*": ctypes.POINTER(ctypes.c_double),
}


def _declare(cdll: ctypes.CDLL, table: dict[str, tuple[str, tuple[tuple[str, str], ...]]]) -> None:
    for name, (ret, params) in table.items():
        fn = getattr(cdll, name)
        fn.argtypes = [_CTYPES[t] for t, _ in params]
        fn.restype = _CTYPES[ret]


def _prototypes(path: Path) -> dict[str, tuple[str, tuple[tuple[str, str], ...]]]:
    """The table to declare for the library at ``path``: the shipped one, or, for a
    library ``PYFASTENSOR_LIB`` names with cgo's header beside it (``x.so`` and ``x.h``,
    as ``go build -buildmode=c-shared`` leaves them), that header's: a library built
    from other source, or with the tests' ``-tags pftdebug`` exports."""
    header = path.with_suffix(".h")
    if os.environ.get("PYFASTENSOR_LIB") and header.is_file():
        from . import _cheader

        return _cheader.parse(header.read_text())
    from . import _abi

    return _abi.PROTOTYPES


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
                path = library_path()
                cdll = ctypes.CDLL(str(path))
                _declare(cdll, _prototypes(path))
                _configure(cdll)
                _loaded_pid = os.getpid()
                _lib = cdll
    return _lib


def _configure(cdll: ctypes.CDLL) -> None:
    """Hand the library what only Python can find: the libcufile copies torch's CUDA
    wheels install (the Go side resolves which libcufile to load, once, for every use)."""
    from . import config

    doc = json.dumps({"cufile_candidates": config.cufile_candidates()}).encode()
    _invoke(cdll, "pft_configure", (doc,))


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
        _settings = call_json("pft_settings", json.dumps(overrides).encode() if overrides else None)
    return _settings


def loaded() -> bool:
    """Whether the native library has been loaded in this process (not in a parent it was
    forked from, where it cannot be called)."""
    return _lib is not None and not _forked


def _invoke(cdll: ctypes.CDLL, name: str, args: tuple[Any, ...]) -> None:
    err = c_void_p()
    status = getattr(cdll, name)(*args, ctypes.byref(err))
    if status != 0:
        message = f"{name} failed with status {status}"
        if err.value:
            try:
                message = ctypes.string_at(err.value).decode("utf-8", "replace")
            finally:
                cdll.pft_free(err)
        if _ERRNO_BASE < status < _ERRNO_MAX:
            raise errors.system_call_error(status - _ERRNO_BASE, message)
        raise _STATUS.get(status, errors.FastensorError)(message)


def call(name: str, *args: Any) -> None:
    """Call native function ``name`` with ``args`` and raise on a non-zero status.

    Every function takes ``char **errOut`` last (not in ``args``): on failure the
    library puts its whole message there (a panic's with its stack), which
    becomes the exception's message.
    """
    _invoke(lib(), name, args)


def call_json(name: str, *args: Any) -> Any:
    """Call native function ``name`` whose last argument before ``errOut`` is ``char **out``:
    pass ``args``, then ``out``, and return the JSON result it receives, parsed (None when
    the function left ``out`` NULL). Raises as :func:`call` does."""
    cdll = lib()
    out = c_void_p()
    try:
        _invoke(cdll, name, (*args, ctypes.byref(out)))
        return None if not out.value else json.loads(ctypes.string_at(out.value).decode())
    finally:
        if out.value:  # the result, or one made before the call failed
            cdll.pft_free(out)


def options(engine: Any = None, **fields: Any) -> bytes:
    """The JSON options argument of every native function that moves data
    (``gofastensor/options.go``): one object, in one place of each call.

    Args:
        engine: None or ``""`` (the data path chooses), an engine name, or open
            :class:`~pyfastensor.dictionary.Dictionaries` (their handle crosses as
            the integer ``dict``; WDic for writes and RDic for reads unless
            ``dict_use`` says otherwise).
        fields: the other options, by their JSON names (``durable``, ``verify``,
            ``workers``, ``dict_use``, ``threads``, ``task_size``, ``queue_depth``);
            None leaves one out. ``threads`` and ``task_size`` default to
            :mod:`pyfastensor.config`'s.
    """
    from . import config

    doc: dict[str, Any] = {"threads": config.threads(), "task_size": config.task_size()}
    if isinstance(engine, str):
        if engine:
            doc["engine"] = engine
    elif engine is not None:
        live = getattr(engine, "_live", None)
        if live is None:
            raise TypeError(f"engine={engine!r}: expected an engine name or pyfastensor.dictionary.Dictionaries")
        doc["dict"] = int(live())
    doc.update((k, v) for k, v in fields.items() if v is not None)
    return json.dumps(doc).encode()


def release_idle() -> int:
    """Unmap the core's idle O_DIRECT bounce buffers and return its heap's free pages to the
    system; the bounce bytes released."""
    out = i64()
    call("pft_release_idle", ctypes.byref(out))
    return out.value


def handle_count() -> int:
    """Number of live native handles (for leak checks)."""
    return int(lib().pft_handle_count())


def cstr(s: str | os.PathLike[str] | None) -> bytes | None:
    """Encode a str or path for a ``char *`` argument (None stays NULL).

    Raises:
        ValueError: it holds a NUL byte, where C would end it (a path would name another
            file), as Python's own ``open`` refuses it.
    """
    if s is None:
        return None
    b = os.fsencode(s)
    if b"\0" in b:
        raise ValueError(f"embedded null byte in {os.fsdecode(b)!r}")
    return b


_open: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_opened = itertools.count()


def close_at_exit(obj: Any) -> None:
    """Have ``obj.close()`` called at interpreter exit if ``obj`` is still alive then (held weakly)."""
    _open[next(_opened)] = obj


@atexit.register
def _close_still_open() -> None:
    if _forked or _lib is None:
        return
    for key in sorted(_open.keys(), reverse=True):  # newest first: what depends on an older object
        obj = _open.get(key)
        if obj is not None:
            try:
                obj.close()
            except Exception:  # the process is ending: nothing is left to tell
                pass


class Handle:
    """Base of the Python objects that own a Go object through a handle.

    Subclasses name the native function that releases it (``_close_fn``)
    and store the handle in ``self._handle`` once the native call that made
    it returned. The handle is released once: by :meth:`close`, at the end
    of a ``with`` block, when the object is collected, or at interpreter exit
    (:func:`close_at_exit`); never in a forked child, which cannot call in.
    """

    _close_fn = ""
    _handle = 0

    def __init__(self) -> None:
        self._handle = 0
        self._lock = threading.Lock()
        close_at_exit(self)

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

"""pyfastensor.load: torch.load's drop-in, reading records in parallel with CRC checks."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from mmap import MAP_SHARED
from typing import IO, TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..dictionary import Dictionaries

from .. import _torch
from ..errors import CorruptFileError, EndOfFileError
from . import _cuda, _progress
from ._native import Archive
from ._torchzip import PreloadedZip, key_paths
from ._unpickle import load_cpu, refused, unpickle

FileLike = str | os.PathLike[str] | IO[bytes]
MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None

_ZIP_MAGIC = b"PK\x03\x04"
_NOT_LOADED = object()
_TRUE = ("1", "y", "yes", "true")


def load(
    f: FileLike,
    map_location: MapLocation = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    verify: bool = True,
    engine: str | Dictionaries | None = None,
    progress: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Load an object saved with :func:`torch.save` or :func:`pyfastensor.save`.

    A drop-in for :func:`torch.load`: same arguments, same results, same
    restricted unpickler by default (``weights_only=True``, which refuses
    arbitrary globals: loading an untrusted file executes no code from it).
    The central directory is validated first; then every storage record is
    read in parallel straight into its destination tensor, its CRC-32
    checked; then the object is unpickled by torch's own machinery, so
    ``map_location`` (a string, :class:`torch.device`, dict or callable),
    shared storages and views behave exactly as in torch.

    Records the page cache holds (cachestat) are copied from it; the others
    are read with O_DIRECT where the filesystem allows. A file of ours
    (16 MiB and up) that is mostly not cached is read whole, in large
    O_DIRECT requests, into one page-aligned area (huge pages where the
    kernel allows), its CRC-32s summed as it lands, then parsed and
    checked from memory (for files whose records average 16 KiB and
    up; smaller ones are read record by record); each storage of
    64 KiB and up keeps its own pages of that area (freed with it), the
    smaller ones are copied out while the object is unpickled. Otherwise storages of 1 MiB and more get
    page-aligned memory of their own (huge pages where the kernel allows),
    which O_DIRECT fills without a copy and a copy out of the page cache
    faults in 2 MiB at a time. Like those of ``torch.load(..., mmap=True)``,
    such storages cannot be resized (``untyped_storage().resize_()``);
    everything else, sharing between processes included, works as with
    torch's allocator.

    With ``mmap=True`` the storages are views of one mapping of the file,
    as with ``torch.load(..., mmap=True)``: no copy, and memory the kernel
    can drop and read again. Unlike torch's, the records are still checked
    against their CRC-32s, in parallel while the object is unpickled, which
    reads the whole file once; ``verify=False`` keeps the mapping lazy
    (pages are read when first touched). A mapped file must not be
    truncated or rewritten in place while its tensors live: ``pyfastensor.save``
    replaces files by rename, which leaves mappings of the old file intact.

    Files torch.load understands but that are not zip archives of stored
    records (legacy ``_use_new_zipfile_serialization=False`` files,
    TorchScript archives, compressed zips), ``mmap=True`` on a file-like
    object and meta or fake-tensor loads are handed to :func:`torch.load`
    unchanged.

    Args:
        f: a path, or a readable, seekable binary file-like object (spooled to
            a temporary file first).
        map_location: where to put the storages, as in :func:`torch.load`.
            Default: where they were saved from. A CUDA device (or a dict
            mapping to one) reads records straight into device memory,
            through cuFile or pinned buffers (``checkpoint/_cuda.py``).
        pickle_module: unpickling module, only with ``weights_only=False``.
        weights_only: restrict unpickling to tensors, primitive types, dicts
            and allowlisted globals (``torch.serialization.add_safe_globals``).
            Default: ``True`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` and
            ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` work as in torch).
        mmap: map the file instead of reading it; storages share the page
            cache's memory. Default: torch's ``torch.utils.serialization.config.load.mmap``
            (``False``).
        verify: check every record's CRC-32. Default: ``True``.
        engine: one I/O engine for every record, or open
            :class:`pyfastensor.dictionary.Dictionaries` to choose per record
            size from the read dictionary. Default: the page cache (posix).
            To CUDA: ``"cufile"`` reads through GPUDirect Storage or raises
            saying why it cannot; another engine name reads through it into
            the pinned ring; default: cuFile where it works.
        progress: show a progress bar for loads longer than about two seconds.
            Default: the ``PYFASTENSOR_PROGRESS`` setting (on).
        pickle_load_args: passed to the unpickler, as in :func:`torch.load`.

    Returns:
        The object that was saved.

    Raises:
        CorruptFileError: a record's CRC-32 does not match, the zip structure is
            damaged, or the file is truncated; the message names the file, the
            record (``archive/data/3``) and, where it can, the tensor's key path.
        pickle.UnpicklingError: with ``weights_only=True``, the file needs a
            global that is not allowed; nothing from the file was executed.

    Example::

        >>> import torch, pyfastensor
        >>> pyfastensor.save({"w": torch.ones(3)}, "/tmp/w.pt")
        >>> pyfastensor.load("/tmp/w.pt", map_location="cpu")["w"]
        tensor([1., 1., 1.])
    """
    weights_only = _resolve_weights_only(weights_only, pickle_module)
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    if not weights_only and pickle_module is None:
        pickle_module = pickle
    torch_args = dict(pickle_load_args)  # torch.load adds its own default encoding
    pickle_load_args.setdefault("encoding", "utf-8")

    def to_torch(src: FileLike) -> Any:
        return _torch.torch_load(src, map_location, pickle_module, weights_only=weights_only,
                                 mmap=mmap, **torch_args)

    if mmap is None:
        mmap = _torch.default_load_mmap()
    if _is_meta(map_location) or _fake_or_skip():
        return to_torch(f)
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        if path.endswith(".safetensors"):
            return to_torch(f)
        return _load_path(path, to_torch, map_location, pickle_module, weights_only,
                          verify, engine, progress, pickle_load_args, mmap=mmap)
    if mmap or not all(callable(getattr(f, m, None)) for m in ("read", "seek", "tell")):
        return to_torch(f)  # torch's errors: mmap needs a path; a file-like must be seekable
    start = f.tell()
    magic = f.read(4)
    f.seek(start)
    if not magic:  # torch says only EOFError
        raise EndOfFileError(f"cannot load from {_named(f)}: nothing to read (empty, or at its end)")
    if magic != _ZIP_MAGIC:
        return to_torch(f)
    with tempfile.TemporaryDirectory(prefix="pyfastensor-") as d:
        spooled = os.path.join(d, "spooled.pt")
        with open(spooled, "wb") as out:
            _spool(f, out)
        f.seek(start)

        def from_buffer(_: FileLike) -> Any:
            return to_torch(f)

        try:
            return _load_path(spooled, from_buffer, map_location, pickle_module, weights_only,
                              verify, engine, progress, pickle_load_args)
        except CorruptFileError as e:  # name what the caller gave, not the spooled copy
            raise CorruptFileError(str(e).replace(spooled, _named(f))) from None
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(str(e).replace(spooled, _named(f))) from None


def _spool(f: IO[bytes], out: IO[bytes]) -> None:
    """Copy the rest of ``f`` to ``out``, through ``f.readinto`` where it has one (as torch reads a
    file-like: into a buffer of the reader's, no bytes object per read)."""
    readinto = getattr(f, "readinto", None)
    if not callable(readinto):
        shutil.copyfileobj(f, out, 16 << 20)
        return
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    while n := readinto(view):
        out.write(view[:n])


def _named(f: IO[bytes]) -> str:
    """What names a file-like in a message: its ``name``, or its type."""
    name = getattr(f, "name", None)
    return repr(name) if isinstance(name, str) else f"<{type(f).__module__}.{type(f).__qualname__}>"


def _resolve_weights_only(weights_only: bool | None, pickle_module: Any) -> bool:
    """``weights_only`` as torch.load decides it: the argument, else whether ``pickle_module`` is
    None; ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` forces True, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
    forces False where the argument was not given (with torch's warning); both set is an error."""
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    if force and force_no:
        raise RuntimeError("Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` "
                           "should be set, but both were set.")
    if force:
        return True
    if weights_only is None:
        if force_no:
            warnings.warn("Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the "
                          "`weights_only` argument was not explicitly passed to `torch.load`, forcing "
                          "weights_only=False.", UserWarning, stacklevel=3)
            return False
        return pickle_module is None
    return bool(weights_only)


def _is_meta(map_location: MapLocation) -> bool:
    """Whether ``map_location`` is the meta device by itself (a dict or callable is not)."""
    if isinstance(map_location, str):
        return map_location == "meta"
    return isinstance(map_location, torch.device) and map_location.type == "meta"


def _fake_or_skip() -> bool:
    return _torch.fake_mode_active() or _torch.skip_data()


def _load_path(
    path: str, to_torch: Callable[[FileLike], Any], map_location: MapLocation,
    pickle_module: Any, weights_only: bool, verify: bool, engine: str | None,
    progress: bool | None, pickle_load_args: dict[str, Any], *, mmap: bool = False,
) -> Any:
    if not mmap and _cuda.wants(map_location):  # records straight into device memory
        module = _torch.weights_only_unpickler if weights_only else pickle_module
        return _cuda.load(path, to_torch, map_location, module, weights_only, verify, pickle_load_args,
                          engine=engine, progress=progress)
    # A load makes a few objects per tensor (entries, storages, tensors) and
    # keeps all of them: the collector's passes over the process's heap in
    # the meantime find nothing to free (about 15% of a 10,000-tensor load).
    with _gc_paused():
        # One native call opens the file, decides whether torch.load takes it
        # and how to read it, and reads a cold file of ours whole
        # (checkpoint/load.go); this carries the decision out.
        archive = _open(path, mmap, verify, engine, progress)
        return _load_archive(path, archive, to_torch, map_location, pickle_module, weights_only,
                             verify, engine, progress, pickle_load_args, mmap=mmap)


def _open(path: str, mmap: bool, verify: bool, engine: str | Dictionaries | None, progress: bool | None) -> Archive:
    """:meth:`Archive.load` of ``path``, with a bar while a large cold file is read whole.

    A mapped load takes every storage from the mapping: where each record
    would be read to is of no use to it (``parse_only``).
    """
    if not _progress.enabled(progress):
        return Archive.load(path, parse_only=mmap, verify=verify, engine=engine)
    total = os.stat(path).st_size  # the bar's length only: the file is opened once, by the call
    return _progress.run(
        lambda counter: Archive.load(path, parse_only=mmap, verify=verify, engine=engine, counter=counter),
        total, f"read {os.path.basename(path)}", progress)


def _load_archive(
    path: str, opened: Archive, to_torch: Callable[[FileLike], Any],
    map_location: MapLocation, pickle_module: Any, weights_only: bool, verify: bool, engine: str | None,
    progress: bool | None, pickle_load_args: dict[str, Any], *, mmap: bool = False,
) -> Any:
    with opened as archive:  # closed, then its arena's pages no tensor took, when the load is over
        if archive.size == 0:  # torch says only EOFError, or (mmap) that the file is not a zip
            raise EndOfFileError(f"cannot load {path}: the file is empty (0 bytes), not a checkpoint")
        if archive.fallback:  # not a zip, TorchScript, compressed, or not torch's layout
            return to_torch(path)
        zf = PreloadedZip(archive, storages=not mmap)
        overall = None
        pending = None
        # A file mapped shared is one the program may write through: its records' CRC-32s can
        # be stale by its own doing. A mismatch then warns and loads, as torch loads; anywhere
        # else it raises (the message says how to take the bytes as they are).
        shared = mmap and _shared_mapping()
        try:
            if mmap:
                zf.read_small(verify=verify)
                overall = _map(archive.source, archive.size)
                base = overall.data_ptr()
                entries = archive.entries
                records = [(i, base + entries[i].offset, entries[i].size)
                           for i in zf.storage_indices] if verify else []
                pending = _progress.Pending(
                    lambda counter: archive.verify(records, counter=counter),
                    zf.data_bytes if verify else 0, f"verify {os.path.basename(path)}", progress)
            else:  # the storages' read first; the pickle and the other small records beside it
                pending = _progress.Pending(
                    lambda counter: zf.read_storages(verify=verify, engine=engine, counter=counter),
                    zf.data_bytes, f"load {os.path.basename(path)}", progress)
                zf.read_small(verify=verify)
        except CorruptFileError as e:
            if pending is not None:  # the archive closes with the error: let its read finish first
                pending.settle()
            raise CorruptFileError(_with_keys(str(e), archive)) from None
        # Unpickle while the storages are read only where nothing in unpickling
        # can look at their bytes: CPU storages, in our byte order, to the CPU,
        # rebuilt by the restricted C unpickler alone (load_cpu, or
        # FastUnpickler through torch's _load; load_cpu checks each storage's
        # location itself and raises before using a storage saved elsewhere,
        # torch's _load moves storages only when the pickle names a device:
        # cpu_only). torch's own unpickler may read them while unpickling (an
        # allowlisted or any class's __setstate__, the check of sparse tensors'
        # indices): wait first. A device to move them to, a byte swap: wait
        # first too. A mapped load's storages are the file itself: only their
        # check runs beside the unpickling.
        to_cpu = _to_cpu(map_location)
        module = _torch.weights_only_unpickler if weights_only else pickle_module

        def filled() -> None:
            if not mmap:
                _wait(pending, archive, shared=shared)

        try:
            obj = _NOT_LOADED
            # pickle_module pickle reads the stream as load_cpu does, the same globals included.
            if (weights_only or pickle_module is pickle) and to_cpu and zf.native_order():
                try:
                    obj = load_cpu(zf, overall, **pickle_load_args)
                except Exception:  # noqa: BLE001 - torch's path decides, with torch's messages
                    obj = _NOT_LOADED
            if obj is _NOT_LOADED:
                if not (to_cpu and zf.cpu_only()):
                    _wait(pending, archive, shared=shared)
                obj = unpickle(zf, map_location, module, overall_storage=overall,
                               weights_only=weights_only, before_general=filled, **pickle_load_args)
        except pickle.UnpicklingError as e:
            _wait(pending, archive, shared=shared)  # a damaged record explains more than the pickle
            if not weights_only:
                raise
            raise refused(path, e, to_torch) from None
        except BaseException:
            _wait(pending, archive, shared=shared)
            raise
        _wait(pending, archive, shared=shared)
        return obj


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for the block, if it was on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _shared_mapping() -> bool:
    """Whether ``torch.load(..., mmap=True)`` maps files shared (``set_default_mmap_options``)."""
    return torch.serialization.get_default_mmap_options() == MAP_SHARED


def _map(path: str, size: int) -> torch.UntypedStorage:
    """The whole file as one CPU storage, mapped as ``torch.load(..., mmap=True)`` maps it."""
    return torch.UntypedStorage.from_file(path, _shared_mapping(), size)


def _to_cpu(map_location: MapLocation) -> bool:
    """Whether storages saved from the CPU stay there (and are not copied) under ``map_location``."""
    if map_location is None:
        return True
    try:
        return isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "cpu"
    except RuntimeError:  # not a device: torch.load's own error, once the read is over
        return False


def _wait(pending: _progress.Pending[None], archive: Archive, *, shared: bool = False) -> None:
    """Wait for the storages' read (or a mapped load's check); a corrupt record's error gains the
    tensors' key paths. ``shared``: the load maps the file shared, and a record that does not
    match its CRC-32 (all a mapped load's check looks at) warns instead, as the program may have
    changed the file in place through such a mapping."""
    try:
        pending.wait()
    except CorruptFileError as e:
        message = _with_keys(str(e), archive)
        if not shared:
            raise CorruptFileError(message) from None
        warnings.warn(f"{message}. Loaded as the file holds it now, as torch.load does: it is mapped shared "
                      "(torch.serialization.set_default_mmap_options(MAP_SHARED)), and a program may have "
                      "changed it in place through such a mapping", UserWarning, stacklevel=4)


def _with_keys(message: str, archive: Archive) -> str:
    """Add the key paths of the tensors stored in the record a message names, if found."""
    try:
        paths = key_paths(archive, message)
    except Exception as e:  # best effort: the message stands without them
        warnings.warn(f"could not map the corrupt record to tensor keys: {e}", stacklevel=3)
        return message
    if not paths:
        return message
    return f"{message} (tensor {', '.join(paths[:5])}{' ...' if len(paths) > 5 else ''})"

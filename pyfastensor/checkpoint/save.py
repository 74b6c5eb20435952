"""pyfastensor.save: torch.save's drop-in, durable by default, in torch's own zip format."""

from __future__ import annotations

import ctypes
import os
import pickle
import secrets
import shutil
import sys
import tempfile
from collections.abc import Collection
from typing import IO, TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..dictionary import Dictionaries

from .. import _device, _torch
from . import _from_device, _in_flight, _progress
from ._native import TorchArchive, write_archive
from ._skeleton import Skeleton, pickle_skeleton
from ._staged import StagedSave

FileLike = str | os.PathLike[str] | IO[bytes]


def save(
    obj: object,
    f: FileLike,
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    *,
    durable: bool = True,
    engine: str | Dictionaries | None = None,
    progress: bool | None = None,
) -> None:
    """Save an object to a file, as :func:`torch.save` does, faster and durably.

    The file is PyTorch's own zip format: stock :func:`torch.load` reads it.
    Storage records are stored uncompressed and aligned to 4 KiB (so O_DIRECT
    and GPUDirect Storage can read them in place), each with its CRC-32. The
    records are written in parallel straight from the tensors' memory.

    CUDA tensors are never copied to the host whole: their bytes go through a
    ring of pinned host buffers (``PYFASTENSOR_PINNED_POOL``, 256 MiB by
    default, allocated once per process), the device-to-host copies into some
    slots running while the others are written, so the disk is busy from the
    first slot to the last.

    Durability: a save to a path writes a temporary file
    ``.<name>.pyfastensor-tmp-<pid>@<pidns>-<random>`` in the same directory (a
    name over 205 bytes shortened in it, to fit the filesystem's 255), fsyncs
    it, renames it over ``f`` and fsyncs the directory, so after a crash ``f``
    holds the old checkpoint or the new one, never a torn file. A temporary
    file left by a killed process is removed by the next save to the same
    path (one of another host, on a shared filesystem, once a day old:
    ``<pidns>``, a hash of the boot id and the pid namespace, tells hosts and
    containers apart). ``durable=False`` skips the fsyncs (the rename stays
    atomic). A save to a path that an :func:`pyfastensor.async_save` is still
    writing waits for it, so the file left is this call's.

    Args:
        obj: any picklable object holding tensors (state dicts, optimizers...).
        f: a path, or a writable binary file-like object; the same bytes are
            written to it (built in a temporary file first, so without the
            durability promise, which is the file-like's business).
        pickle_module: module used for pickling metadata and objects.
            Default: :mod:`pickle`.
        pickle_protocol: pickle protocol. Default: 2, as torch.
        _use_new_zipfile_serialization: ``False`` hands the save to
            :func:`torch.save` (its legacy format).
        _disable_byteorder_record: as in :func:`torch.save`.
        durable: fsync the file and its directory. Default: ``True``.
        engine: one I/O engine for every record (``"posix"``, ``"direct"``...:
            the paper's "specific tool" mode), or open
            :class:`pyfastensor.dictionary.Dictionaries` to choose per record
            size from the write dictionary (aware or specific-dictionary
            mode). Default: direct for large records where O_DIRECT works,
            else posix.
        progress: show a progress bar for saves longer than about two
            seconds. Default: the ``PYFASTENSOR_PROGRESS`` setting (on).

    Raises:
        NoSpaceError: the filesystem is full; the previous file at ``f`` is
            intact and no temporary file is left.
        PermissionError: the directory is not writable (mode or read-only mount).
        FileNotFoundError: the directory does not exist.

    Example::

        >>> import torch, pyfastensor
        >>> model = torch.nn.Linear(4, 2)
        >>> pyfastensor.save(model.state_dict(), "/tmp/linear.pt")
        >>> torch.load("/tmp/linear.pt")["weight"].shape
        torch.Size([2, 4])
    """
    if isinstance(f, (str, os.PathLike)):
        _in_flight.settle(_in_flight.key(os.fspath(f)))  # an async_save to f, earlier, commits first
    if not _use_new_zipfile_serialization or _skip_data():
        _torch.torch_save(obj, f, pickle_module, pickle_protocol,
                          _use_new_zipfile_serialization=_use_new_zipfile_serialization,
                          _disable_byteorder_record=_disable_byteorder_record)
        return
    if isinstance(f, (str, os.PathLike)):
        _save_path(obj, os.fspath(f), pickle_module, pickle_protocol,
                   _disable_byteorder_record, durable, engine, progress)
        return
    write = f.write  # AttributeError for an object without one, as torch.save raises
    if not callable(write):
        raise TypeError(f"f must be a path or a file-like object with a callable 'write'; {type(f).__name__}'s "
                        f"'write' is a {type(write).__name__}")
    with tempfile.TemporaryDirectory(prefix="pyfastensor-") as d:
        tmp = os.path.join(d, "archive.pt")
        _save_path(obj, tmp, pickle_module, pickle_protocol,
                   _disable_byteorder_record, False, engine, progress)
        with open(tmp, "rb") as src:
            shutil.copyfileobj(src, f, 16 << 20)
    if callable(getattr(f, "flush", None)):
        f.flush()


def _skip_data() -> bool:
    return _torch.skip_data()


def _save_path(
    obj: object, path: str, pickle_module: Any, pickle_protocol: int,
    disable_byteorder: bool, durable: bool, engine: str | None, progress: bool | None,
) -> None:
    skel = pickle_skeleton(obj, pickle_module, pickle_protocol)
    write_skeleton(skel, path, disable_byteorder=disable_byteorder, durable=durable,
                   engine=engine, progress=progress)


def write_skeleton(
    skel: Skeleton, path: str, *, disable_byteorder: bool = False, durable: bool = True,
    engine: str | None = None, progress: bool | None = None,
) -> None:
    """Write a pickled skeleton and its storages' bytes as a torch zip archive at ``path``:
    the Go core lays out torch's records around them (checkpoint/torchzip.go)."""
    device = {k for k, s in skel.storages.items() if _from_device.on_device(s)}
    if device:
        _write_from_device(skel, device, path, disable_byteorder=disable_byteorder, durable=durable,
                           engine=engine, progress=progress)
        return
    archive, keep, total = torch_archive(skel, disable_byteorder=disable_byteorder)
    crc32 = _torch.crc32_on_save()
    _progress.run(
        lambda counter: write_archive(path, archive, durable=durable, engine=engine,
                                      counter=counter, crc32=crc32),
        total, f"save {os.path.basename(path)}", progress,
    )
    keep.clear()  # the native call has returned: the memory may go


def _write_from_device(
    skel: Skeleton, device: set[str], path: str, *, disable_byteorder: bool, durable: bool,
    engine: str | None, progress: bool | None,
) -> None:
    """:func:`write_skeleton` for a skeleton with CUDA storages (``device``): a staged save
    whose device storages go through the process's pinned ``"save"`` ring, their copies
    pipelined with the writes (:class:`~._from_device.Drain`); the others are written at the
    commit from their memory."""
    b = _device.backend()
    archive, keep, total = torch_archive(skel, disable_byteorder=disable_byteorder, staged=device)
    bar = _progress.Manual(total, f"save {os.path.basename(path)}", progress)
    try:
        staged = StagedSave(path, archive, [k in device for k in archive.keys], durable=durable, engine=engine,
                            crc32=_torch.crc32_on_save())
        _from_device.drain_into(b, staged, ((i, _from_device.bytes_of(skel.storages[key]))
                                            for i, key in enumerate(archive.keys) if key in device), bar.add)
    finally:
        bar.close()
    keep.clear()  # the native calls have returned: the memory may go


def torch_archive(
    skel: Skeleton, *, disable_byteorder: bool = False, staged: Collection[str] = (),
) -> tuple[TorchArchive, list[Any], int]:
    """What the Go core writes for ``skel`` (:class:`TorchArchive`), the owners of the memory it
    reads, and the storages' bytes in all.

    Storages not on the CPU are copied to it (as torch.save stages them),
    except the keys in ``staged``, which get no address: their bytes are
    written later, in parts (a staged save, checkpoint/_staged.py). The
    owners must stay alive until the archive is written.
    """
    n = len(skel.storages)
    addrs, sizes = (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)()
    keep: list[Any] = []
    total = 0
    kinds: dict[torch.device, str] = {}  # device -> its type: one lookup per device, not per storage
    for i, (key, storage) in enumerate(skel.storages.items()):
        nbytes = storage.nbytes()
        sizes[i] = nbytes
        total += nbytes
        if key in staged:
            continue
        device = storage.device
        kind = kinds.get(device) or kinds.setdefault(device, device.type)
        if kind != "cpu":
            storage = _to_cpu(key, storage, kind)
            keep.append(storage)
        addrs[i] = storage.data_ptr() or None
    archive = TorchArchive(skel.data, None if disable_byteorder else sys.byteorder, _serialization_id(),
                           list(skel.storages), addrs, sizes)
    return archive, keep, total


def _to_cpu(key: str, storage: torch.UntypedStorage, kind: str) -> torch.UntypedStorage:
    """A copy on the CPU of a storage on another device, as torch.save stages it.

    Raises:
        ValueError: the storage is on the meta device.
    """
    if kind == "meta":
        raise ValueError(
            f"storage {key} is on the meta device and has no data to save; use "
            "torch.serialization.skip_data() with torch.save to write metadata only"
        )
    return storage.cpu()


def _serialization_id() -> str:
    """A ``.data/serialization_id`` as torch.save makes one: 40 random decimal digits."""
    return "".join(str(secrets.randbelow(10)) for _ in range(40))

"""pyfastensor.load to CUDA: storage records read into device memory, never into pageable host memory.

``torch.load(f, map_location="cuda")`` reads every storage into host memory,
then copies it to the device, one storage after another. Here each storage
is allocated on its device while the pickle is unpickled, and the records
are then moved by one of two routes (where torch's own unpickler rebuilds
the object instead of the restricted one, because a class's
``__setstate__`` or torch's check of a sparse tensor may read a tensor as
it is rebuilt, the records are read into host memory first and each
storage is filled from there as it is made), decided once per load
(``PYFASTENSOR_CUDA_LOAD``, :func:`pyfastensor.config.cuda_load`):

- ``cufile``: GPUDirect Storage reads each record straight into its device
  memory (the Go core's cufile engine, every record in one parallel call;
  libcufile loaded at run time; destinations are not registered with
  ``cuFileBufRegister``, which pays only for buffers reused many times). Taken
  where cuFile works on the file's filesystem (``info()["dir"]["cufile"]``:
  the driver opens and a small write and read through cuFile succeed) and
  can open the file, unless the file is mostly in the page cache (the load's
  plan, ``archive.plan["warm"]``, by the share from which the CPU path reads
  through the cache: cuFile would read the disk again, the pinned ring reads
  memory); where it cannot (no libcufile, no NVIDIA driver,
  GPUDirect Storage not installed, a registration or read that fails), the
  load falls back to the pinned ring, :data:`last_route` says why, and a
  failure of an installed libcufile warns once per process
  (:func:`pyfastensor.engines.cufile_fallback`). CRC-32s are checked by reading each record
  back through the pinned ring (a device-to-host copy at PCIe speed, well
  above any disk's) and summing it in the Go core, in parallel pieces;
  ``verify=False`` skips that. (Summing on the device with torch ops would
  save the copy back but needs a CRC kernel torch does not have.)
- ``pinned``: a ring of :data:`~pyfastensor.config.PINNED_RING_SLOTS` pinned
  host buffers (``PYFASTENSOR_PINNED_POOL`` bytes in all, allocated once per
  process), read by one native read of every record, each slot copied to
  the device on a side stream and read into again once the copy has
  completed (:mod:`pyfastensor.checkpoint._ring`); CRC-32s are summed as the
  bytes land, each record checked at its last piece.

``engine=`` of :func:`pyfastensor.load` picks the route too: ``"cufile"``
is the cuFile route or an error saying why it cannot be (as
``PYFASTENSOR_CUDA_LOAD=cufile``); any other engine name is the pinned ring,
its reads through that engine. ``progress=`` shows a bar as the CPU path's
loads do.

Either way the bytes are the file's, checked against its CRC-32s, so the
result is bit-identical to ``torch.load(f, map_location=...)``: the same
unpickling (torch's ``_load``), the same storages shared by key.

Which map locations come here (:func:`wants`): a string or
:class:`torch.device` naming CUDA, and a dict mapping any location to CUDA
(storages it maps elsewhere are read into host memory as usual). A
callable is not: torch hands it each storage in host memory, and it may do
anything with it, so it keeps torch's path. Files in another byte order
keep it too (torch swaps their bytes in host memory).

Every CUDA call goes through :mod:`pyfastensor._device`'s backend, so the
tests drive all of this on CPU with a fake one (tests/cuda_fakes.py), and
the cuFile route with the fake libcufile of gds/testdata.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch

from .. import _device, _lib, config
from .._buffers import empty_bytes
from ..engines import EngineFile, cufile_driver_works, cufile_fallback
from ..errors import CorruptFileError, EngineUnavailableError, FastensorError
from . import _progress
from ._native import Archive, RingRead
from ._ring import upload
from ._torchzip import PreloadedZip, key_paths
from ._unpickle import refused, restricted, unpickle

_log = logging.getLogger("pyfastensor")


#: Where the nvidia-fs kernel module (GPUDirect Storage's driver) shows itself. Without it
#: cuFile serves reads in its compatibility mode (POSIX reads into its own bounce buffers, then
#: copies), which ``auto`` leaves for the pinned ring: the same route, with parallel reads and
#: the CRC-32s summed as the bytes land.
NVFS = "/proc/driver/nvidia-fs"

#: How the last CUDA load moved its records: ``{"path", "route", "reason"}`` (``route``
#: ``"cufile"`` or ``"pinned"``; ``reason`` why cuFile was not used, ``""`` when it was).
#: For inspection: tests check it.
last_route: dict[str, str] = {}

_GENERAL = object()  # the restricted unpickler could not rebuild it: the general one does


def wants(map_location: Any) -> bool:
    """Whether a load to ``map_location`` takes the CUDA path (see the module docstring)."""
    if isinstance(map_location, dict):
        return any(_is_cuda(v) for v in map_location.values())
    return _is_cuda(map_location)


def _is_cuda(where: Any) -> bool:
    if not isinstance(where, (str, torch.device)):
        return False
    try:
        return torch.device(where).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _target(map_location: Any, location: str) -> str:
    """Where torch would put a storage saved at ``location`` (``_get_restore_location``)."""
    if isinstance(map_location, dict):
        return str(map_location.get(location, location))
    return str(map_location)


class _DeviceZip(PreloadedZip):
    """A :class:`PreloadedZip` whose storages are placeholders, placed by :class:`_Placer`.

    torch's ``load_tensor`` asks the reader for a record, then hands it to
    ``restore_location`` (our :class:`_Placer`) at once: the placeholder
    carries the name from one to the other.
    """

    def __init__(self, archive: Archive) -> None:
        super().__init__(archive, storages=False)
        self.last = ""

    def get_storage_from_record(self, name: str, numel: int, _cls: Any) -> torch.Tensor:
        full = self.prefix + name
        i = self.archive.index.get(full)
        if i is None or not full.startswith(self.prefix + "data/"):
            raise CorruptFileError(
                f"checkpoint: {self.archive.path} is corrupt: record {full!r} is referenced by the "
                "pickle but missing from the archive"
            )
        if self.archive.entries[i].size != numel:
            raise CorruptFileError(
                f"checkpoint: {self.archive.path} is corrupt: record {full!r} has "
                f"{self.archive.entries[i].size} bytes, the pickle expects {numel}"
            )
        self.last = full
        return torch.empty(numel, dtype=torch.uint8, device="meta")


class _Placer:
    """The ``map_location`` callable torch's unpickling calls with each new storage: allocates
    it where the user's ``map_location`` sends it, and notes which record fills it."""

    def __init__(self, zf: _DeviceZip, map_location: Any, backend: _device.Backend,
                 fill_now: Callable[[list[tuple[int, torch.Tensor]], bool], None] | None = None) -> None:
        self.zf, self.map_location, self.backend, self.fill_now = zf, map_location, backend, fill_now
        self.device: list[tuple[int, torch.Tensor]] = []  # (entry index, device memory)
        self.host: list[tuple[int, torch.Tensor]] = []  # (entry index, host memory)

    def __call__(self, storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
        i = self.zf.archive.index[self.zf.last]
        nbytes = self.zf.archive.entries[i].size
        target = _target(self.map_location, location)
        if _is_cuda(target):
            t = self.backend.empty(nbytes, self.backend.device(target))
            self.device.append((i, t))
            if self.fill_now is not None:
                self.fill_now([(i, t)], True)
            return t.untyped_storage()
        t = torch.empty(nbytes, dtype=torch.uint8)
        self.host.append((i, t))
        if self.fill_now is not None:
            self.fill_now([(i, t)], False)
        return torch.serialization.default_restore_location(t.untyped_storage(), target)


def load(
    path: str, to_torch: Callable[[str], Any], map_location: Any, module: Any, weights_only: bool,
    verify: bool, pickle_load_args: dict[str, Any], *, backend: _device.Backend | None = None,
    engine: Any = None, progress: bool | None = None,
) -> Any:
    """``pyfastensor.load(path, map_location=...)`` for a map location :func:`wants` (see the module docstring).

    ``to_torch`` loads with torch.load itself, for files this cannot read
    (TorchScript, compressed, another byte order); ``module`` is the
    unpickling module (torch's weights-only one or the user's); ``engine``
    (an engine name, open :class:`~pyfastensor.dictionary.Dictionaries` or
    None) and ``progress`` are :func:`pyfastensor.load`'s.
    """
    b = backend or _device.backend()
    with Archive.load(path, parse_only=True) as archive:
        if archive.fallback:  # not a zip, TorchScript, compressed, or not torch's layout
            return to_torch(path)
        zf = _DeviceZip(archive)
        zf.read_small(verify=verify)
        if not zf.native_order():
            return to_torch(path)
        bar = _progress.Manual(zf.data_bytes, f"load {os.path.basename(path)}", progress)

        def read(records: list[tuple[int, torch.Tensor]], device: bool) -> None:
            if device:
                fill(archive, records, verify=verify, backend=b, engine=engine, done=bar.add)
            elif records:
                archive.read([(i, t.data_ptr(), t.numel()) for i, t in records], verify=verify,
                             engine=None if engine == "cufile" else engine)
                bar.add(sum(t.numel() for _, t in records))

        try:
            # Every storage is made while unpickling, every record read after, together: where
            # the restricted C unpickler rebuilds the object, nothing reads a storage meanwhile.
            placer = _Placer(zf, map_location, b)
            obj: Any = _GENERAL
            try:
                if weights_only or module is pickle:
                    obj = restricted(zf, placer, **pickle_load_args)
            except Exception:  # noqa: BLE001 - the general unpickler decides, with its own messages
                obj = _GENERAL
            if obj is not _GENERAL:
                read(placer.host, False)
                read(placer.device, True)
                return obj
            # Torch's unpickler (or pickle_module's) may read a tensor as it rebuilds it (a class's
            # __setstate__, torch's check of a sparse tensor's indices): every record is read into
            # host memory first, in one parallel read, and each storage is filled from it as it
            # is made, as torch.load does.
            host = {i: empty_bytes(archive.entries[i].size) for i in zf.storage_indices}
            read([(i, t) for i, t in host.items()], False)

            def copy_in(records: list[tuple[int, torch.Tensor]], device: bool) -> None:
                for i, t in records:
                    if device:  # from pageable memory: the source is copied before the call returns
                        b.copy(t, host.pop(i))
                    else:
                        t.copy_(host.pop(i))

            try:
                return unpickle(zf, _Placer(zf, map_location, b, fill_now=copy_in), module,
                                weights_only=weights_only, **pickle_load_args)
            except pickle.UnpicklingError as e:
                if not weights_only:
                    raise
                raise refused(path, e, to_torch) from None
        except CorruptFileError as e:
            paths = key_paths(archive, str(e))
            if not paths:
                raise
            raise CorruptFileError(f"{e} (tensor {', '.join(paths[:5])}{' ...' if len(paths) > 5 else ''})") from None
        finally:
            bar.close()


def fill(archive: Archive, records: list[tuple[int, torch.Tensor]], *, verify: bool,
         backend: _device.Backend, engine: Any = None, done: Callable[[int], None] | None = None) -> str:
    """Fill device memory from records of ``archive``: ``records`` holds ``(entry index, uint8
    device tensor of the record's size)``. Returns the route taken (``"cufile"`` or ``"pinned"``).

    Args:
        engine: ``"cufile"`` for the cuFile route (or an error), another engine name (or
            open dictionaries) for the pinned ring reading through it, None to choose (see the
            module docstring).
        done: called with the bytes of each step as it is read.

    Raises:
        CorruptFileError: a record's CRC-32 does not match (``verify``).
        EngineUnavailableError: ``PYFASTENSOR_CUDA_LOAD=cufile`` or ``engine="cufile"`` where
            cuFile cannot read the file.
    """
    records = sorted(records, key=lambda r: archive.entries[r[0]].offset)  # one pass over the file
    route, reason, cufile = _choose(archive, engine)
    done = done or (lambda n: None)
    last_route.clear()
    last_route.update(path=archive.path, route=route, reason=reason)
    if reason:
        _log.info("pyfastensor.load %s to CUDA through the pinned ring: %s", archive.path, reason)
    with _device.slab(backend).hold() as buf:
        ring = _device.Ring(buf, config.PINNED_RING_SLOTS)
        if cufile is not None:
            cufile.close()  # it answered the probe: the reads go in one parallel native call
            reads = [(i, t.data_ptr(), t.numel()) for i, t in records if t.numel()]
            for d in dict.fromkeys(t.device for _, t in records):
                # cuFileRead is ordered on no stream: kernels queued before the load may still use
                # memory the allocator has handed to these tensors.
                backend.current_stream(d).synchronize()
            try:
                archive.read(reads, verify=False, engine="cufile")  # the Go core never touches device memory
                done(sum(r[2] for r in reads))
            except (FastensorError, OSError) as e:
                if config.cuda_load() == "cufile" or engine == "cufile":
                    raise
                route, reason = "pinned", f"cuFile read failed, the load went through the pinned ring: {e}"
                last_route.update(route=route, reason=reason)
                cufile_fallback(reason)
                cufile = None
        if cufile is None:
            def start(slots: list[int], slot_bytes: int, fills: list[int], parts: list[tuple[int, ...]]) -> RingRead:
                return RingRead.of_archive(archive, slots, slot_bytes, fills, parts, verify=verify, engine=engine)
            upload(ring, backend, [(i, archive.entries[i].offset, t) for i, t in records], start, done)
        elif verify:
            _read_back(archive, records, ring, backend)
    return route


def _choose(archive: Archive, engine: Any = None) -> tuple[str, str, EngineFile | None]:
    """The route of a load: ``(route, why not cuFile, the file opened through cuFile or None)``."""
    mode = config.cuda_load()
    if engine is not None and engine != "cufile":
        return "pinned", f"engine={engine!r}", None
    if mode == "pinned" and engine is None:
        return "pinned", "PYFASTENSOR_CUDA_LOAD=pinned", None
    if mode == "auto" and engine is None and not os.path.exists(NVFS):
        return "pinned", (f"no GPUDirect Storage driver ({NVFS} missing): cuFile would run in its "
                          "compatibility mode, bounce buffers the pinned ring outruns"), None
    if mode == "auto" and engine is None and archive.plan.get("warm"):
        return "pinned", (f"{archive.plan['resident']:.0%} of the file is in the page cache: the pinned ring "
                          "reads it from memory, cuFile would read the disk again"), None
    try:
        return "cufile", "", EngineFile(archive.source, "r", engine="cufile")
    except (FastensorError, OSError) as e:  # no libcufile or driver, or cuFile refuses this file
        if engine == "cufile":
            raise EngineUnavailableError(f"engine='cufile', but cuFile cannot read {archive.path}: {e}") from None
        if mode == "cufile":
            raise EngineUnavailableError(
                f"PYFASTENSOR_CUDA_LOAD=cufile, but cuFile cannot read {archive.path}: {e}"
            ) from None
        reason = f"cuFile unavailable: {e}"
        if cufile_driver_works(os.path.dirname(os.path.abspath(archive.path))):
            cufile_fallback(reason)  # installed, yet it failed on this filesystem
        return "pinned", reason, None


def _read_back(archive: Archive, records: list[tuple[int, torch.Tensor]], ring: _device.Ring,
               backend: _device.Backend) -> None:
    """Check the CRC-32s of records already in device memory: each is copied back through the
    ring in slot-sized pieces (on a side stream, the next pieces' copies running while one is
    summed) and summed by the Go core, which checks each record at its last piece.

    Raises:
        CorruptFileError: a record's bytes do not match its CRC-32.
    """
    streams: dict[torch.device, Any] = {}
    pending: list[tuple[int, int, int, torch.Tensor, Any]] = []  # (entry, offset, bytes, slot memory, event)
    crcs: dict[int, int] = {}

    def settle() -> None:
        i, lo, n, buf, event = pending.pop(0)
        event.synchronize()
        crcs[i] = sum_part(archive, i, lo, buf.data_ptr(), n, crcs.get(i, 0))

    for i, t in records:
        for lo in range(0, t.numel(), ring.slot_bytes):
            n = min(ring.slot_bytes, t.numel() - lo)
            if len(pending) >= len(ring.slots) - 1:
                settle()
            slot, buf = ring.take()
            side = streams.get(t.device)
            if side is None:
                side = streams[t.device] = backend.side_stream(t.device)
                side.wait_stream(backend.current_stream(t.device))  # the cuFile reads are done
            with backend.use(side):
                backend.copy(buf[:n], t[lo:lo + n])
                event = backend.event()
                event.record(side)
            ring.used(slot, event)
            pending.append((i, lo, n, buf, event))
    while pending:
        settle()


def sum_part(archive: Archive, index: int, offset: int, addr: int, nbytes: int, crc: int) -> int:
    """Sum ``nbytes`` at ``addr``, bytes of record ``index`` from ``offset`` of its data, onto ``crc``
    (that of the bytes before ``offset``), in the Go core; return the new sum.

    Raises:
        CorruptFileError: at the record's last part, when the sum is not the central directory's.
    """
    out = _lib.i64()
    _lib.call("pft_ckpt_sum_part", archive._live(), index, offset, addr, nbytes, crc, ctypes.byref(out))
    return int(out.value)

"""pyfastensor.async_save: snapshot now, write in the background, one save per target at a time."""

from __future__ import annotations

import atexit
import os
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .. import _device, config
from ._skeleton import Skeleton, pickle_skeleton
from .save import write_skeleton

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_in_flight: dict[str, Future[None]] = {}


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pyfastensor-save")
            atexit.register(_executor.shutdown, wait=True)
        return _executor


def _on_device(storage: torch.UntypedStorage) -> bool:
    """Whether a storage is staged through pinned memory (tests stage CPU ones through a fake)."""
    return storage.device.type != "cpu"


class Snapshot:
    """A skeleton whose storages are copies, and what holds the copies' memory.

    Storages on an accelerator are copied through the process's pinned
    ``"save"`` slab (:func:`pyfastensor._device.slab`, ``PYFASTENSOR_PINNED_POOL``
    bytes, allocated once):

    - when they fit in it, straight into it, on a side stream: the call does
      not wait for the copies (the compute stream does, so later kernels
      cannot change what is being copied), :meth:`wait` does, and the slab
      stays held until :meth:`release`, after the write (one snapshot holds
      it at a time; the next waits for that write);
    - otherwise in waves: the slab is cut into ring slots, each filled by a
      device-to-host copy while the previous slots are copied out into host
      memory of the snapshot's own, and reused; the call returns once the
      last wave is out, and the slab is free again at once. The file is then
      written from that host memory, as for CPU tensors. (Writing each wave
      to the file as it lands, without the host copy, needs a save that
      takes its records in parts from the Go core: not there yet.)
    """

    def __init__(self, skeleton: Skeleton, events: list[Any], slab: _device.PinnedSlab | None,
                 waves: int) -> None:
        self.skeleton = skeleton
        self._events = events
        self._slab = slab
        #: Times the slab was filled: 0 (nothing on a device), 1 (it fitted), or more.
        self.waves = waves

    def wait(self) -> None:
        """Block until every copy has landed (before the write reads them)."""
        for e in self._events:
            e.synchronize()
        self._events = []

    def release(self) -> None:
        """Let the slab go (after the write). Idempotent."""
        slab, self._slab = self._slab, None
        if slab is not None:
            self.wait()
            slab.release()


def snapshot(skel: Skeleton) -> Snapshot:
    """Copy every storage of ``skel``: CPU ones into fresh host memory, accelerator ones
    through the pinned slab (see :class:`Snapshot`)."""
    copies: dict[str, torch.UntypedStorage] = {}
    device: list[tuple[str, torch.UntypedStorage]] = []
    for key, storage in skel.storages.items():
        if _on_device(storage):
            device.append((key, storage))
        else:
            staged = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
            staged.copy_(storage)
            copies[key] = staged
    if not device:
        return Snapshot(Skeleton(skel.data, copies), [], None, 0)
    b = _device.backend()
    slab = _device.slab(b, "save")
    buf = slab.acquire()
    try:
        fits = sum(_padded(s.nbytes()) for _, s in device) <= buf.numel()
        if fits:
            events = _into_slab(b, buf, device, copies)
            return Snapshot(Skeleton(skel.data, copies), events, slab, 1)
        waves = _in_waves(b, buf, device, copies)
    except BaseException:
        slab.release()
        raise
    slab.release()
    return Snapshot(Skeleton(skel.data, copies), [], None, waves)


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


#: Copies in the slab start on page boundaries (the writer's direct I/O reads them in place).
_ALIGN = 4096


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _side_streams(b: _device.Backend, device: list[tuple[str, torch.UntypedStorage]]) -> dict[torch.device, Any]:
    """A side stream per device, after everything its current stream has queued (the values as of now)."""
    sides: dict[torch.device, Any] = {}
    for _, s in device:
        if s.device not in sides:
            sides[s.device] = b.side_stream(s.device)
            sides[s.device].wait_stream(b.current_stream(s.device))
    return sides


def _into_slab(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
               copies: dict[str, torch.UntypedStorage]) -> list[Any]:
    """Copy the device storages into ``buf``, one after another; return the copies' events."""
    sides = _side_streams(b, device)
    whole = buf.untyped_storage()  # the slab's own: it starts at offset 0
    off = 0
    for key, s in device:
        n = s.nbytes()
        with b.use(sides[s.device]):
            b.copy(buf[off:off + n], _bytes_of(s))
        copies[key] = whole[off:off + n]
        off += _padded(n)
    events = []
    for d, side in sides.items():
        ev = b.event()
        ev.record(side)
        events.append(ev)
        b.current_stream(d).wait_stream(side)  # later kernels cannot change what is being copied
    return events


def _in_waves(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
              copies: dict[str, torch.UntypedStorage]) -> int:
    """Copy the device storages into host memory of their own through ``buf`` cut into ring
    slots (see :class:`Snapshot`); return how many times the slab was filled."""
    sides = _side_streams(b, device)
    ring = _device.Ring(buf, config.PINNED_RING_SLOTS, align=_ALIGN)
    pending: list[tuple[Any, torch.Tensor, torch.Tensor]] = []  # (event, slot part, host destination)
    pieces = 0

    def settle() -> None:
        event, src, dst = pending.pop(0)
        event.synchronize()
        dst.copy_(src)

    for key, s in device:
        host = torch.empty(s.nbytes(), dtype=torch.uint8)
        src = _bytes_of(s)
        for lo in range(0, s.nbytes(), ring.slot_bytes):
            n = min(ring.slot_bytes, s.nbytes() - lo)
            if len(pending) == len(ring.slots):
                settle()  # the oldest slot is copied out: free again
            _, slot = ring.take()
            with b.use(sides[s.device]):
                b.copy(slot[:n], src[lo:lo + n])
                ev = b.event()
                ev.record(sides[s.device])
            pending.append((ev, slot[:n], host[lo:lo + n]))
            pieces += 1
        copies[key] = host.untyped_storage()
    while pending:
        settle()
    return -(-pieces // len(ring.slots))


def async_save(
    obj: object,
    f: str | os.PathLike[str],
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    *,
    durable: bool = True,
    engine: str | None = None,
) -> Future[None]:
    """Save ``obj`` to the path ``f`` in the background, as :func:`pyfastensor.save` would.

    Before returning, the object is pickled and every tensor's storage copied
    (staging copy), so the caller may go on training and mutating parameters
    at once: the file holds the values as of the call. The file itself is
    written on a background thread, durably unless ``durable=False``.

    CUDA tensors are copied through a pinned host buffer allocated once per
    process (``PYFASTENSOR_PINNED_POOL``, 64 MiB by default): a state that fits
    is copied into it on a side stream without the call waiting (the current
    stream waits instead, so later kernels cannot change the values being
    copied), and the buffer is held until the write ends; a larger state goes
    through it in waves into host memory, and the call returns once the last
    wave is copied (see :class:`Snapshot`).

    At most one save per target is in flight: a second ``async_save`` to the
    same path waits (after taking its snapshot) for the first one to finish.

    Args:
        obj: any picklable object holding tensors.
        f: the target path (file-like objects are not supported here).
        pickle_module: as in :func:`torch.save`. Default: :mod:`pickle`.
        pickle_protocol: as in :func:`torch.save`. Default: 2.
        durable: fsync the file and its directory. Default: ``True``.
        engine: one I/O engine for every record; default: chosen by size.

    Returns:
        A :class:`concurrent.futures.Future`; ``.result()`` returns None once the
        checkpoint is committed and raises the save's error if it failed
        (``NoSpaceError``, ``PermissionError``...).

    Example::

        >>> import torch, pyfastensor
        >>> w = torch.ones(3)
        >>> fut = pyfastensor.async_save({"w": w}, "/tmp/w.pt")
        >>> w += 1  # does not change what is saved
        >>> fut.result()
        >>> pyfastensor.load("/tmp/w.pt")["w"]
        tensor([1., 1., 1.])
    """
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"async_save needs a path, got {type(f).__name__}; use pyfastensor.save for file-likes")
    path = os.path.abspath(os.fspath(f))
    snap = snapshot(pickle_skeleton(obj, pickle_module, pickle_protocol))
    with _lock:
        previous = _in_flight.get(path)
    if previous is not None:
        try:
            previous.result()
        except Exception:
            pass  # reported by its own future

    def write() -> None:
        try:
            snap.wait()
            write_skeleton(snap.skeleton, path, durable=durable, engine=engine, progress=False)
        finally:
            snap.release()

    try:
        fut = _pool().submit(write)
    except BaseException:
        snap.release()
        raise
    with _lock:
        _in_flight[path] = fut

    def forget(done: Future[None]) -> None:
        with _lock:
            if _in_flight.get(path) is done:
                del _in_flight[path]

    fut.add_done_callback(forget)
    return fut

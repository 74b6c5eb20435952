"""The snapshot an ``async_save`` takes before returning, and how CUDA storages get into it.

CPU storages are copied into fresh host memory. CUDA storages go through the
process's pinned ``"save"`` slab (:func:`pyfastensor._device.slab`,
``PYFASTENSOR_PINNED_POOL`` bytes, allocated once):

- a state whose CUDA storages fit in the slab is copied straight into it on
  a side stream. The call does not wait for the copies; the current stream
  does (so later kernels cannot change what is being copied), and the
  background write waits for them (:meth:`Snapshot.wait`). The slab stays
  held until the write ends: one snapshot holds it at a time.
- a larger one goes in waves: the slab is cut into ring slots, each filled
  by a device-to-host copy and written to the file (a staged save,
  :mod:`._staged`) before it is filled again, while the copies into the
  other slots run. The call returns once the last wave is in the slab; the
  background write writes it and commits. Host memory used: the slab, never
  the state's size.

Every CUDA call goes through :mod:`pyfastensor._device`'s backend, so the tests
drive this on CPU with a fake one (tests/test_checkpoint_async_cuda.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from .. import _device, config
from ._skeleton import Skeleton
from ._staged import StagedSave
from .save import torch_archive, write_skeleton


def _on_device(storage: torch.UntypedStorage) -> bool:
    """Whether a storage is staged through pinned memory (tests stage CPU ones through a fake)."""
    return storage.device.type != "cpu"


class Snapshot:
    """The copies of an ``async_save``'s storages, and how to write them (see the module docstring).

    :meth:`write` runs on the background thread; :meth:`release` after it, whatever happened.
    """

    def __init__(self, skeleton: Skeleton, path: str, durable: bool, engine: str | None) -> None:
        self.skeleton = skeleton
        self.path, self.durable, self.engine = path, durable, engine
        self.events: list[Any] = []  # copies in flight into the slab
        self.slab: _device.PinnedSlab | None = None  # held until release()
        self.staged: StagedSave | None = None  # the waves' save, once begun
        self.pending: deque[tuple[Any, torch.Tensor, int, int]] = deque()  # (event, slot part, storage, offset)
        #: Times the slab was filled: 0 (nothing on a device), 1 (it fitted), or more (waves).
        self.waves = 0

    def wait(self) -> None:
        """Block until every copy into the slab has landed."""
        for e in self.events:
            e.synchronize()
        self.events = []

    def settle(self) -> None:
        """Write the oldest wave slot to the file, once its copy has landed (its slot is free again)."""
        assert self.staged is not None
        event, part, storage, offset = self.pending.popleft()
        event.synchronize()
        self.staged.write(storage, offset, part.data_ptr(), part.numel())

    def write(self) -> None:
        """Write the checkpoint and commit it."""
        if self.staged is None:
            self.wait()
            write_skeleton(self.skeleton, self.path, durable=self.durable, engine=self.engine, progress=False)
            return
        while self.pending:
            self.settle()
        self.staged.commit()

    def release(self) -> None:
        """Give the slab back and drop a save not committed (its temporary file). Idempotent."""
        if self.staged is not None:
            self.staged.close()  # a no-op once committed
        slab, self.slab = self.slab, None
        if slab is not None:
            try:
                self.wait()
                for event, *_ in self.pending:
                    event.synchronize()  # no copy may still be landing in a slab another save gets
                self.pending.clear()
            finally:
                slab.release()


def snapshot(skel: Skeleton, path: str, *, durable: bool = True, engine: str | None = None) -> Snapshot:
    """Copy every storage of ``skel`` for a save to ``path`` (see the module docstring)."""
    copies: dict[str, torch.UntypedStorage] = {}
    device: list[tuple[str, torch.UntypedStorage]] = []
    for key, storage in skel.storages.items():
        if _on_device(storage):
            device.append((key, storage))
        else:
            staged = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
            staged.copy_(storage)
            copies[key] = staged
    snap = Snapshot(Skeleton(skel.data, copies), path, durable, engine)
    if not device:
        return snap
    b = _device.backend()
    slab = _device.slab(b, "save")
    buf = slab.acquire()
    snap.slab = slab
    try:
        if sum(_padded(s.nbytes()) for _, s in device) <= buf.numel():
            _into_slab(b, buf, device, snap)
            # The pickle's storage order, which the file's records follow.
            snap.skeleton = Skeleton(skel.data, {k: snap.skeleton.storages[k] for k in skel.storages})
        else:
            _in_waves(b, buf, device, skel, snap)
    except BaseException:
        snap.release()
        raise
    return snap


def _padded(n: int) -> int:
    """``n`` in whole pages: each copy in the slab starts on a page (direct I/O writes it in place)."""
    align = _device.memory_alignment()
    return -(-n // align) * align


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


def _hold_compute(b: _device.Backend, sides: dict[torch.device, Any]) -> None:
    """Later kernels on the current streams wait for the copies (which read what they could change)."""
    for d, side in sides.items():
        b.current_stream(d).wait_stream(side)


def _into_slab(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
               snap: Snapshot) -> None:
    """Copy the device storages into ``buf`` (the slab, at offset 0), one after another."""
    sides = _side_streams(b, device)
    whole = buf.untyped_storage()
    off = 0
    for key, s in device:
        n = s.nbytes()
        with b.use(sides[s.device]):
            b.copy(buf[off:off + n], _bytes_of(s))
        snap.skeleton.storages[key] = whole[off:off + n]
        off += _padded(n)
    for side in sides.values():
        ev = b.event()
        ev.record(side)
        snap.events.append(ev)
    _hold_compute(b, sides)
    snap.waves = 1


def _in_waves(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
              skel: Skeleton, snap: Snapshot) -> None:
    """Begin a staged save and write the device storages through ``buf`` cut into ring slots,
    all but the last wave (left in :attr:`Snapshot.pending` for :meth:`Snapshot.write`)."""
    on_device = {k for k, _ in device}
    every = {k: s if k in on_device else snap.skeleton.storages[k] for k, s in skel.storages.items()}
    # Every storage not staged is a CPU copy, which snap.skeleton holds until the commit reads it
    # (torch_archive copies none: its owners list is empty); the staged save holds the pickle.
    archive, owners, _ = torch_archive(Skeleton(skel.data, every), staged=on_device)
    assert not owners
    index = {k: i for i, k in enumerate(archive.keys)}
    snap.staged = StagedSave(snap.path, archive, [k in on_device for k in archive.keys],
                             durable=snap.durable, engine=snap.engine)
    sides = _side_streams(b, device)
    ring = _device.Ring(buf, config.PINNED_RING_SLOTS)
    pieces = 0
    for key, s in device:
        src = _bytes_of(s)
        for lo in range(0, s.nbytes(), ring.slot_bytes):
            n = min(ring.slot_bytes, s.nbytes() - lo)
            if len(snap.pending) == len(ring.slots):
                snap.settle()  # the oldest slot is on its way to the file: free again
            _, slot = ring.take()
            with b.use(sides[s.device]):
                b.copy(slot[:n], src[lo:lo + n])
                ev = b.event()
                ev.record(sides[s.device])
            snap.pending.append((ev, slot[:n], index[key], lo))
            pieces += 1
    _hold_compute(b, sides)
    snap.waves = -(-pieces // len(ring.slots))

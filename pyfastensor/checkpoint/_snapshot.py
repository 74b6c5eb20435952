"""The snapshot an ``async_save`` takes before returning, and how CUDA storages get into it.

CPU storages are copied into fresh host memory. CUDA storages go through the
process's pinned ``"snapshot"`` slab (:func:`pyfastensor._device.slab`), allocated
at the size the state needs, up to ``PYFASTENSOR_SNAPSHOT_POOL`` bytes (default:
an eighth of the machine's memory), and kept for the next saves:

- a state whose CUDA storages fit is copied into the slab on a side stream,
  one device-to-host copy per storage, each on its own pages. The call does
  not wait for the copies: the current stream does (so later kernels cannot
  change or free what is being copied), and the background write waits for
  their events (:meth:`Snapshot.wait`) before writing the slab as a plain save
  does. The caller's thread never synchronizes with the device. Pinned memory:
  the state's CUDA bytes rounded up to a power of two, held until the write ends
  (one snapshot at a time; a second ``async_save`` waits for the slab).
- a larger one goes in waves: the slab is cut into ring slots and the state
  written through them as :func:`pyfastensor.save` writes a CUDA state
  (:class:`~._from_device.Drain`), on the caller's thread until the last
  slots are filled; the background write writes those and commits. The call
  then takes about as long as writing the part of the state beyond the
  slab's half. Host memory used: the slab, never the state's size.

Every CUDA call goes through :mod:`pyfastensor._device`'s backend, so the tests
drive this on CPU with a fake one (tests/test_checkpoint_async_cuda.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _device, _torch, config
from . import _from_device
from ._skeleton import Skeleton
from ._staged import StagedSave
from .save import torch_archive, write_skeleton


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
        self.drain: _from_device.Drain | None = None  # the waves' ring
        #: Times the slab was filled: 0 (nothing on a device), 1 (it fitted), or more (waves).
        self.waves = 0

    def wait(self) -> None:
        """Block until every copy into the slab has landed."""
        for e in self.events:
            e.synchronize()
        self.events = []

    def write(self) -> None:
        """Write the checkpoint and commit it."""
        if self.staged is None:
            self.wait()
            write_skeleton(self.skeleton, self.path, durable=self.durable, engine=self.engine, progress=False)
            return
        assert self.drain is not None
        self.drain.finish()
        self.staged.commit()

    def release(self) -> None:
        """Give the slab back and drop a save not committed (its temporary file). Idempotent."""
        if self.staged is not None:
            self.staged.close()  # a no-op once committed
        slab, self.slab = self.slab, None
        if slab is not None:
            try:
                self.wait()
                if self.drain is not None:
                    self.drain.wait()  # no copy may still be landing in a slab another save gets
            finally:
                slab.release()


def snapshot(skel: Skeleton, path: str, *, durable: bool = True, engine: str | None = None) -> Snapshot:
    """Copy every storage of ``skel`` for a save to ``path`` (see the module docstring)."""
    copies: dict[str, torch.UntypedStorage] = {}
    device: list[tuple[str, torch.UntypedStorage]] = []
    for key, storage in skel.storages.items():
        if _from_device.on_device(storage):
            device.append((key, storage))
        else:
            staged = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
            staged.copy_(storage)
            copies[key] = staged
    snap = Snapshot(Skeleton(skel.data, copies), path, durable, engine)
    if not device:
        return snap
    b = _device.backend()
    slab = _device.slab(b, "snapshot")
    need = sum(_padded(s.nbytes()) for _, s in device)
    fits = need <= slab.nbytes
    buf = slab.acquire(need if fits else None)
    snap.slab = slab
    try:
        if fits:
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


def _into_slab(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
               snap: Snapshot) -> None:
    """Copy the device storages into ``buf`` (the slab, at offset 0), one after another, on a
    side stream per device that waits for the device's current stream (the values as of now)."""
    sides: dict[torch.device, Any] = {}
    for _, s in device:
        if s.device not in sides:
            sides[s.device] = b.side_stream(s.device)
            sides[s.device].wait_stream(b.current_stream(s.device))
    whole = buf.untyped_storage()
    off = 0
    for key, s in device:
        n = s.nbytes()
        with b.use(sides[s.device]):
            b.copy(buf[off:off + n], _from_device.bytes_of(s))
        snap.skeleton.storages[key] = whole[off:off + n]
        off += _padded(n)
    for d, side in sides.items():
        ev = b.event()
        ev.record(side)
        snap.events.append(ev)
        b.current_stream(d).wait_stream(side)  # later kernels wait for the copies
    snap.waves = 1


def _in_waves(b: _device.Backend, buf: torch.Tensor, device: list[tuple[str, torch.UntypedStorage]],
              skel: Skeleton, snap: Snapshot) -> None:
    """Begin a staged save and put the device storages through ``buf`` cut into ring slots,
    writing all but the last slots (left in :attr:`Snapshot.drain` for :meth:`Snapshot.write`)."""
    on_device = {k for k, _ in device}
    every = {k: s if k in on_device else snap.skeleton.storages[k] for k, s in skel.storages.items()}
    # Every storage not staged is a CPU copy, which snap.skeleton holds until the commit reads it
    # (torch_archive copies none: its owners list is empty); the staged save holds the pickle.
    archive, owners, _ = torch_archive(Skeleton(skel.data, every), staged=on_device)
    assert not owners
    snap.staged = StagedSave(snap.path, archive, [k in on_device for k in archive.keys],
                             durable=snap.durable, engine=snap.engine, crc32=_torch.crc32_on_save())
    drain = snap.drain = _from_device.Drain(b, snap.staged, buf, config.PINNED_RING_SLOTS)
    for i, key in enumerate(archive.keys):
        if key in on_device:
            drain.put(i, _from_device.bytes_of(skel.storages[key]))
    drain.hold_compute()
    snap.waves = -(-drain.slots_filled // config.PINNED_RING_SLOTS)

"""Writing storages that live on a CUDA device: device-to-host copies through a pinned ring,
pipelined with the writes.

A save of CUDA storages (:func:`pyfastensor.save`, and an ``async_save`` whose
state is larger than its snapshot budget) never copies the whole state to the
host. A :class:`Drain` cuts a pinned buffer into :data:`~pyfastensor.config.PINNED_RING_SLOTS`
slots (:class:`pyfastensor._device.Ring`'s geometry) and:

- issues each storage's device-to-host copies into free slots on a side
  stream (small storages packed in one slot, each on its own pages so direct
  I/O writes it in place; a storage larger than a slot in slot-sized
  pieces), an event recorded after each slot's copies;
- when no slot is free, writes the oldest filled slots, half the ring, to
  the file in one native call (:meth:`StagedSave.write_parts`: parallel
  pieces, as a whole save's), once their events have completed; those slots
  are then free, and the copies into them run while the other half is
  written.

PCIe moves a slot many times faster than a disk writes it, so after the
first slot the disk is never idle waiting for a copy, and a copy never
waits for more than half the ring to be written. Host memory: the ring,
whatever the state's size.

The side stream waits for the device's current stream first, so the copies
read the values as of the call. Every CUDA call goes through
:mod:`pyfastensor._device`'s backend: the tests drive this on CPU with a fake
one (tests/cuda_fakes.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import _device, config
from ._staged import StagedSave


def on_device(storage: torch.UntypedStorage) -> bool:
    """Whether a storage is written through the pinned ring: a CUDA one (the tests patch this to
    stage chosen CPU storages through the fake backend)."""
    return storage.device.type == "cuda"


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over ``storage``, on its device."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _Slot:
    """A ring slot being filled or written: its parts ``(storage index, offset, slice)``, the
    streams its copies run on, and their events once all are issued."""

    __slots__ = ("buf", "events", "fill", "parts", "streams")

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf
        self.parts: list[tuple[int, int, torch.Tensor]] = []
        self.streams: list[Any] = []
        self.events: list[Any] = []
        self.fill = 0


class Drain:
    """Device bytes written to a :class:`StagedSave` through a pinned buffer cut into ring
    slots (see the module docstring). Not safe for concurrent use; :meth:`put` and :meth:`finish`
    may run on different threads one after the other (an ``async_save``'s caller, then its
    background write).

    Args:
        backend: the CUDA calls.
        staged: the save the storages' bytes go to.
        buf: the pinned buffer (a held slab), cut into ``slots`` slots.
        slots: how many.
        done: called with the bytes of each native write, after it.
    """

    def __init__(self, backend: _device.Backend, staged: StagedSave, buf: torch.Tensor, slots: int,
                 done: Callable[[int], None] | None = None) -> None:
        self.b, self.staged, self.done = backend, staged, done
        ring = _device.Ring(buf, slots)
        self.slot_bytes, self.align = ring.slot_bytes, ring.align
        self.free: deque[_Slot] = deque(_Slot(s) for s in ring.slots)
        self.filled: deque[_Slot] = deque()  # copies issued, oldest first
        self.open: _Slot | None = None  # being packed with small storages
        self.sides: dict[torch.device, Any] = {}
        self.batch = max(1, slots // 2)
        #: Slots filled so far (each one device-to-host copy or several packed ones).
        self.slots_filled = 0
        #: Native write calls so far.
        self.writes = 0

    def _side(self, device: torch.device) -> Any:
        s = self.sides.get(device)
        if s is None:
            s = self.sides[device] = self.b.side_stream(device)
            s.wait_stream(self.b.current_stream(device))  # the values as of now
        return s

    def put(self, index: int, src: torch.Tensor) -> None:
        """Copy ``src``, the flat uint8 bytes on their device of staged item ``index`` (a storage,
        by its place in the archive's keys, or a safetensors file's tensor) into the ring, writing
        older slots to make room as needed."""
        n = src.numel()
        if not n:
            return
        side = self._side(src.device)
        if n <= self.slot_bytes:
            slot = self.open
            at = 0 if slot is None else -(-slot.fill // self.align) * self.align  # own pages: direct I/O in place
            if slot is None or at + n > self.slot_bytes:
                self._close()
                slot, at = self._take(), 0
                self.open = slot
            self._copy(slot, side, at, index, 0, src)
            slot.fill = at + n
            return
        self._close()
        for lo in range(0, n, self.slot_bytes):
            slot = self._take()
            self._copy(slot, side, 0, index, lo, src[lo:lo + min(self.slot_bytes, n - lo)])
            self._seal(slot)

    def _copy(self, slot: _Slot, side: Any, at: int, index: int, offset: int, src: torch.Tensor) -> None:
        dst = slot.buf[at:at + src.numel()]
        with self.b.use(side):
            self.b.copy(dst, src)
        slot.parts.append((index, offset, dst))
        if not any(s is side for s in slot.streams):
            slot.streams.append(side)

    def _seal(self, slot: _Slot) -> None:
        """The slot's copies are all issued: record their events, queue it for writing."""
        for side in slot.streams:
            ev = self.b.event()
            ev.record(side)
            slot.events.append(ev)
        self.filled.append(slot)
        self.slots_filled += 1

    def _close(self) -> None:
        if self.open is not None:
            self._seal(self.open)
            self.open = None

    def _take(self) -> _Slot:
        if not self.free:
            self.settle(self.batch)
        return self.free.popleft()

    def settle(self, count: int) -> None:
        """Write the ``count`` oldest filled slots (fewer if fewer are filled) in one call, once
        their copies have landed; they are free again after."""
        slots = [self.filled.popleft() for _ in range(min(count, len(self.filled)))]
        parts = []
        for slot in slots:
            for ev in slot.events:
                ev.synchronize()
            parts += [(i, off, t.data_ptr(), t.numel()) for i, off, t in slot.parts]
        self.staged.write_parts(parts)
        self.writes += 1
        if self.done is not None:
            self.done(sum(p[3] for p in parts))
        for slot in slots:
            slot.parts, slot.streams, slot.events, slot.fill = [], [], [], 0
            self.free.append(slot)

    def hold_compute(self) -> None:
        """Later kernels on the devices' current streams wait for the copies issued so far (they
        read memory those kernels could change or free)."""
        for d, side in self.sides.items():
            self.b.current_stream(d).wait_stream(side)

    def finish(self) -> None:
        """Write every slot still in the ring."""
        self._close()
        while self.filled:
            self.settle(self.batch)

    def wait(self) -> None:
        """Block until every copy issued has landed (the ring may then be reused elsewhere)."""
        for side in self.sides.values():
            side.synchronize()


def drain_into(backend: _device.Backend, staged: StagedSave, items: Iterable[tuple[int, torch.Tensor]],
               done: Callable[[int], None] | None = None) -> None:
    """Copy ``items`` (``(index, flat uint8 bytes on their device)``) into ``staged`` through the
    process's pinned ``"save"`` ring (:class:`Drain`), then commit it. On any failure the copies
    in flight are waited for (none may land in the slab once its next user has it) and the save
    is aborted: its temporary file goes, the target is untouched."""
    try:
        with _device.slab(backend, "save").hold() as buf:
            drain = Drain(backend, staged, buf, config.PINNED_RING_SLOTS, done=done)
            try:
                for i, src in items:
                    drain.put(i, src)
                drain.finish()
            except BaseException:
                drain.wait()
                raise
        staged.commit()
    except BaseException:
        staged.close()
        raise

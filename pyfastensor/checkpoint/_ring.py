"""The pinned ring's pipeline of a load to CUDA: records read from a file into pinned slots by
one native read, each slot copied to the device on a side stream, then read into again.

The load is planned as fills, each a slot's worth: small records share a slot; records larger
than a slot go in slot-sized pieces, a fill each; each part lies in its slot as its bytes lie in
the file relative to a page, so O_DIRECT reads land in place. One native read (:class:`~pyfastensor.checkpoint._native.RingRead`) reads every fill, slot
after slot, its requests in flight across fills as in a read of the whole file (so the disk never
waits for a slot's last pieces); a fill starts landing in its slot only once the copy of the fill
before it there has completed. The calling thread takes the fills in order, runs each slot's
host-to-device copies on a side stream, and releases the slot once their event has completed (a
copy runs at PCIe speed, far ahead of the disk). Records of a zip archive
(:mod:`pyfastensor.checkpoint._cuda`) and tensors of a safetensors file
(:func:`pyfastensor.safetensors.load_file`) come this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _device
from ._native import RingRead

#: Starts the native read of a plan: ``(slot addresses, slot bytes, each fill's slot, parts
#: (fill, record, offset in the record, bytes, offset in the slot))``.
Start = Callable[[list[int], int, list[int], list[tuple[int, int, int, int, int]]], RingRead]


def upload(ring: _device.Ring, backend: _device.Backend, records: list[tuple[int, int, torch.Tensor]],
           start: Start, done: Callable[[int], None] | None = None) -> None:
    """Fill device memory through ``ring``: ``records`` holds ``(record, its bytes' file offset,
    uint8 device tensor of its size)`` in file order (a record is whatever ``start`` reads by
    that number: an archive's entry index, a file offset); ``done`` is called with the bytes of
    each fill as it lands.
    Returns once every copy has been issued on its device's side stream; the current streams
    wait for them. Errors of the read (a corrupt record, a short file) are raised here, after
    every read and copy in flight has ended."""
    _Upload(ring, backend, start, done or (lambda n: None)).run(records)


class _Upload:
    """One load's pipeline (see :func:`upload`)."""

    def __init__(self, ring: _device.Ring, backend: _device.Backend, start: Start,
                 done: Callable[[int], None]) -> None:
        self.ring, self.b, self.start, self.done = ring, backend, start, done
        self.streams: dict[torch.device, Any] = {}

    def plan(self, records: list[tuple[int, int, torch.Tensor]]) -> tuple[
            list[int], list[tuple[int, int, int, int, int]], list[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """The fills of ``records`` (in file order): each fill's slot (in turn), the parts
        ``(fill, record, offset in the record, bytes, offset in the slot)``, and each fill's
        copies ``(device destination, slice of the slot)``. Records that fit share a slot;
        larger ones go in slot-sized pieces, a fill each. Every part starts in its slot at the
        offset its bytes have in the file, modulo the memory alignment (slots start on it), so
        O_DIRECT moves the aligned middle of each in place, not through a bounce buffer: on a
        page of its own for our files, whose records are page-aligned."""
        slot_bytes, align, slots = self.ring.slot_bytes, self.ring.align, self.ring.slots
        fill_slots: list[int] = []
        parts: list[tuple[int, int, int, int, int]] = []
        copies: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        at = slot_bytes  # no fill open

        def open_fill() -> torch.Tensor:
            fill_slots.append(len(fill_slots) % len(slots))
            copies.append([])
            return slots[fill_slots[-1]]

        for i, pos, t in records:
            n = t.numel()
            if n == 0:
                continue
            if n + pos % align > slot_bytes:
                lo = 0
                while lo < n:  # the first piece ends on a slot's end: the others start aligned
                    at = (pos + lo) % align
                    m = min(slot_bytes - at, n - lo)
                    slot = open_fill()
                    copies[-1].append((t[lo:lo + m], slot[at:at + m]))
                    parts.append((len(copies) - 1, i, lo, m, at))
                    lo += m
                at = slot_bytes
                continue
            at += (pos - at) % align  # the first offset from here that is pos modulo align
            if at + n > slot_bytes:
                open_fill()
                at = pos % align
            copies[-1].append((t, slots[fill_slots[-1]][at:at + n]))
            parts.append((len(copies) - 1, i, 0, n, at))
            at += n
        return fill_slots, parts, copies

    def run(self, records: list[tuple[int, int, torch.Tensor]]) -> None:
        fill_slots, parts, copies = self.plan(records)
        nbytes = [0] * len(fill_slots)
        for k, _, _, n, _ in parts:
            nbytes[k] += n
        self.ring.drain()  # no copy of an earlier user still reads a slot
        held: tuple[int, Any] | None = None  # the fill whose copy runs, and its event
        try:
            with self.start([s.data_ptr() for s in self.ring.slots], self.ring.slot_bytes, fill_slots,
                            parts) as reads:
                while True:
                    release = -1
                    if held is not None:
                        (release, event), held = held, None
                        event.synchronize()
                    k = reads.next(release)
                    if k < 0:
                        break
                    self.done(nbytes[k])
                    held = (k, self._upload(copies[k]))
        finally:
            if held is not None:  # a failure: no copy may outlive the load's hold on the ring
                held[1].synchronize()
        for device, side in self.streams.items():  # the user's stream sees the copies
            self.b.current_stream(device).wait_stream(side)

    def _side(self, device: torch.device) -> Any:
        s = self.streams.get(device)
        if s is None:
            s = self.streams[device] = self.b.side_stream(device)
            s.wait_stream(self.b.current_stream(device))  # the allocations are made on it
        return s

    def _upload(self, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """Copy ``(device destination, slice of the slot)`` pairs on their devices' side streams;
        return the event (or events, as one) that completes once the slot may be read into again."""
        devices: list[torch.device] = []
        for dst, src in copies:
            with self.b.use(self._side(dst.device)):
                self.b.copy(dst, src)
            if dst.device not in devices:
                devices.append(dst.device)
        events = []
        for device in devices:
            ev = self.b.event()
            ev.record(self._side(device))
            events.append(ev)
        return events[0] if len(events) == 1 else _AllOf(events)


class _AllOf:
    """Events of several streams as one: complete when all are."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def query(self) -> bool:
        return all(e.query() for e in self.events)

    def synchronize(self) -> None:
        for e in self.events:
            e.synchronize()

"""The writes an offload step has in flight: completion, backpressure, full disks."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NoSpaceError
from ._profile import Recorder
from ._saved import Entry, Held, Meter
from ._staging import Staging
from ._store import SpillStore


class Writes:
    """An offload object's writes in flight, and what a full disk does.

    ``pending`` maps a slot to its entry's :class:`~._saved.Held` until its
    write is settled: seen done (the payload's memory goes) or failed on a
    full disk (the payload stays in memory, where unpack finds it). Each
    step gets a new dict (:meth:`new_step`): the finalizers of a step's
    entries release their slots from their own step's.

    Args:
        on_full: ``"warn"`` (warn once per offload object, keep the tensor
            in memory) or ``"raise"`` (raise :class:`~pyfastensor.NoSpaceError`).
        meter: the bytes of saved tensors in memory.
    """

    def __init__(self, on_full: str, meter: Meter) -> None:
        self.on_full = on_full
        self.meter = meter
        self.pending: dict[int, Held] = {}
        self.recorder: Recorder | None = None  # the profiling step's: told each write's measures
        self.full = 0  # full-disk events in this step
        self.late_error: NoSpaceError | None = None  # found by a finalizer, raised at the step's end
        self.warned = False

    def new_step(self) -> None:
        """Start a step: no writes pending, no full disk seen."""
        self.pending = {}
        self.full = 0
        self.late_error = None

    def start(self, store: SpillStore, account: int, entry: Entry, payload: torch.Tensor,
              staging: Staging | None) -> torch.Tensor:
        """Start writing ``entry``'s payload to ``store`` (in ``account``): pending until settled.

        With ``staging``, the payload is first copied to a pinned buffer on
        the staging's side stream; this returns at once, and the store's
        write starts on its own thread once the copy has landed
        (:meth:`SpillStore.put_after`). A finalizer frees the slot when
        autograd drops the entry.

        Returns:
            The payload being written (the pinned copy with staging).

        Raises:
            NoSpaceError: the spill file could not even grow.
        """
        if staging is not None:
            reclaim = self.reclaimer(store)
            payload, landed = staging.to_host(payload, reclaim)
            slot = store.put_after(landed, payload.data_ptr(), payload.numel(), account)
            entry.staging, entry.reclaim = staging, reclaim
        else:
            slot = store.put(payload.data_ptr(), payload.numel(), account)
        entry.held = Held(store, slot, payload, self.meter, self.full_disk_late, host=staging is not None)
        entry.payload_nbytes = payload.numel()
        self.pending[slot] = entry.held
        weakref.finalize(entry, entry.held.release, self.pending)
        return payload

    def reclaimer(self, store: SpillStore) -> Callable[[], bool]:
        """What a sized pinned pool calls for a buffer: settle the oldest write in flight (its
        pinned payload goes), waiting for it; False when none is in flight."""
        def one() -> bool:
            if not self.pending:
                return False
            slot = next(iter(self.pending))
            held = self.pending.pop(slot, None)
            if held is not None:
                self.settle(held, store.wait)
            return True
        return one

    def settle_if_done(self, held: Held) -> None:
        """Before reading ``held`` back: take its write's outcome if the write is over
        (it decides where the bytes come from)."""
        if held.slot not in self.pending:
            return
        try:
            done = held.store.poll(held.slot)
        except NoSpaceError:
            done = True
        if done and self.pending.pop(held.slot, None) is not None:
            self.settle(held, held.store.poll)

    def release(self, entries: list[weakref.ref[Entry]]) -> None:
        """Free the slots of a step's entries now, waiting for their writes (after an exception)."""
        for ref in entries:
            entry = ref()
            if entry is not None and entry.held is not None:
                entry.held.release(self.pending)
        self.pending.clear()

    def drain(self, store: SpillStore | None) -> None:
        """Settle the writes the store has completed."""
        if store is None or not self.pending:
            return
        for slot in store.completed():
            held = self.pending.pop(slot, None)
            if held is not None:
                self.settle(held, store.poll)

    def hold_to_budget(self, store: SpillStore | None, budget: int | None, incoming: int) -> None:
        """Backpressure: make room for ``incoming`` bytes by waiting for the oldest writes.

        Waits while the resident bytes plus the incoming tensor's would
        exceed the budget and writes of device memory are in flight, so the
        budget holds unless one tensor alone exceeds it. A write from a
        pinned host copy (a CUDA tensor's) holds no device memory: waiting
        for it would free none, so pack never waits for one.
        """
        if budget is None or store is None:
            return
        while self.pending and self.meter.now + incoming > budget:
            slot = next((s for s, h in self.pending.items() if not h.host), None)
            if slot is None:
                return
            self.settle(self.pending.pop(slot), store.wait)

    def settle_all(self, store: SpillStore) -> None:
        """Wait for every write in flight."""
        for slot in list(self.pending):
            held = self.pending.pop(slot, None)
            if held is not None:
                self.settle(held, store.wait)

    def settle(self, held: Held, check: Callable[[int], Any]) -> None:
        """Take a write's outcome (``check(slot)`` raises on a full disk)."""
        try:
            check(held.slot)
        except NoSpaceError as e:
            held.failed = True  # its payload stays in memory, where unpack finds it
            self.full_disk(e)
            return
        if self.recorder is not None:
            self.recorder.measured(held.slot, held.store.slot_info(held.slot))
        held.written()

    def full_disk_late(self, e: NoSpaceError) -> None:
        """A full disk seen when a slot was freed (a finalizer: cannot raise)."""
        if self.on_full == "raise":
            self.full += 1
            # Without its traceback: the frames it holds hold their callers' (a training step's
            # autograd graph, whose C++ nodes hold this object's hooks: a cycle the garbage
            # collector cannot see).
            self.late_error = e.with_traceback(None)
        else:
            self.full_disk(e)

    def raise_late(self) -> None:
        """At the step's end: the full disk a finalizer saw, as :meth:`full_disk` reports it."""
        late, self.late_error = self.late_error, None
        if late is not None:
            self.full_disk(late)

    def full_disk(self, e: NoSpaceError) -> None:
        """A full spill filesystem: raise, or warn once, as ``on_full`` says."""
        self.full += 1
        msg = (f"pyfastensor.offload: the spill filesystem is full ({e}); the tensor stays in memory. "
               "Point spill_dir at a larger filesystem, or lower what is offloaded.")
        if self.on_full == "raise":
            raise NoSpaceError(msg + " (on_full='warn' keeps training instead of raising)") from e
        if not self.warned:
            self.warned = True
            warnings.warn(msg + " Warned once per offload object.", RuntimeWarning, stacklevel=3)

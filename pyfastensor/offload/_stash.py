"""The forward stash: the GPU sources of the last saved tensors packed, kept for backward.

Backward unpacks in about the reverse of the pack order: the tensors packed
last are needed first, right after forward. Under ``tier="host"`` a CUDA
tensor's device-to-host copy is issued at pack as always, but its GPU
source is also kept here, up to a byte bound, the oldest let go first as
new ones come in. An unpack of a tensor still here gets the GPU source
itself: no host-to-device copy, no wait. Its pinned copy is let go then
(the pool reuses it once its copy has landed), and the source becomes the
entry's resident copy, freed with the entry when autograd lets it go.

The stash is device memory held because of the offload: its bytes are
counted in the meter (``resident_peak_bytes``, and the prefetch window,
which is why prefetching and the stash together stay within the window).
It is cleared at the end of each backward (a callback queued on the
autograd engine at the first unpack) and when the context exits.

Only lossless payloads are stashed (no ``"fp16"`` codec): the GPU source
is then bit for bit what the pinned copy would bring back.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict

import torch

from .. import _torch
from ._saved import Entry, Meter


class Stash:
    """GPU sources of the last packed entries, at most :meth:`bound` bytes.

    Args:
        limit: the bound in bytes; None: twice the largest tensor packed so
            far (the default prefetch window), capped by ``budget``.
        budget: the offload's ``budget`` (None: none).
        meter: counts the stashed bytes as device memory held.
    """

    def __init__(self, limit: int | None, budget: int | None, meter: Meter) -> None:
        self.limit, self.budget, self.meter = limit, budget, meter
        self._lock = threading.RLock()  # an entry dying under it calls back into _gone
        self._held: OrderedDict[int, tuple[weakref.ref[Entry], int]] = OrderedDict()  # oldest first
        self._keys = itertools.count()
        self.bytes = 0  # stashed now
        self.largest = 0  # the largest tensor offered, over the object's steps
        self._armed = False  # a clear is queued for the end of the running backward

    def bound(self) -> int:
        """The bytes the stash may hold now."""
        n = self.limit if self.limit is not None else 2 * self.largest
        return n if self.budget is None else min(n, self.budget)

    def put(self, entry: Entry, source: torch.Tensor) -> bool:
        """Keep ``source`` (the entry's GPU storage, as bytes) on ``entry``, evicting the oldest
        entries to stay within the bound; False (nothing kept) when it alone exceeds it."""
        n = entry.nbytes
        with self._lock:
            self.largest = max(self.largest, n)
            bound = self.bound()
            if n == 0 or n > bound:
                return False
            while self.bytes + n > bound:
                self._evict_oldest()
            key = next(self._keys)
            self._held[key] = (weakref.ref(entry, lambda _, k=key: self._gone(k)), n)
            self.bytes += n
            entry.stashed = (key, source)
        self.meter.add(n)
        return True

    def take(self, entry: Entry) -> int:
        """At unpack: if ``entry``'s source is stashed, make it the entry's resident copy and let
        its pinned copy go; return the bytes served (0: not stashed)."""
        with self._lock:
            if entry.stashed is None:
                return 0
            (key, source), entry.stashed = entry.stashed, None
            if self._held.pop(key, None) is None:
                return 0
            n = entry.nbytes
            self.bytes -= n
        entry.resident = source
        entry.hosted = None  # the pinned copy: back to the pool once its copy has landed
        entry.prefetched = None
        weakref.finalize(entry, self.meter.sub, n)  # the meter keeps counting it until the entry goes
        return n

    def arm(self) -> None:
        """Clear the stash when the running backward ends (outside backward: nothing to do)."""
        with self._lock:
            if self._armed or not self._held:
                return
            self._armed = True
        try:
            _torch.queue_backward_callback(self.clear)
        except RuntimeError:  # not inside backward (a saved tensor unpacked by hand)
            with self._lock:
                self._armed = False

    def clear(self) -> None:
        """Let every stashed source go (the pinned copies stay: they serve later unpacks)."""
        with self._lock:
            self._armed = False
            while self._held:
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, (ref, n) = self._held.popitem(last=False)
        self.bytes -= n
        entry = ref()
        if entry is not None:
            entry.stashed = None
        self.meter.sub(n)

    def _gone(self, key: int) -> None:
        """An entry died while stashed (its graph was freed): its source went with it."""
        with self._lock:
            item = self._held.pop(key, None)
            if item is None:
                return
            self.bytes -= item[1]
        self.meter.sub(item[1])

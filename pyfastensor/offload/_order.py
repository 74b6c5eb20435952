"""The unpack order of the profiling step, and prefetching along it.

The first step records the order in which backward unpacks the stored
entries (by their pack index), without assuming it is the reverse of the
packing order. Later steps with the same number of stored entries prefetch
along that order, issuing a prefetch only while the saved tensors in memory
(restored ones in use, prefetched ones waiting) plus the next stay within
``window`` bytes, except that with nothing in memory the next one always
goes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from ._saved import Entry


class Prefetcher:
    """Prefetches along a recorded unpack order within a byte window."""

    def __init__(self, order: list[int], window: int, resident: Callable[[], int]) -> None:
        self.order = order
        self.position = {index: p for p, index in enumerate(order)}
        self.window = window
        self.resident = resident  # bytes of saved tensors in memory now (prefetches included)
        self.cursor = 0
        self.outstanding: dict[int, int] = {}  # pack index -> bytes prefetched, not yet unpacked

    def unpacked(self, entry: Entry, entries: list[weakref.ref[Entry]],
                 issue: Callable[[Entry], int]) -> None:
        """Note that ``entry`` was unpacked and prefetch what follows it."""
        self.outstanding.pop(entry.index, None)
        p = self.position.get(entry.index)
        if p is not None:
            self.cursor = max(self.cursor, p + 1)
        self.ahead(entries, issue)

    def ahead(self, entries: list[weakref.ref[Entry]], issue: Callable[[Entry], int]) -> None:
        """Prefetch from the cursor on while the window allows (also before the first unpack)."""
        while self.cursor < len(self.order):
            index = self.order[self.cursor]
            nxt = entries[index]() if index < len(entries) else None
            if nxt is not None and nxt.enc is not None:
                need = nxt.payload_nbytes
                now = self.resident()
                if (self.outstanding or now > 0) and now + need > self.window:
                    return
                got = issue(nxt)
                if got:
                    self.outstanding[index] = got
            self.cursor += 1

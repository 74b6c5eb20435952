"""The unpack order of the profiling step, and prefetching along it.

The first step records the order in which backward unpacks the stored
entries (by their pack index), without assuming it is the reverse of the
packing order. Later steps with the same number of stored entries prefetch
along that order, issuing a prefetch only while the saved tensors in memory
(restored ones in use, prefetched ones waiting) plus the next stay within
``window`` bytes, except that with nothing in memory the next one always
goes. Entries still in the forward stash (:mod:`._stash`) are passed over:
backward uses their device memory as it is.
"""

from __future__ import annotations

import weakref
from collections import deque
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
            if nxt is not None and nxt.enc is not None and nxt.stashed is None:  # stashed: nothing to fetch
                need = nxt.payload_nbytes
                now = self.resident()
                if (self.outstanding or now > 0) and now + need > self.window:
                    return
                got = issue(nxt)
                if got:
                    self.outstanding[index] = got
            self.cursor += 1


class PlannedPrefetcher:
    """Prefetches at the points of a migration plan (``policy="planned"``), within a byte window.

    ``due`` lists ``(position, pack index)``: the prefetch of that entry
    starts when the step reaches ``position`` (the plan's op index; see
    :mod:`._planned`); the ones due at one position go in the order given
    (the first needed first). A due prefetch waits, in order, while the saved
    tensors in memory plus it would exceed ``window`` (something else is
    in memory), and goes at the next point reached once they fit; unpack
    reads anything not prefetched by then itself.
    """

    def __init__(self, due: list[tuple[int, int]], window: int, resident: Callable[[], int]) -> None:
        self.due = sorted(due, key=lambda d: d[0])  # stable: the caller's order within a position
        self.window = window
        self.resident = resident
        self.cursor = 0
        self.queue: deque[int] = deque()
        self.issued: list[int] = []  # pack indices prefetched in this step, in order

    def reached(self, position: int, entries: list[weakref.ref[Entry]], issue: Callable[[Entry], int]) -> None:
        """The step is at ``position``: queue what is due by then and issue what fits."""
        while self.cursor < len(self.due) and self.due[self.cursor][0] <= position:
            self.queue.append(self.due[self.cursor][1])
            self.cursor += 1
        while self.queue:
            index = self.queue[0]
            e = entries[index]() if index < len(entries) else None
            if e is None or e.seen or e.enc is None:
                self.queue.popleft()  # gone, already unpacked, or not stored: nothing to fetch
                continue
            now = self.resident()
            if now > 0 and now + e.payload_nbytes > self.window:
                return
            self.queue.popleft()
            if issue(e):
                self.issued.append(index)

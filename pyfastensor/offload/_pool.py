"""Host buffers for read-backs, reused from step to step.

Every backward reads the offloaded tensors back into host memory. Fresh
memory costs a page fault and a zeroing per page each time (on a virtual
machine that hands freed memory back to its host, a trip to the host as
well), which the compute of the same step pays for. The pool keeps the
page-aligned, huge-page mappings it hands out and gives them out again
once nothing uses them: a buffer is free again when the storage of the
tensor made over it has been freed (so no view of it can still be alive).
O_DIRECT reads land in them without a bounce copy.

What the pool holds is reported (``reserved``): at most the largest set
of read-backs alive at once in a step, which the budget bounds. Between
steps it is not held on to: :meth:`lend_idle` marks the idle mappings
``MADV_FREE``, so the kernel may take their pages back whenever it needs
memory (the forward pass's, above all); pages it did not take are reused
as they are, without a fault, and pages it took come back zeroed on
first touch, as fresh memory would.
"""

from __future__ import annotations

import mmap
import threading

import torch

from .._buffers import aligned_mapping, tensor_over
from .._torch import StorageRef

#: Smaller read-backs come from torch's allocator.
POOL_MIN = 1 << 20


class _Mapping:
    __slots__ = ("m", "used", "user")

    def __init__(self, m: mmap.mmap) -> None:
        self.m = m
        self.user: StorageRef | None = None  # the storage made over it last
        self.used = False  # handed out since the last lend_idle

    def idle(self) -> bool:
        return self.user is None or self.user.expired()


class BufferPool:
    """Reusable read-back buffers, by exact size."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[int, list[_Mapping]] = {}
        self.reserved = 0  # bytes of mappings the pool holds

    def take(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``nbytes``: a free mapping of that size, or a new one."""
        if nbytes < POOL_MIN:
            return torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            maps = self._maps.setdefault(nbytes, [])
            free = next((x for x in maps if x.idle()), None)
            if free is None:
                m = aligned_mapping(nbytes)
                if m is None:  # out of mappings: torch's allocator
                    return torch.empty(nbytes, dtype=torch.uint8)
                free = _Mapping(m)
                maps.append(free)
                self.reserved += nbytes
            t = tensor_over(free.m)
            free.user, free.used = StorageRef(t.untyped_storage()), True
            return t

    def lend_idle(self) -> None:
        """Between steps: drop the idle mappings the last step did not use
        (what the profiling step read, say), and let the kernel reclaim the
        pages of the others (``MADV_FREE``)."""
        advice = getattr(mmap, "MADV_FREE", None)
        with self._lock:
            for nbytes, maps in self._maps.items():
                keep = []
                for x in maps:
                    if x.idle() and not x.used:
                        self.reserved -= nbytes  # unmapped when its last tensor is gone
                        continue
                    if x.idle() and advice is not None:
                        x.m.madvise(advice)
                    x.used = False
                    keep.append(x)
                maps[:] = keep

    def clear(self) -> None:
        """Let go of every mapping (those still in use go with their tensors)."""
        with self._lock:
            self._maps.clear()
            self.reserved = 0

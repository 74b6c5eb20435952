"""The accelerator calls of pyfastensor's CUDA paths, and the pinned host memory they stage through.

Every CUDA call of a load to the device (``checkpoint/_cuda.py``), of an
``async_save`` snapshot and of activation offload goes through a
:class:`Backend`: ``torch.cuda`` by default (:class:`CudaBackend`), a fake
over CPU tensors in the tests (tests/cuda_fakes.py), which is how all of it
is tested on machines without a GPU.

Pinned host memory comes from two kinds of pools, both allocated once and
bounded by ``PYFASTENSOR_PINNED_POOL`` (:func:`pyfastensor.config.pinned_pool`):

- :class:`PinnedSlab`: one buffer, held by one user at a time (a load's
  :class:`Ring`, an ``async_save`` snapshot);
- :class:`PinnedPool`: buffers by exact size, reused once the tensor handed
  out over one has been freed (offloaded activations, whose sizes repeat
  from step to step).

What has run on a GPU: see tests/gpu/README.md.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from . import _lib, _torch, config


def memory_alignment() -> int:
    """The alignment, in bytes, of host memory that direct I/O moves in place, as the Go core
    decides it (``gds.DirectAlign``, reported by ``pft_settings`` as ``memory_alignment``):
    the page size. Records and copies placed in pinned buffers start on it, so O_DIRECT reads
    and writes them without a bounce copy. Read from the native library on first use."""
    return int(_lib.settings()["memory_alignment"])


class Backend(Protocol):
    """The accelerator calls the CUDA paths make (``torch.cuda``'s, by default).

    Streams have ``wait_stream(other)`` and ``wait_event(event)``; events have ``record(stream)``,
    ``query()`` and ``synchronize()``, as torch.cuda's do.
    """

    def side_stream(self, device: torch.device) -> Any: ...
    def current_stream(self, device: torch.device) -> Any: ...
    def use(self, stream: Any) -> Any: ...  # context manager making ``stream`` current
    def event(self) -> Any: ...
    def pinned(self, nbytes: int) -> torch.Tensor: ...  # uint8, page-locked host memory
    def record(self, t: torch.Tensor, stream: Any) -> None: ...  # t.record_stream(stream)
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...  # non-blocking, on the current stream
    def device(self, location: str) -> torch.device: ...  # where a storage mapped to ``location`` goes
    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor: ...  # uint8 device memory


class CudaBackend:
    """:class:`Backend` over ``torch.cuda``."""

    def side_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def event(self) -> Any:
        return torch.cuda.Event()

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def record(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def device(self, location: str) -> torch.device:
        # torch.load's own check and message ("Attempting to deserialize object on CUDA device 3
        # but torch.cuda.device_count() is 1..."), and its choice of index for a bare "cuda".
        device = _torch.validate_device(location, "cuda")
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)


_lock = threading.Lock()
_backend: Backend | None = None


def backend() -> Backend:
    """The backend the CUDA paths use now: :class:`CudaBackend`, unless :func:`using` says otherwise."""
    global _backend
    with _lock:
        if _backend is None:
            _backend = CudaBackend()
        return _backend


@contextlib.contextmanager
def using(b: Backend) -> Iterator[Backend]:
    """Make ``b`` the backend of every CUDA path inside the block (tests: a fake over CPU tensors)."""
    global _backend
    with _lock:
        before, _backend = _backend, b
    try:
        yield b
    finally:
        with _lock:
            _backend = before


class PinnedSlab:
    """``nbytes`` of pinned host memory, allocated on first use and then reused, held by one user at a time.

    Args:
        nbytes: the slab's size; default ``PYFASTENSOR_PINNED_POOL``.
        backend: allocates it; default :func:`backend` at first use.
    """

    def __init__(self, nbytes: int | None = None, backend: Backend | None = None) -> None:
        self.nbytes = config.pinned_pool() if nbytes is None else nbytes
        self._backend = backend
        self._buf: torch.Tensor | None = None
        self._hold = threading.Lock()
        #: How many times the slab was allocated (once, or 0 before first use).
        self.allocations = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[torch.Tensor]:
        """The slab, for the block's duration; other users wait until it ends."""
        buf = self.acquire()
        try:
            yield buf
        finally:
            self.release()

    def acquire(self, want: int | None = None) -> torch.Tensor:
        """The slab, once no other user holds it; give it back with :meth:`release` (from any thread).

        Args:
            want: allocate only this much, grown later up to :attr:`nbytes` as users want more
                (rounded up to a power of two, as torch's caching host allocator rounds pinned
                blocks): an ``async_save`` snapshot sized to the state. Default: all of it.
        """
        self._hold.acquire()
        try:
            size = self.nbytes if want is None else min(self.nbytes, 1 << max(want - 1, 1).bit_length())
            if self._buf is None or self._buf.numel() < size:
                b = self._backend or backend()
                self._buf = None  # the old buffer goes back to the allocator before the new one
                self._buf = b.pinned(size)
                self.allocations += 1
        except BaseException:
            self._hold.release()
            raise
        return self._buf

    def release(self) -> None:
        """Give the slab back (see :meth:`acquire`)."""
        self._hold.release()

    @property
    def held(self) -> bool:
        """Whether a user holds the slab now."""
        return self._hold.locked()


_slabs: weakref.WeakKeyDictionary[Any, dict[str, PinnedSlab]] = weakref.WeakKeyDictionary()


def slab(b: Backend | None = None, purpose: str = "load") -> PinnedSlab:
    """The process's :class:`PinnedSlab` for backend ``b`` (default: :func:`backend`) and
    ``purpose``, one each, so that one never waits for another: ``"load"`` (CUDA loads' ring)
    and ``"save"`` (saves' ring), of ``PYFASTENSOR_PINNED_POOL`` bytes; ``"snapshot"``
    (``async_save`` snapshots, held until their write ends), up to ``PYFASTENSOR_SNAPSHOT_POOL``
    bytes, allocated at the size a snapshot wants (:meth:`PinnedSlab.acquire`)."""
    b = b or backend()
    with _lock:
        by_purpose = _slabs.setdefault(b, {})
        s = by_purpose.get(purpose)
        if s is None:
            size = config.snapshot_pool() if purpose == "snapshot" else None
            s = by_purpose[purpose] = PinnedSlab(size, backend=b)
        return s


class Ring:
    """``slots`` equal slices of a pinned buffer, used in turn: a slot is handed out again only
    once the copy that last used it has completed (its event).

    Args:
        buf: the pinned buffer (a held :class:`PinnedSlab`).
        slots: how many slices.
        align: each slice starts on a multiple of this (O_DIRECT reads land in place).
            Default: :func:`memory_alignment`.
    """

    def __init__(self, buf: torch.Tensor, slots: int, *, align: int | None = None) -> None:
        #: What each slot starts on a multiple of.
        self.align = align or memory_alignment()
        self.slot_bytes = (buf.numel() // slots) // self.align * self.align
        if self.slot_bytes <= 0:
            raise ValueError(f"a pinned buffer of {buf.numel()} bytes cannot hold {slots} slots of {self.align} bytes")
        self.slots = [buf[i * self.slot_bytes:(i + 1) * self.slot_bytes] for i in range(slots)]
        self._events: list[Any] = [None] * slots
        self._next = 0
        #: Times a slot was handed out while its last copy was still running (waited for).
        self.waits = 0

    def take(self) -> tuple[int, torch.Tensor]:
        """The next slot, ``(index, slice)``, once its last copy has completed."""
        i = self._next
        self._next = (i + 1) % len(self.slots)
        ev, self._events[i] = self._events[i], None
        if ev is not None:
            if not ev.query():
                self.waits += 1
            ev.synchronize()
        return i, self.slots[i]

    def used(self, i: int, event: Any) -> None:
        """Slot ``i`` is in use until ``event`` completes."""
        self._events[i] = event

    def drain(self) -> None:
        """Wait for every slot's last copy."""
        for i, ev in enumerate(self._events):
            if ev is not None:
                ev.synchronize()
                self._events[i] = None


class PinnedPool:
    """Pinned host buffers by exact size, reused: activations offloaded step after step have the
    same sizes, so once the pool has grown to a step's need no pinned memory is allocated.

    A buffer is free again when the tensor :meth:`take` made over it, and every view of it,
    have been freed, and the last copy that used it (the event given to :meth:`fence`) has
    completed: :meth:`take` hands out such a buffer, or grows; once sealed (:meth:`seal`), or
    at its limit, it waits for the copy of a free one (counted in :attr:`waits`) rather than
    grow, and once sealed it hands out the start of the smallest larger free buffer before
    asking its caller to reclaim one. The pool holds
    at most ``limit`` bytes; past that, :meth:`take` returns a buffer of the backend's own
    (torch's caching host allocator), counted in :attr:`overflows`.

    Args:
        backend: allocates the buffers.
        limit: bytes the pool may hold; default ``PYFASTENSOR_PINNED_POOL``.
    """

    def __init__(self, backend: Backend, limit: int | None = None) -> None:
        self.backend = backend
        self.limit = config.pinned_pool() if limit is None else limit
        self._lock = threading.Lock()
        self._bufs: dict[int, list[_Pooled]] = {}
        self._by_ptr: dict[int, _Pooled] = {}
        self.reserved = 0  # bytes the pool holds
        self.allocations = 0  # buffers it allocated
        self.overflows = 0  # buffers handed out past the limit
        self.sealed = False  # sized: grow only when nothing can be reclaimed
        self.late = 0  # buffers allocated after seal()
        self.waits = 0  # takes that waited for the last copy of the buffer they got

    def seal(self) -> None:
        """The pool has grown to what a step needs: from now on :meth:`take` asks its
        ``reclaim`` for a buffer before allocating one (counted in :attr:`late`)."""
        self.sealed = True

    def take(self, nbytes: int, reclaim: Callable[[], bool] | None = None) -> torch.Tensor:
        """An uninitialised uint8 pinned tensor of ``nbytes`` (a view of a pooled buffer).

        Args:
            nbytes: its size.
            reclaim: after :meth:`seal`, called while no buffer of that size is free: lets
                one go (waits for a write that reads one, say) and returns True, or returns
                False when nothing can be let go (then the pool grows).
        """
        while True:
            with self._lock:
                bufs = self._bufs.setdefault(nbytes, [])
                idle = [b for b in bufs if b.idle()]
                pick = next((b for b in idle if b.ready()), None)
                if pick is None and idle and (self.sealed or self.reserved + nbytes > self.limit):
                    pick = idle[0]  # its copy is still running: wait for it rather than grow
                if pick is None and self.sealed:  # the smallest larger free buffer, sliced
                    pick = min((x for size, xs in self._bufs.items() if size > nbytes for x in xs
                                if x.idle() and x.ready()), key=lambda x: x.base.numel(), default=None)
                if pick is not None:
                    out = pick.base[:nbytes]  # taken: no longer idle
                    event, pick.event = pick.event, None
                    break
                if not self.sealed or reclaim is None:
                    return self._grow(bufs, nbytes)
            if not reclaim():
                with self._lock:
                    return self._grow(self._bufs[nbytes], nbytes)
        if event is not None:
            self.waits += 1
            event.synchronize()
        return out

    def _grow(self, bufs: list[_Pooled], nbytes: int) -> torch.Tensor:
        if self.reserved + nbytes > self.limit:
            self.overflows += 1
            return self.backend.pinned(nbytes)
        free = _Pooled(self.backend.pinned(nbytes))
        bufs.append(free)
        self._by_ptr[free.storage.data_ptr()] = free
        self.reserved += nbytes
        self.allocations += 1
        self.late += self.sealed
        return free.base[:]

    def fence(self, t: torch.Tensor, event: Any) -> bool:
        """``t`` (taken from the pool) is used by a copy until ``event`` completes: its buffer is
        not handed out again before. Returns False when ``t`` is not the pool's (an overflow)."""
        with self._lock:
            b = self._by_ptr.get(t.untyped_storage().data_ptr())
            if b is None:
                return False
            b.event = event
            return True

    def clear(self) -> None:
        """Let go of every buffer (those still in use go with their tensors)."""
        with self._lock:
            self._bufs.clear()
            self._by_ptr.clear()
            self.reserved = 0


class _Pooled:
    """A pooled buffer: free while nothing but the pool refers to its storage.

    The pool keeps the buffer's tensor and storage objects; each tensor
    handed out (a view) and each view of that adds a reference to the
    storage, so the storage's use count says when all of them are gone.
    (Tensors over the same memory with storages of their own would not do:
    a non-blocking copy from pinned memory records its stream on the
    allocation it came from, which torch finds through the storage.)
    """

    __slots__ = ("base", "baseline", "event", "storage")

    def __init__(self, base: torch.Tensor) -> None:
        self.base = base
        self.storage = base.untyped_storage()
        self.baseline = _torch.storage_use_count(self.storage)
        self.event: Any = None  # the last copy using it (fence), until seen complete

    def idle(self) -> bool:
        return _torch.storage_use_count(self.storage) <= self.baseline

    def ready(self) -> bool:
        """No copy uses it (its last one has completed)."""
        if self.event is not None and self.event.query():
            self.event = None
        return self.event is None

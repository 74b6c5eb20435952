"""Memory for the native library: addresses of Python buffers, and the page-aligned
memory loads read into (kept for reuse once freed, see :class:`FreedPages`)."""

from __future__ import annotations

import bisect
import collections
import ctypes
import mmap
import os
import threading
import warnings
from typing import Any

import numpy as np


def address_of(buf: Any, *, writable: bool) -> tuple[int, int, Any]:
    """Return ``(address, nbytes, keepalive)`` for a contiguous buffer.

    ``buf`` may be a torch tensor, a numpy array, or any object with the
    buffer protocol (bytes, bytearray, memoryview). The caller must hold
    ``keepalive`` until the native call that uses the address returns.

    Raises:
        ValueError: for a non-contiguous buffer, or a read-only one when
            ``writable`` is asked for.
    """
    if type(buf).__module__.startswith("torch") and hasattr(buf, "data_ptr"):
        if not buf.is_contiguous():
            raise ValueError("tensor must be contiguous: call .contiguous() first")
        return buf.data_ptr(), buf.numel() * buf.element_size(), buf
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous: use np.ascontiguousarray first")
    if writable and not arr.flags.writeable:
        raise ValueError("buffer is read-only: pass a bytearray, writable array or tensor")
    return arr.ctypes.data, arr.nbytes, arr




def empty_aligned(nbytes: int) -> Any:
    """Return an uninitialised uint8 tensor of ``nbytes`` in page-aligned pages of its own.

    Loads read into these: O_DIRECT moves straight into page-aligned
    memory (torch's allocator returns addresses 64 bytes past a page,
    which need a bounce copy), and new mappings are advised for
    transparent huge pages, so first touch costs one fault per 2 MiB
    instead of one per 4 KiB and the device gets requests of several MiB.
    The pages are a run some earlier tensor freed (:data:`FREED`), else a
    new mapping. The tensor owns them until its storage is freed; like
    ``torch.load(..., mmap=True)`` storages, its storage cannot be resized.
    """
    import torch  # deferred: `import pyfastensor` does not load torch

    if nbytes <= 0:
        return torch.empty(0, dtype=torch.uint8)
    maplen = -(-nbytes // _PAGE) * _PAGE
    addr = FREED.take(maplen) or _map_pages(maplen)
    if addr is None:  # out of mappings (vm.max_map_count) or address space: torch's allocator
        return torch.empty(nbytes, dtype=torch.uint8)
    return torch.from_numpy(np.asarray(_Pages(addr, nbytes, maplen)))


def aligned_mapping(nbytes: int) -> mmap.mmap | None:
    """An anonymous private mapping of ``nbytes`` (> 0), advised for huge pages; None if refused."""
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    if nbytes >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    return m


def tensor_over(m: mmap.mmap) -> Any:
    """A uint8 tensor over the whole of ``m``; its storage keeps ``m`` alive."""
    import torch

    with warnings.catch_warnings():  # the mapping is writable; torch warns for read-only buffers
        warnings.simplefilter("ignore")
        return torch.frombuffer(m, dtype=torch.uint8)


def empty_bytes(nbytes: int) -> Any:
    """An uninitialised uint8 tensor to read into: :func:`empty_aligned` from the Go core's
    ``aligned_min`` (``transfer.AlignedMin``) up, torch's allocator below."""
    import torch

    from . import _lib

    if nbytes >= _lib.settings()["aligned_min"]:
        return empty_aligned(nbytes)
    return torch.empty(nbytes, dtype=torch.uint8)


_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


_MADV_FREE = getattr(mmap, "MADV_FREE", 8)


def _map_pages(maplen: int) -> int | None:
    """A new anonymous private mapping of ``maplen`` bytes (whole pages), advised for huge
    pages from 2 MiB; None if refused. As much kept memory is unmapped first
    (:meth:`FreedPages.trim`): loads map only where no kept run would do."""
    FREED.trim(maplen)
    addr = _libc.mmap(None, maplen, mmap.PROT_READ | mmap.PROT_WRITE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, _MAP_FAILED):
        return None
    if maplen >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        _libc.madvise(addr, maplen, mmap.MADV_HUGEPAGE)
    return addr


class _Pages:
    """Owner of a run of pages (:func:`empty_aligned`, or a :class:`PageArena`'s), seen by
    numpy as a uint8 array (``__array_interface__``); when it is freed, that is when the
    last tensor over them is, the pages go to :data:`FREED`."""

    def __init__(self, addr: int, nbytes: int, maplen: int) -> None:
        self.__array_interface__ = {"data": (addr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        self._range = (addr, maplen)

    def __del__(self) -> None:
        FREED.give(*self._range)  # unmaps it when not kept


class FreedPages:
    """Page runs of freed loaded tensors, kept for the next load's tensors of the same size.

    A process that loads again (an evaluation over checkpoints, a bench,
    a retry) would otherwise fault every page of new memory in again, where
    torch's allocator hands back the heap its last load freed (a warm
    ResNet-50 load: 7,344 page faults on torch's second load against
    25,051 on its first). Runs of :attr:`min_run` bytes and up are kept, the
    oldest unmapped first past ``limit`` bytes; each is advised
    ``MADV_FREE``, so under memory pressure the kernel takes its pages back
    without writing them anywhere (a reuse then faults in zeroed pages: the
    run's bytes are overwritten anyway). ``pyfastensor.empty_cache()``
    unmaps them all.

    A free never waits: when another thread holds the lock (or the free
    happens inside :meth:`take`), the run is unmapped instead.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._min: int | None = None
        self._lock = threading.Lock()
        self._by_len: dict[int, list[int]] = {}  # run length -> addresses, most recent last
        self._order: collections.OrderedDict[int, int] = collections.OrderedDict()  # address -> length, oldest first
        #: Bytes kept now.
        self.nbytes = 0

    @property
    def limit(self) -> int:
        """Most bytes kept: ``PYFASTENSOR_KEEP_FREED`` unless set here (read once)."""
        if self._limit is None:
            from .config import keep_freed

            self._limit = keep_freed()
        return self._limit

    @property
    def min_run(self) -> int:
        """Runs under this are unmapped at once: the Go core's ``aligned_min``
        (``transfer.AlignedMin``), below which loads give records torch's memory."""
        if self._min is None:
            from . import _lib

            self._min = int(_lib.settings()["aligned_min"])
        return self._min

    def give(self, addr: int, maplen: int) -> None:
        """Keep the run ``[addr, addr + maplen)`` for reuse, or unmap it."""
        try:
            limit = self.limit
        except ValueError:  # a malformed setting: load's take() reports it
            limit = 0
        if maplen > limit or maplen < self.min_run or not self._lock.acquire(blocking=False):
            _libc.munmap(addr, maplen)
            return
        try:
            self._unmap_oldest(self.nbytes + maplen - limit)
            _libc.madvise(addr, maplen, _MADV_FREE)
            self._by_len.setdefault(maplen, []).append(addr)
            self._order[addr] = maplen
            self.nbytes += maplen
        finally:
            self._lock.release()

    def take(self, maplen: int) -> int | None:
        """The address of a kept run of exactly ``maplen`` bytes, now the caller's; None if none.

        Raises:
            ValueError: ``PYFASTENSOR_KEEP_FREED`` is not a size (read on first use).
        """
        if not self.limit or not self._by_len.get(maplen) or not self._lock.acquire(blocking=False):
            return None
        try:
            runs = self._by_len.get(maplen)
            if not runs:
                return None
            addr = runs.pop()
            del self._order[addr]
            self.nbytes -= maplen
            return addr
        finally:
            self._lock.release()

    def trim(self, nbytes: int) -> None:
        """Unmap the oldest kept runs, ``nbytes`` of them or more (all when fewer are kept).

        A load that maps new memory, because no kept run has its length
        (a cold load's arena never has), gives back as much: what is kept
        then stays what the last loads freed beyond what later ones took,
        instead of filling up to :attr:`limit` in a process whose loads
        never reuse it.
        """
        if not self.nbytes or not self._lock.acquire(blocking=False):
            return
        try:
            self._unmap_oldest(nbytes)
        finally:
            self._lock.release()

    def release(self) -> int:
        """Unmap every kept run; return the bytes released."""
        with self._lock:
            return self._unmap_oldest(self.nbytes)

    def _unmap_oldest(self, nbytes: int) -> int:  # lock held
        """Unmap the oldest runs until ``nbytes`` or more are released (or none is left);
        return the bytes released."""
        released = 0
        while self._order and released < nbytes:
            addr, maplen = self._order.popitem(last=False)
            runs = self._by_len[maplen]
            runs.remove(addr)
            if not runs:
                del self._by_len[maplen]
            self.nbytes -= maplen
            released += maplen
            _libc.munmap(addr, maplen)
        return released


#: The process's kept runs (:class:`FreedPages`).
FREED = FreedPages()


def empty_cache() -> int:
    """Release the host memory the library keeps for reuse, as :func:`torch.cuda.empty_cache`
    does for CUDA memory.

    :func:`pyfastensor.load` puts records of 1 MiB and up in page-aligned
    memory of their own; when such a tensor is freed its pages are kept,
    up to ``PYFASTENSOR_KEEP_FREED`` bytes (default 1G, or an eighth of
    the machine's memory if less), for the next load, as glibc keeps the
    heap torch's allocator takes from (see :class:`FreedPages`). Saves and
    O_DIRECT transfers of unaligned memory keep up to 256 MiB of bounce
    buffers, and the native core's heap keeps pages it freed (a host-tier
    offload's slots). The kernel may take the freed pages back under memory
    pressure anyway; this releases all of them now (the native library is
    loaded for it only where it is already).

    Returns:
        The bytes released: freed tensors' pages and bounce buffers.
    """
    from . import _lib

    released = FREED.release()
    if _lib.loaded():
        released += _lib.release_idle()
    return released


class PageArena:
    """One anonymous, page-aligned mapping (huge pages where the kernel allows)
    whose page runs are handed to tensors that then own them.

    A cold load reads a whole file into one, then gives each large record's
    pages (``[offset, offset + nbytes)`` rounded out to pages, which records
    starting on page boundaries never share) to the record's tensor:
    tensors are freed one by one as with torch's allocator, with no copy
    and one huge-page fault per 2 MiB. :meth:`close` unmaps every page not
    handed out.

    Raises:
        OSError: the kernel refused the mapping.
    """

    def __init__(self, nbytes: int) -> None:
        #: Bytes asked for; :attr:`size` is that rounded up to pages.
        self.nbytes = nbytes
        self.size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        addr = _map_pages(self.size)
        if addr is None:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map {self.size} bytes: {os.strerror(err)}")
        self.addr: int = addr
        self._given: list[tuple[int, int]] = []  # page runs handed out, [lo, hi) offsets, sorted
        self._closed = False

    @classmethod
    def adopt(cls, addr: int, nbytes: int) -> PageArena:
        """The arena over an anonymous mapping made elsewhere (the Go core reads a cold file
        whole into one): ``nbytes`` at ``addr``, rounded up to pages, owned from now on."""
        self = cls.__new__(cls)
        self.nbytes = nbytes
        self.size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        self.addr = addr
        self._given = []
        self._closed = False
        FREED.trim(self.size)  # as a mapping of our own would, the kept runs give way to it
        return self

    def take(self, offset: int, nbytes: int) -> Any:
        """A uint8 tensor of ``nbytes`` at ``offset`` (a page boundary) that owns its pages from now on."""
        import torch

        hi = -(-(offset + nbytes) // _PAGE) * _PAGE
        i = bisect.bisect(self._given, (offset, hi))
        if (self._closed or offset % _PAGE or nbytes <= 0 or hi > self.size
                or (i and self._given[i - 1][1] > offset) or (i < len(self._given) and self._given[i][0] < hi)):
            raise ValueError(f"cannot hand out {nbytes} bytes at {offset} of a {self.size}-byte arena "
                             "(closed, not on a page boundary, out of range or already handed out)")
        self._given.insert(i, (offset, hi))
        return torch.from_numpy(np.asarray(_Pages(self.addr + offset, nbytes, hi - offset)))

    def close(self) -> None:
        """Unmap every page not handed out (idempotent); tensors handed out keep theirs."""
        if self._closed:
            return
        self._closed = True
        at = 0
        for lo, hi in [*self._given, (self.size, self.size)]:
            if lo > at:
                _libc.munmap(self.addr + at, lo - at)
            at = max(at, hi)

    def __del__(self) -> None:
        self.close()

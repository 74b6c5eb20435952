"""Memory addresses of Python buffers, for handing to the native library."""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
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
    """Return an uninitialised uint8 tensor of ``nbytes`` in its own page-aligned mapping.

    Loads read into these: O_DIRECT moves straight into page-aligned
    memory (torch's allocator returns addresses 64 bytes past a page,
    which need a bounce copy), and the mapping is advised for transparent
    huge pages, so first touch costs one fault per 2 MiB instead of one per
    4 KiB and the device gets requests of several MiB. The tensor owns the
    mapping (unmapped when its storage is freed); like ``torch.load(...,
    mmap=True)`` storages, its storage cannot be resized.
    """
    import torch  # deferred: `import pyfastensor` does not load torch

    m = aligned_mapping(nbytes) if nbytes > 0 else None
    if m is None:  # empty, or out of mappings (vm.max_map_count) or address space: torch's allocator
        return torch.empty(max(nbytes, 0), dtype=torch.uint8)
    return tensor_over(m)


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


class _Pages:
    """Owner of a run of pages of a :class:`PageArena`, seen by numpy as a uint8
    array (``__array_interface__``); the pages are unmapped when it is freed,
    that is when the last tensor over them is."""

    def __init__(self, addr: int, nbytes: int, maplen: int) -> None:
        self.__array_interface__ = {"data": (addr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        self._range = (addr, maplen)

    def __del__(self) -> None:
        _libc.munmap(*self._range)


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
        addr = _libc.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map {self.size} bytes: {os.strerror(err)}")
        self.addr: int = addr
        if self.size >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
            _libc.madvise(addr, self.size, mmap.MADV_HUGEPAGE)
        self._given: list[tuple[int, int]] = []  # page runs handed out, [lo, hi) offsets, sorted
        self._closed = False

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

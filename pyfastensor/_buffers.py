"""Memory addresses of Python buffers, for handing to the native library."""

from __future__ import annotations

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

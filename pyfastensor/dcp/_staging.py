"""Device tensors pass through pinned host memory on their way to and from files.

Go moves bytes between files and host memory only (DESIGN.md: device-side work
is torch's). A save copies a wave of device tensors (:func:`waves`, at most
``PYFASTENSOR_DCP_STAGING`` bytes) into pinned host tensors with non-blocking
copies, waits once for all of them, then hands the host copies to Go; a load
reads a wave into pinned host tensors and copies them to the device, waiting
once before the host memory is let go. The wait is on every device a copy
went to or came from (a tensor on ``cuda:1`` while the current device is 0
included). The two hooks, allocation and waiting,
are attributes so that tests fake them on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def waves(items: Sequence[T], staged: Callable[[T], int], bound: int) -> list[list[T]]:
    """``items`` in order, cut into runs whose ``staged`` bytes (what each puts in pinned memory:
    0 for an item that is not staged) add up to at most ``bound``, or are one item's larger
    than ``bound``. No run is empty; no items, no runs."""
    out: list[list[T]] = []
    held = 0  # staged bytes of the last run
    for item in items:
        n = staged(item)
        if not out or (n and held and held + n > bound):
            out.append([])
            held = 0
        out[-1].append(item)
        held += n
    return out


def is_plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory holds its values: not a conj or neg view (whose memory holds the
    conjugate, or the negation, of what reading it gives)."""
    return not (t.is_conj() or t.is_neg())


def _empty_pinned(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def _synchronize(device: torch.device) -> None:
    torch.cuda.synchronize(device)


class Staging:
    """Host copies of device tensors for one save or one load.

    Args:
        empty_pinned: allocates a pinned host tensor (default: ``torch.empty(..., pin_memory=True)``).
        synchronize: waits for the copies issued to or from one device (default:
            ``torch.cuda.synchronize(device)``).

    Not thread-safe: one per ``write_data`` or ``read_data`` call.
    """

    def __init__(
        self,
        empty_pinned: Callable[[torch.Size, torch.dtype], torch.Tensor] = _empty_pinned,
        synchronize: Callable[[torch.device], None] = _synchronize,
    ) -> None:
        self._empty = empty_pinned
        self._sync = synchronize
        self._pending: dict[torch.device, None] = {}  # devices with copies in flight, in order
        self._keep: list[Any] = []

    def on_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives off the host (and so passes through pinned memory)."""
        return t.device.type not in ("cpu", "meta")

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor whose memory holds ``t``'s values: ``t`` itself when it is
        one, a copy of a host view (a conj or neg view resolved: its memory holds other values),
        or a pinned copy of a device tensor (valid after :meth:`wait`)."""
        if t.device.type == "meta":
            raise ValueError("cannot save a tensor on the meta device: it has no data")
        if not self.on_device(t):
            if is_plain(t):
                return t if t.is_contiguous() else t.contiguous()
            return t.resolve_conj().resolve_neg().contiguous()  # a conj/neg view counts as contiguous
        host = self._empty(t.shape, t.dtype)
        host.copy_(t, non_blocking=True)  # resolves a conj or neg view
        self._pending[t.device] = None
        return host

    def host_buffer(self, like: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A host tensor to read into for a destination like ``like``: pinned when ``like``
        is a device tensor."""
        if self.on_device(like):
            return self._empty(shape, dtype)
        return torch.empty(shape, dtype=dtype)

    def copy_to(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy host ``src`` into ``dst`` (into a conj or neg view, what makes reading it give
        ``src``'s values); device copies are asynchronous until :meth:`wait`, and ``src`` is kept
        alive until then."""
        if self.on_device(dst):
            dst.copy_(src, non_blocking=True)
            self._keep.append(src)
            self._pending[dst.device] = None
        else:
            dst.copy_(src)

    def wait(self) -> None:
        """Wait for every copy issued so far, on each device one went to or came from, then let
        the host memory of finished copies go."""
        for device in self._pending:
            self._sync(device)
        self._pending.clear()
        self._keep.clear()

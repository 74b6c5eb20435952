"""Staging of accelerator payloads through pinned host memory, on a side stream.

The spill store moves host memory only. A CUDA payload goes to it as:

- pack: the side stream waits for the compute stream (the payload is
  ready), copies it into a pinned host buffer (a DMA, no CPU copy), and
  records an event; nothing waits for it on the CPU. The payload's memory
  is marked in use on the side stream, so the caching allocator does not
  hand it out before the copy has read it. The host tier keeps that pinned
  buffer as the stored copy; the SSD tier's write starts from it once the
  event completes (on the store's thread);
- unpack: the slot is read into a pinned buffer (SSD tier), or the host
  tier's buffer is used as it is, and copied to the device on the side
  stream; the compute stream waits for that copy's event (not the CPU).
  A prefetch issues the copy early and the compute stream waits for it
  only at unpack (:meth:`Staging.join`).

Pinned buffers come from one :class:`~pyfastensor._device.PinnedPool` per
offload object, grown in its first step to what a step needs and reused in
the next ones; a buffer is handed out again only once the last copy that
used it has completed (its event).

Not run here: the development machine has no GPU. Everything CUDA is
reached through :class:`Backend`, so tests drive this module with a fake
backend on CPU tensors (tests/test_offload_staging.py, tests/test_offload_cuda.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .._device import Backend, CudaBackend, PinnedPool

__all__ = ["Backend", "CudaBackend", "HostBackend", "Staging", "Upload", "default", "for_device"]


class _HostStream:
    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


class _DoneEvent:
    def record(self, stream: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class HostBackend:
    """:class:`Backend` for tensors already in host memory (CPU): copies are synchronous.

    Serves the host tier of ``policy="planned"`` when the saved tensors are
    on the CPU, where "pinned" memory is plain memory and there is no stream.
    """

    def side_stream(self, device: torch.device) -> Any:
        return _HostStream()

    def current_stream(self, device: torch.device) -> Any:
        return _HostStream()

    def use(self, stream: Any) -> Any:
        return contextlib.nullcontext()

    def event(self) -> Any:
        return _DoneEvent()

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def record(self, t: torch.Tensor, stream: Any) -> None:
        pass

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class Upload:
    """A host-to-device copy issued on the side stream: its output, and the event it ends with."""

    __slots__ = ("event", "out")

    def __init__(self, out: torch.Tensor, event: Any) -> None:
        self.out, self.event = out, event


class Staging:
    """Device-to-host and host-to-device copies of payloads for one offload context.

    Host buffers come from :attr:`pool`, a :class:`~pyfastensor._device.PinnedPool`: pinned
    memory allocated once per size and reused (offloaded activations have the same sizes step
    after step), at most ``pool_limit`` bytes of it.

    Args:
        backend: the accelerator calls; default :class:`CudaBackend`.
        pool_limit: bytes the pinned pool may hold; default ``PYFASTENSOR_PINNED_POOL``.
    """

    def __init__(self, backend: Backend | None = None, *, pool_limit: int | None = None) -> None:
        self.backend = backend if backend is not None else CudaBackend()
        self.pool = PinnedPool(self.backend, pool_limit)
        self._streams: dict[torch.device, Any] = {}
        # (event, pinned buffer) of uploads from buffers not the pool's: kept until the copy ends.
        self._inflight: list[tuple[Any, torch.Tensor]] = []

    def _side(self, device: torch.device) -> Any:
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = self.backend.side_stream(device)
        return s

    def to_host(self, payload: torch.Tensor,
                reclaim: Callable[[], bool] | None = None) -> tuple[torch.Tensor, Callable[[], None]]:
        """Start copying ``payload`` (1-D, on the device) into pinned host memory.

        Nothing here waits for the copy: the caller hands ``wait`` to whoever
        reads ``host`` on the CPU (the spill store's background put, :meth:`SpillStore.put_after
        <pyfastensor.offload._store.SpillStore.put_after>`), and the compute
        stream goes on at once. A copy back to the device (:meth:`to_device`)
        is ordered after it on the side stream.

        Args:
            payload: the bytes to copy.
            reclaim: see :meth:`PinnedPool.take <pyfastensor._device.PinnedPool.take>`.

        Returns:
            ``(host, wait)``: the pinned buffer (from :attr:`pool`), and a call
            that blocks until the copy has landed (before anything reads ``host``).
        """
        side = self._side(payload.device)
        side.wait_stream(self.backend.current_stream(payload.device))
        host = self.pool.take(payload.numel() * payload.element_size(), reclaim)
        with self.backend.use(side):
            self.backend.copy(host.view(payload.dtype), payload)
            done = self.backend.event()
            done.record(side)
        self.backend.record(payload, side)
        self.pool.fence(host, done)
        return host, done.synchronize

    def to_device(self, host: torch.Tensor, device: torch.device) -> Upload:
        """Issue the copy of ``host`` (pinned, filled or being filled on the side stream) to
        ``device`` on the side stream; :meth:`join` makes the compute stream wait for it."""
        self._reap()
        side = self._side(device)
        with self.backend.use(side):  # after the side stream's copy into ``host``, if still in flight
            out = self.backend.empty(host.numel() * host.element_size(), device).view(host.dtype)
            self.backend.copy(out, host)
            done = self.backend.event()
            done.record(side)
        if not self.pool.fence(host, done):
            self._inflight.append((done, host))  # not the pool's: the source lives until the copy ends
        return Upload(out, done)

    def join(self, up: Upload, device: torch.device) -> torch.Tensor:
        """The upload's output, for the compute stream: it waits for the copy's event (the CPU
        does not), and the output's memory is marked in use on it."""
        current = self.backend.current_stream(device)
        current.wait_event(up.event)
        self.backend.record(up.out, current)
        return up.out

    def pinned(self, nbytes: int, reclaim: Callable[[], bool] | None = None) -> torch.Tensor:
        """A pinned host buffer (from :attr:`pool`) to read a slot into before :meth:`to_device`."""
        return self.pool.take(nbytes, reclaim)

    def _reap(self) -> None:
        self._inflight = [(e, h) for e, h in self._inflight if not e.query()]

    def close(self) -> None:
        """Wait for uploads in flight from buffers not the pool's and drop them; let go of the pool."""
        for e, _ in self._inflight:
            e.synchronize()
        self._inflight.clear()
        self.pool.clear()


_default: Staging | None = None
_host: Staging | None = None


def default() -> Staging:
    """The process's staging over ``torch.cuda`` (created on first use)."""
    global _default
    if _default is None:
        _default = Staging()
    return _default


def for_device(device: torch.device) -> Staging:
    """The staging for saved tensors on ``device``: :func:`default` for an
    accelerator, a :class:`HostBackend` one for the CPU."""
    global _host
    if device.type != "cpu":
        return default()
    if _host is None:
        _host = Staging(HostBackend())
    return _host

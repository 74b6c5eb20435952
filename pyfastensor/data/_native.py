"""The training-data calls into the Go core (``gofastensor/loader.go`` over ``loader/``).

Pack and verify a directory; a :class:`Server` owns one loader server (a
Go handle) over an opened pack. Nothing here imports torch: a batch's
bytes cross into memory the caller allocated, by address
(:meth:`Server.take`), which the caller keeps alive during the call.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Sequence
from typing import Any

from .. import _lib
from . import _client

#: int64s pft_loader_get writes per sample: position, source, label, length
#: (the local protocol's too: one constant, loader.LocalMetaFields in Go).
META_FIELDS = _client.META_FIELDS

#: A progress pair the native call keeps at (done, total).
Progress = ctypes.c_int64 * 2


def pack(spec: dict[str, Any], out: str | os.PathLike[str], progress: Any = None) -> dict[str, Any]:
    """Pack ``spec`` (``loader.PackSpec`` as a dict) into ``out``; return ``loader.PackStats``."""
    return _lib.call_json("pft_loader_pack", json.dumps(spec).encode(), _lib.cstr(out), progress)


def verify(out: str | os.PathLike[str], progress: Any = None) -> dict[str, Any]:
    """Check every chunk of the pack in ``out``; return the pack's summary."""
    return _lib.call_json("pft_loader_verify", _lib.cstr(out), progress)


class Server(_lib.Handle):
    """A loader server over the pack in a directory, within a memory budget.

    ``summary`` is the pack's description and the server's layout (the
    abstract memory sized from the budget), as ``pft_loader_open`` gave it.
    """

    _close_fn = "pft_loader_close"

    def __init__(self, path: str | os.PathLike[str], budget: int, seed: int, overflow: float | None = None,
                 rank: int = 0, world: int = 1) -> None:
        super().__init__()
        h = _lib.u64()
        options: dict[str, Any] = {"budget": budget, "seed": seed, "rank": rank, "world": world}
        if overflow is not None:
            options["overflow"] = overflow  # else Go's loader.DefaultOverflow
        self.summary: dict[str, Any] = _lib.call_json("pft_loader_open", _lib.cstr(path),
                                                      json.dumps(options).encode(), ctypes.byref(h))
        self._handle = h.value

    def _closed_message(self) -> str:
        return "the ChunkDataset's loader server is closed"

    def set_epoch(self, epoch: int) -> None:
        _lib.call("pft_loader_set_epoch", self._live(), epoch)

    def get(self, indices: Sequence[int]) -> tuple[list[int], int]:
        """Serve requests for ``indices``; return META_FIELDS ints per sample and the batch's ticket."""
        n = len(indices)
        idx = (ctypes.c_int64 * n)(*indices)
        meta = (ctypes.c_int64 * (META_FIELDS * n))()
        ticket = _lib.u64()
        _lib.call("pft_loader_get", self._live(), n, idx, meta, ctypes.byref(ticket))
        return meta[:], ticket.value

    def take(self, ticket: int, addrs: Sequence[int] | None) -> None:
        """Copy the ticket's samples to ``addrs`` (each its sample's length), or give them back (None)."""
        if addrs is None:
            _lib.call("pft_loader_take", self._live(), ticket, 0, None)
            return
        arr = (ctypes.c_void_p * len(addrs))(*[a or None for a in addrs])
        _lib.call("pft_loader_take", self._live(), ticket, len(addrs), arr)

    def listen(self, address: str) -> None:
        """Serve DataLoader workers at the Unix socket ``address`` (``@name``: abstract) until closed."""
        _lib.call("pft_loader_listen", self._live(), address.encode())

    def state(self) -> dict[str, Any]:
        return _lib.call_json("pft_loader_state", self._live())

    def restore(self, state: dict[str, Any]) -> None:
        _lib.call("pft_loader_restore", self._live(), json.dumps(state).encode())

    def stats(self) -> dict[str, Any]:
        return _lib.call_json("pft_loader_stats", self._live())

    # A node of a cluster (loader/dist): rank and world given to the constructor.

    def dist_listen(self, options: dict[str, Any], address: str) -> str:
        """Serve the other nodes over gRPC at ``address`` ("host:0" picks a port); return the address bound."""
        return str(_lib.call_json("pft_loader_dist_listen", self._live(), address.encode(),
                                  json.dumps(options).encode())["address"])

    def dist_connect(self, addresses: Sequence[str]) -> None:
        """Connect to the other nodes, ``addresses`` by rank (this node's own included)."""
        _lib.call("pft_loader_dist_connect", self._live(), json.dumps(list(addresses)).encode())

    def dist_sequence(self, epoch: int, positions: Sequence[int]) -> None:
        """Give the node its sampler's positions of ``epoch``, in order (owners prefetch along them)."""
        n = len(positions)
        arr = (ctypes.c_int64 * n)(*positions)
        _lib.call("pft_loader_dist_sequence", self._live(), epoch, n, arr)

    def dist_drop(self) -> None:
        """Give the prefetched samples back to their owners (before a state is taken)."""
        _lib.call("pft_loader_dist_drop", self._live())

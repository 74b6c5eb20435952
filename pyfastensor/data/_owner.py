"""Which process owns a ``ChunkDataset``'s server, and how copies of the dataset find it.

The server is opened on first use in the process that made the dataset (the
owner) and listens for its DataLoader workers at an address made of the
owner's pid and a token, so that forked and spawned workers know it before
it listens. A copy pickled into another process that is not a worker opens
a server of its own on first use; a worker is a client (``_worker.py``).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import TYPE_CHECKING, Any

import torch.utils.data

from .. import errors
from . import _native

if TYPE_CHECKING:  # typing.Self is Python 3.11's; annotations are strings here (PEP 563)
    from typing_extensions import Self


class _ServerOwner:
    """The native server of a :class:`~pyfastensor.data.ChunkDataset`, in its owning process."""

    root: str
    memory_budget: int
    seed: int
    overflow: float | None
    distributed: bool
    _owner: int
    _token: str
    _server: _native.Server | None
    _closed: bool
    _lock: threading.Lock
    _client: Any
    _client_pid: int

    def _address(self) -> str:
        return f"@pyfastensor-loader-{self._owner}-{self._token}"

    @staticmethod
    def _in_worker() -> bool:
        return torch.utils.data.get_worker_info() is not None

    def _live(self) -> _native.Server:
        if self._in_worker():
            info = torch.utils.data.get_worker_info()
            raise errors.UnsupportedError(
                f"ChunkDataset({self.root!r}): this method belongs to the main process, not DataLoader "
                f"worker {info.id if info else '?'}: the server there owns the epoch, its state and "
                "counters; workers only fetch batches")
        with self._lock:
            if self._closed:
                raise ValueError(f"ChunkDataset({self.root!r}) is closed")
            if self._server is None or os.getpid() != self._owner:
                if os.getpid() != self._owner:
                    # A copy in another process (pickled, not a worker): it
                    # serves its own, at an address of its own. The owner
                    # keeps its address: forked workers already hold it.
                    self._owner, self._token = os.getpid(), secrets.token_hex(8)
                self._server = None
                rank, world = self._share()
                server = _native.Server(self.root, self.memory_budget, self.seed, self.overflow, rank, world)
                try:
                    server.listen(self._address())
                    if self.distributed:
                        self._join(server, rank, world)
                except BaseException:
                    server.close()
                    raise
                self._server = server
            return self._server

    def close(self) -> None:
        """Close the native server and free its memory (idempotent); the dataset is unusable after."""
        with self._lock:
            server, self._server, self._closed = self._server, None, True
            client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            client.close()
        if server is not None and self._owner == os.getpid():
            server.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_server"], state["_lock"], state["_client"], state["_buffers"] = None, None, None, None
        state["_store"], state["_rendezvous"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if self._owner == os.getpid():
            # A copy in the owner's own process: a server of its own (on
            # first use), at another address. Elsewhere the copy keeps the
            # owner's: a spawned worker's.
            self._token = secrets.token_hex(8)

"""Rendezvous of a distributed ``ChunkDataset``'s nodes through torch.distributed's store.

The protocol itself is Go's (``loader/dist``): each rank's server owns the
abstract chunks ``g`` with ``g % world == rank`` and serves the other ranks
over gRPC. Here each rank listens on the address of its interface that
routes to the store's host (the one the process group uses, not every
interface), publishes ``host:port`` in the store, takes the job's token
(made by rank 0, shared through the store), waits for every rank's address
and connects. The store also gives the barriers of the collective steps
(``set_epoch``, ``state_dict``, ``load_state_dict``).
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import config, errors

if TYPE_CHECKING:
    from . import _native

#: How long a rank waits for the others at the rendezvous and at a barrier.
TIMEOUT_S = 300.0

#: The store's keys live under this prefix, then the dataset's name.
PREFIX = "pyfastensor/data/"


def default_store() -> Any:
    """The default process group's store (the TCPStore torchrun's rendezvous made)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise errors.InvalidArgumentError(
            "ChunkDataset(distributed=True): torch.distributed is not initialized; call "
            "torch.distributed.init_process_group() first (torchrun sets its environment), "
            "or give rank=, world_size= and store=")
    return dist.distributed_c10d._get_default_store()


def store_host(store: Any) -> str:
    """The host the job's store listens on: MASTER_ADDR, else the TCPStore's own."""
    host = os.environ.get("MASTER_ADDR")
    if host:
        return host
    while store is not None:
        h = getattr(store, "host", None)
        if isinstance(h, str) and h:
            return h
        store = getattr(store, "underlying_store", None)
    return "127.0.0.1"


def local_address(host: str) -> str:
    """This machine's address on the interface that routes to ``host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)
    except OSError as e:
        raise errors.InvalidArgumentError(f"ChunkDataset(distributed=True): cannot resolve the store's host {host!r} ({e})") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        addr = str(s.getsockname()[0])
    return f"[{addr}]" if family == socket.AF_INET6 else addr


class Rendezvous:
    """Keys of one dataset's cluster in the job's store, and its barriers.

    Args:
        store: a ``torch.distributed.Store`` every rank shares.
        name: the dataset's name in the store (the same on every rank).
        rank: this node's rank.
        world: the number of nodes.
        timeout: seconds to wait for the other ranks.
    """

    def __init__(self, store: Any, name: str, rank: int, world: int, timeout: float = TIMEOUT_S) -> None:
        self.store = store
        self.prefix = f"{PREFIX}{name}/"
        self.rank = rank
        self.world = world
        self.timeout = timeout
        self._barriers = 0

    def token(self) -> str:
        """The job's token: made by rank 0, read by the others."""
        key = self.prefix + "token"
        if self.rank == 0:
            token = secrets.token_hex(32)
            self.store.set(key, token)
            return token
        self._wait([key], "the job's token from rank 0")
        return bytes(self.store.get(key)).decode()

    def exchange(self, address: str) -> list[str]:
        """Publish this rank's address; return every rank's, by rank."""
        self.store.set(f"{self.prefix}addr/{self.rank}", address)
        keys = [f"{self.prefix}addr/{r}" for r in range(self.world)]
        self._wait(keys, "every node's address")
        return [bytes(self.store.get(k)).decode() for k in keys]

    def barrier(self, what: str) -> None:
        """Wait until every rank reached its barrier of the same number (``what`` names it in errors)."""
        self._barriers += 1
        base = f"{self.prefix}barrier/{self._barriers}/"
        self.store.set(base + str(self.rank), "1")
        self._wait([base + str(r) for r in range(self.world)], what)

    def _wait(self, keys: Sequence[str], what: str) -> None:
        try:
            self.store.wait(list(keys), datetime.timedelta(seconds=self.timeout))
        except Exception as e:  # the store's own timeout or a dead store host
            missing = []
            for k in keys:
                try:
                    if not self.store.check([k]):
                        missing.append(k.rsplit("/", 1)[-1])
                except Exception:
                    break
            who = f" (ranks {', '.join(missing)} did not arrive)" if missing else ""
            raise errors.NodeFailedError(
                f"ChunkDataset: rank {self.rank} waited {self.timeout:.0f}s for {what}{who}: a node of the "
                f"cluster failed or is not using the dataset alike ({type(e).__name__}: {e})") from None


# Distributed datasets made in this process, in order: the same count on
# every rank names a dataset's keys in the job's store.
_datasets = 0


class _ClusterMember:
    """The methods of a :class:`~pyfastensor.data.ChunkDataset` that make its server a node of the cluster."""

    distributed: bool
    rank: int | None
    world_size: int | None
    timeout: float
    remote_memory: int
    prefetch: bool
    _store: Any
    _rendezvous: Rendezvous | None

    def _share(self) -> tuple[int, int]:
        """This node's rank and the world size (0 and 1 on one node)."""
        if not self.distributed:
            return 0, 1
        if self.rank is None or self.world_size is None:
            import torch.distributed as dist

            default_store()  # raises, naming what to do, without a process group
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        return self.rank, self.world_size

    def _join(self, server: _native.Server, rank: int, world: int) -> None:
        """Join the cluster: listen, share the address and token through the store, connect."""
        global _datasets
        store = self._store if self._store is not None else default_store()
        _datasets += 1
        rv = Rendezvous(store, f"ds{_datasets}", rank, world, self.timeout)
        token = rv.token()
        host = config.data_host() or local_address(store_host(store))
        options = {"rank": rank, "world": world, "token": token, "remote_bytes": self.remote_memory,
                   "no_prefetch": not self.prefetch, "timeout_s": self.timeout}
        address = server.dist_listen(options, f"{host}:0")
        try:
            server.dist_connect(rv.exchange(address))
        except errors.EngineUnavailableError as e:
            raise errors.NodeFailedError(str(e)) from None
        rv.barrier("every node to connect")
        self._rendezvous = rv

    def _barrier(self, what: str) -> None:
        if self._rendezvous is not None:
            self._rendezvous.barrier(what)

    def _node_failed(self, e: errors.EngineUnavailableError) -> Exception:
        """A node's failure as NodeFailedError (Go's dist.ErrNodeFailed crosses as engine-unavailable)."""
        return errors.NodeFailedError(str(e)) if self.distributed else e

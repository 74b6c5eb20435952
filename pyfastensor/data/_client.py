"""A DataLoader worker's side of the loader server: the local protocol of ``loader/local.go``.

Workers never load the Go runtime (a forked one cannot use its parent's, a
spawned one would start a server of its own): the main process's server
listens on a Unix socket and a worker sends it requests, one at a time.
A batch crosses in two steps, as in the main process: ``get`` serves the
requests and answers each sample's position, source, label and length
under a ticket; the worker provides one shared-memory storage for the
batch (:class:`BatchBuffers`: reused once nothing holds it), ``take`` has
the server copy the samples into it (the storage's file descriptor travels
with the request; the server keeps it mapped), and the batch's tensors are
views of that storage, which torch then hands to the main process without
a copy. If the worker dies between the two, the server gives the batch back.
A worker asks for its batches in turn (``get_in_turn``): the server serves
them in the loader's round robin, each with the server's state after it
once the worker was asked for a state. A worker resuming from its part of
a StatefulDataLoader's state sends it with ``restore``; the server answers
once every worker's part came and it restored the latest.

Nothing here imports the native library; errors come back as the same
exceptions the native calls raise.
"""

from __future__ import annotations

import json
import mmap
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from .. import errors

# Keep in step with loader/local.go (tests/test_protocol_sync.py checks).
PROTOCOL = 3
HELLO, GET, TAKE, RETURN, RESTORE = 1, 2, 3, 4, 5
GET_IN_TURN, GET_STATE = 1, 2  # GET's flags
META_FIELDS = 4

_REQUEST = struct.Struct("<IIIQ")  # frame length, op, n, arg
_RESPONSE = struct.Struct("<iIQ")  # status, n, ticket

#: How long a worker waits for the main process's server to listen.
CONNECT_TIMEOUT_S = 30.0


def _status_error(status: int) -> type[Exception]:
    from .._lib import _STATUS  # the table only: importing _lib loads no library

    return _STATUS.get(status, errors.FastensorError)


def socket_address(name: str) -> str:
    """The address Python connects to for the Go address ``name`` (``@x``: abstract namespace)."""
    return "\0" + name[1:] if name.startswith("@") else name


class Client:
    """One connection to a loader server of this node.

    Args:
        address: the server's address (``@name`` for the abstract namespace).
        what: how errors name the dataset (e.g. ``"ChunkDataset('packed')"``).
        timeout: seconds to wait for the server to listen. Default: ``CONNECT_TIMEOUT_S``.
    """

    def __init__(self, address: str, what: str, timeout: float | None = None) -> None:
        timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
        self.address = address
        self.what = what
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock.connect(socket_address(address))
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:
                if time.monotonic() > deadline:
                    self._sock.close()
                    raise errors.ServerUnavailableError(
                        f"{what}: no loader server listens at {address!r} after {timeout:.0f}s ({e}). "
                        "The main process opens it on the dataset's first use there: call len(dataset) "
                        "in the main process before iterating a DataLoader with workers") from None
                time.sleep(0.05)
        # The hello gets what is left of the timeout: a forked worker holds a
        # copy of the server's listening socket, so a connection can be
        # queued on it after the main process closed it, with no one to answer.
        self._sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            self.info: dict[str, Any] = json.loads(self._call(HELLO, 0, 0, b"")[2])
        except errors.ServerUnavailableError:
            self._sock.close()
            raise errors.ServerUnavailableError(
                f"{what}: no loader server answers at {address!r} after {timeout:.0f}s (closed in the main "
                "process?)") from None
        self._sock.settimeout(None)
        if self.info.get("protocol") != PROTOCOL:
            self._sock.close()
            raise errors.UnsupportedError(
                f"{what}: the loader server at {address!r} speaks protocol {self.info.get('protocol')}, "
                f"this worker {PROTOCOL} (two pyfastensor versions in one job?)")

    def close(self) -> None:
        """Close the connection (a batch got and not taken goes back to the server)."""
        self._sock.close()

    def _call(self, op: int, n: int, arg: int, payload: bytes, fd: int | None = None) -> tuple[int, int, bytes]:
        frame = _REQUEST.pack(16 + len(payload), op, n, arg) + payload
        sent: OSError | None = None
        try:
            if fd is None:
                self._sock.sendall(frame)
            else:
                socket.send_fds(self._sock, [frame], [fd])
        except OSError as e:  # the server may have refused the request and said why before closing
            sent = e
        try:
            head = self._recv(4)
            body = self._recv(struct.unpack("<I", head)[0])
        except OSError as e:
            raise errors.ServerUnavailableError(
                f"{self.what}: the loader server at {self.address!r} is gone ({sent or e})") from None
        status, m, ticket = _RESPONSE.unpack_from(body)
        payload_out = body[_RESPONSE.size:]
        if status != 0:
            raise _status_error(status)(payload_out.decode("utf-8", "replace"))
        return m, ticket, payload_out

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionResetError("connection closed")
            buf += chunk
        return bytes(buf)

    def hello(self) -> dict[str, Any]:
        """The server's answer to a hello now: ``samples``, ``epoch``, and ``part``, the head of a
        worker's part of its state (``loader.WorkerPart``)."""
        self.info = json.loads(self._call(HELLO, 0, 0, b"")[2])
        return self.info

    def get(self, indices: Sequence[int]) -> tuple[list[int], int, int]:
        """Serve requests for ``indices``; return META_FIELDS ints per sample, the batch's ticket
        and the epoch it was delivered in."""
        n = len(indices)
        _, ticket, meta = self._call(GET, n, 0, struct.pack(f"<{n}q", *indices))
        values = struct.unpack(f"<{META_FIELDS * n}qQ", meta)
        return list(values[:-1]), ticket, int(values[-1])

    def get_in_turn(self, indices: Sequence[int], worker: int, workers: int, wait: float,
                    state: bool) -> tuple[list[int], int, int, int, bytes]:
        """Serve requests for ``indices`` as batch of ``worker`` of a loader of ``workers`` that hands
        its batches to them round robin: the server serves it once the batches before it were,
        waiting up to ``wait`` seconds. Return META_FIELDS ints per sample, the batch's ticket, the
        epoch, the batch's index in the epoch's round robin and, with ``state``, the server's state
        after it (JSON bytes; else empty)."""
        n = len(indices)
        arg = GET_IN_TURN | (GET_STATE if state else 0) | (worker & 0xFFFF) << 16 | (workers & 0xFFFF) << 32
        payload = struct.pack(f"<{n}qQ", *indices, max(1, int(wait * 1000)))
        _, ticket, meta = self._call(GET, n, arg, payload)  # the server bounds the wait
        head = struct.calcsize(f"<{META_FIELDS * n}qQQ")
        values = struct.unpack_from(f"<{META_FIELDS * n}qQQ", meta)
        return list(values[:-2]), ticket, int(values[-2]), int(values[-1]), meta[head:]

    def take(self, ticket: int, n: int, fd: int, size: int, offset: int = 0) -> None:
        """Have the server write the ticket's ``n`` samples, back to back, into the shared memory ``fd`` from ``offset``."""
        self._call(TAKE, n, ticket, struct.pack("<QQ", offset, size), fd)

    def give_back(self, ticket: int) -> None:
        """Give a batch back untaken: the requests asked again get its samples."""
        self._call(RETURN, 0, ticket, b"")

    def restore(self, part: dict[str, Any], timeout: float) -> None:
        """Send this worker's part of a state; return once the server restored the state every
        worker's part makes (waiting up to ``timeout`` seconds for the others')."""
        self._sock.settimeout(timeout + 10)
        try:
            self._call(RESTORE, 0, max(1, int(timeout * 1000)), json.dumps(part).encode())
        finally:
            self._sock.settimeout(None)


class BatchBuffers:
    """A worker's shared-memory storages for its batches, reused once free.

    A fresh storage per batch cost, per page, a zeroing and a fault in the
    server's process and in the worker's, then its teardown: with the
    DataLoader's own shared memory for the collated batch, the kernel was
    the largest share of an epoch's CPU (``benchmarks data``, 100,000 files of
    100 KB). The server keeps a client's storages mapped between takes
    (``loader/local.go``), so a reused one costs neither.

    A storage is reused only when nothing else holds it: no tensor (its
    use count is the pool's own) and never sent to another process (torch
    registers a storage it pickles for sharing in
    ``torch.multiprocessing.reductions.shared_cache``; such a storage may
    still be read there, and leaves the pool). A collate function that
    returns the sample tensors themselves thus gets a fresh storage per
    batch, as before; the default collate, which copies them into a batch
    tensor, gets the pool's.

    Args:
        size: the storages kept. Default: :attr:`SIZE`.
    """

    #: Storages kept per worker: one being filled while the last batch's is released.
    SIZE = 2

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._pool: list[Any] = []

    def get(self, nbytes: int) -> Any:
        """A shared-memory ``UntypedStorage`` of at least ``nbytes`` bytes, free to overwrite."""
        from torch.multiprocessing.reductions import shared_cache

        from .. import _torch

        shared = {getattr(ref, "cdata", None) for ref in list(shared_cache.values())}
        self._pool = [s for s in self._pool if s._cdata not in shared]
        for s in self._pool:
            if s.nbytes() >= nbytes and _torch.storage_use_count(s) == 1:
                return s
        # Room for batches an eighth larger (variable sample sizes), in whole pages of the
        # shared mapping (the OS's page size: the server maps the storage, it does no direct I/O).
        size = max(1, -(-(nbytes + nbytes // 8) // mmap.PAGESIZE) * mmap.PAGESIZE)
        storage = _torch.new_shared_storage(size)
        free = [k for k, s in enumerate(self._pool) if _torch.storage_use_count(s) == 1]
        if len(self._pool) < self.size:
            self._pool.append(storage)
        elif free:  # a free one too small: replaced
            self._pool[free[0]] = storage
        return storage

"""A DataLoader worker's side of a ``ChunkDataset``: its client, its batches, its part of a state.

A worker never loads the Go runtime: it asks the main process's server for
each batch over a Unix socket (``_client.py``), in the loader's round robin,
has the batch's bytes copied into one shared-memory storage of its own, and
keeps the server's state after its last batch: its part of a torchdata
``StatefulDataLoader``'s state, which it sends back on resume.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.utils.data

from .. import errors
from . import _client, _native


class _WorkerSide:
    """The methods of a :class:`~pyfastensor.data.ChunkDataset` that run in a DataLoader worker."""

    root: str
    timeout: float
    _closed: bool
    _client: _client.Client | None
    _client_pid: int
    _buffers: _client.BatchBuffers | None
    _buffers_pid: int
    _part_pid: int
    _part_epoch: int
    _part_batch: int
    _part_state: bytes
    _part_wanted: bool

    def _worker_buffers(self) -> _client.BatchBuffers:
        if self._buffers is None or self._buffers_pid != os.getpid():
            self._buffers, self._buffers_pid = _client.BatchBuffers(), os.getpid()
        return self._buffers

    def _worker_client(self) -> _client.Client:
        if self._closed:
            raise ValueError(f"ChunkDataset({self.root!r}) is closed")
        if self._client is None or self._client_pid != os.getpid():
            self._client = _client.Client(self._address(), f"ChunkDataset({self.root!r})")
            self._client_pid = os.getpid()
        return self._client

    def _fetch_in_worker(self, idx: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        """A worker's batch: the server's answer, its bytes in one shared-memory storage."""
        client = self._worker_client()
        self._check_indices(idx, int(client.info["samples"]))
        worker = torch.utils.data.get_worker_info()
        self._part_own()
        try:
            # In the loader's round robin: the batches come in the loader's order.
            meta, ticket, epoch, batch, state = client.get_in_turn(
                idx, worker.id, worker.num_workers, self.timeout, self._part_wanted)
        except errors.EngineUnavailableError as e:
            raise self._node_failed(e) from None
        f = _native.META_FIELDS
        lengths = [meta[k * f + 3] for k in range(len(idx))]
        total = sum(lengths)
        try:
            storage = self._worker_buffers().get(total)
            fd, close_fd = _shared_fd(storage)
            try:
                client.take(ticket, len(idx), fd, storage.nbytes())
            finally:
                if close_fd:
                    os.close(fd)
        except BaseException:
            try:
                client.give_back(ticket)
            except errors.FastensorError:
                pass  # the server is gone: nothing to give back to
            raise
        self._note_batch(epoch, batch, state)
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        datas, at = [], 0
        for length in lengths:
            datas.append(flat[at:at + length])
            at += length
        return meta, datas

    # A worker's part of a state (torchdata's StatefulDataLoader calls state_dict() in each
    # worker after each batch, and load_state_dict() in each new worker on resume).

    def _part_own(self) -> None:
        """Start this process's part afresh if it was made in another (a forked worker's copy)."""
        if self._part_pid != os.getpid():
            self._part_pid, self._part_epoch, self._part_batch, self._part_state = os.getpid(), -1, 0, b""

    def _note_batch(self, epoch: int, batch: int, state: bytes) -> None:
        """Record a batch this worker took: its index in the epoch's round robin and the server's state after it."""
        self._part_epoch, self._part_batch, self._part_state = epoch, batch + 1, state

    def _worker_state(self) -> dict[str, Any]:
        """This worker's part of the state: the server's state after its last batch this epoch
        (``loader.WorkerPart``)."""
        info = self._worker_client().hello()
        head = info.get("part")
        if not head:
            raise errors.UnsupportedError(
                f"ChunkDataset({self.root!r}): the loader server gives DataLoader workers no part of its state")
        self._part_own()
        self._part_wanted = True  # from now on batches come with the server's state
        worker = torch.utils.data.get_worker_info()
        part = dict(head, worker=worker.id, num_workers=worker.num_workers)
        if self._part_epoch == int(head["epoch"]) and self._part_batch > 0:
            part["batch"] = self._part_batch
            if self._part_state:  # none from a node of a cluster: its server refuses a restore from parts
                part["state"] = json.loads(self._part_state)
        return part

    def _worker_restore(self, part: dict[str, Any]) -> None:
        """Send this worker's part to the server; return once it restored the loader's state."""
        worker = torch.utils.data.get_worker_info()
        if part.get("kind") != "worker":
            raise errors.InvalidArgumentError(
                f"ChunkDataset({self.root!r}): DataLoader worker {worker.id} was given a main process's state "
                "(ChunkDataset.state_dict()); a worker loads its own part of a StatefulDataLoader's state. Load a "
                "ChunkDataset's state with dataset.load_state_dict() in the main process, before the loader starts")
        if int(part.get("num_workers", -1)) != worker.num_workers:
            raise errors.InvalidArgumentError(
                f"ChunkDataset({self.root!r}): a part of the state of a loader of {part.get('num_workers')} "
                f"workers, loaded into one of {worker.num_workers}: resume with as many workers")
        self._worker_client().restore(part, self.timeout)
        self._part_own()
        state = part.get("state")
        self._part_epoch, self._part_batch = int(part["epoch"]), int(part.get("batch", 0) or 0)
        self._part_state = json.dumps(state).encode() if state else b""
        self._part_wanted = True


def _shared_fd(storage: torch.UntypedStorage) -> tuple[int, bool]:
    """A file descriptor of a shared-memory storage, and whether the caller closes it.

    Under torch's ``file_descriptor`` sharing strategy (Linux's default) the
    storage keeps its own; under ``file_system`` its memory is a named file
    under /dev/shm, opened here.
    """
    try:
        fd, _ = storage._share_fd_cpu_()
        return int(fd), False
    except RuntimeError:
        _, name, _ = storage._share_filename_cpu_()
        name = name.decode() if isinstance(name, bytes) else name
        return os.open(os.path.join("/dev/shm", name.lstrip("/")), os.O_RDWR), True

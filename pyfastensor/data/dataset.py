"""``ChunkDataset``: a map-style dataset over a pack, served by the Go loader (Brand).

The Go server (``loader/server.go``) owns the abstract memory and decides
which sample answers each request; this class turns requests into one
native call per batch and the answers into uint8 tensors. The server lives
in the process that uses the dataset first (the training script's:
``_owner.py``); its DataLoader workers are clients of it over a Unix socket
(``_worker.py``, ``_client.py``), never loading the Go runtime; a
distributed dataset's server is a node of the ranks' cluster (``_dist.py``).
This module holds the dataset's public methods.
"""

from __future__ import annotations

import json
import operator
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils.data

from .. import config, errors
from . import _client, _dist, _native
from ._owner import _ServerOwner
from ._worker import _WorkerSide
from .pack import _check_seed
from .sampler import ChunkSampler

__all__ = ["ChunkDataset", "ChunkSampler"]


class ChunkDataset(_ServerOwner, _WorkerSide, _dist._ClusterMember, torch.utils.data.Dataset):
    """A map-style dataset over a pack (``python -m pyfastensor data pack``), read in whole chunks.

    As in Brand (the paper's section 3.3), a request for index ``i`` is
    answered by the sample currently in ``i``'s slot of its chunk group's
    abstract chunk, which is then consumed: the sample returned is generally
    not sample ``i``. Over an epoch whose requests are a permutation of
    ``range(len(ds))`` (what any of torch's samplers asks for), every sample
    is delivered exactly once. Chunks are read whole, on demand, into an
    abstract memory of ``memory_budget`` bytes; a sample read is never dropped
    before it is delivered. The order is a function of (seed, epoch, request
    sequence), so :meth:`state_dict` taken mid-epoch and loaded into a new
    dataset resumes the epoch.

    Each item is ``(data, label)``, or ``(data, label, index)`` with
    ``with_index=True``, where ``data`` is a 1-D ``torch.uint8`` tensor of the
    sample's bytes (its file's contents) or what ``transform`` made of it,
    ``label`` its class index (``classes[label]`` its name) and ``index`` its
    position in the pack's index. Samples differ in length: give
    ``DataLoader`` a ``transform`` that makes them one shape (decode and
    resize) or a ``collate_fn`` that keeps a list.

    ``DataLoader`` fetches a batch through :meth:`__getitems__`: one native
    call, the chunk reads of the batch running in parallel in Go.

    Lifetime: the constructor opens the native server (reading the pack's
    index, so a missing or damaged pack fails there) and starts listening for
    DataLoader workers; it closes with :meth:`close`, the end of a ``with``
    block, or when the dataset is collected. A pickled copy carries the
    arguments only and opens a server of its own on first use in another
    process (not in a DataLoader worker, which is a client).

    Processes: one server owns the memory budget and the epoch's record of
    delivered samples: it runs in the process that made the dataset, reading
    chunks on its own threads. DataLoader workers, forked or
    spawned, are its clients over a Unix socket and never load the Go
    runtime; each batch's bytes are copied once, by the server, into one
    shared-memory storage the worker allocates, and the batch's tensors are
    views of it that reach the main process without another copy (so a
    sample kept alive keeps its batch's storage). A worker killed while
    holding a batch it has not taken gives it back: the requests asked again
    (by a new DataLoader resuming the epoch) get its samples, so none is lost
    or repeated; a batch taken is delivered. ``set_epoch``, ``stats``,
    ``classes`` and ``layout`` belong to the main process.

    Resume: which loader gives which guarantee.

    - torchdata's ``StatefulDataLoader``, any ``num_workers``, ``fork`` or
      ``spawn``: its ``state_dict()`` taken after any batch, loaded into a new
      ``StatefulDataLoader`` over a new ChunkDataset (same pack, a budget giving
      the same layout, as many workers), in any process, continues the epoch so
      that every sample is delivered exactly once across the interruption, with
      the batches the interrupted loader would have given: the batches the loop
      consumed are in the state, those prefetched past them are not. With
      ``num_workers=0`` the loader saves this dataset's :meth:`state_dict`. With
      workers each worker's ``state_dict()`` is its part of the state, the
      server's state right after the worker's last batch (two bitmaps of
      ``len(self) / 8`` bytes, sent with each batch once the loader asked for a
      state); on resume each new worker's ``load_state_dict()`` sends its part
      to the main process's server, which waits for every worker's
      (``timeout``) and restores the one of the latest batch. Any
      ``snapshot_every_n_steps``: the batches the loader replays after its last
      snapshot are served again as they were. A distributed dataset resumes
      mid-epoch with ``num_workers=0`` only.
    - torch's ``DataLoader``: :meth:`state_dict` in the main process. With
      ``num_workers=0``, exact after any batch. With workers, the batches they
      prefetched and the loop did not consume yet count as delivered: take it at
      an epoch's end (the iterator drained).

    Order: DataLoader workers' batches are served in the loader's order
    (torch's loaders with ``in_order=True``, their default, hand batch ``b`` to
    worker ``b % num_workers``; a request that is ahead waits for the batches
    before it, up to ``timeout``), so the same pack, budget, seed, sampler order
    and ``num_workers`` give the same batches, also across a resume. Another
    ``num_workers`` gives other batches. ``in_order=False`` is not supported
    with workers.

    Concurrency: the methods may be called from several threads; the
    server orders concurrent batches of the main process as they reach it
    (a DataLoader's workers': in the loader's order, above).

    Args:
        root: the pack's directory.
        memory_budget: bytes (or a size such as ``"8G"``) for the samples held
            and the chunks being read; at least the pack's minimum (one
            abstract chunk and one chunk read: ``layout["min_budget"]``).
            A larger budget holds more chunk groups, each request then drawing
            from fewer chunks. With a random sampler, a budget below
            ``layout["epoch_budget"]`` (about 1/sqrt(chunks) of the data) reads
            some chunks more than once. Resuming needs a budget giving the same
            layout.
        seed: the seed of the tie-breaks between chunks, with the epoch. Default: 0.
        transform: called on each sample's uint8 tensor; its result is the item's
            ``data``. Default: None (the bytes).
        with_index: items are ``(data, label, index)``. Default: False.
        overflow: the share of ``memory_budget`` (0 to 0.9) for the samples a chunk
            read brings whose slot is occupied: kept, up to that share, and served
            before their slot, instead of dropped and read again later. ``0`` is the
            paper's policy, which with a random sampler and a budget below the data
            reads each chunk 5 to 7 times (85 to 88% of the bytes read wasted,
            ``loader/overflow_test.go``); the default, ``loader.DefaultOverflow``
            (0.9), reads each chunk once from a budget of about 1/sqrt(chunks) of
            the data (5% at 100,000 samples in chunks of 64): the chunk groups are
            widened until the share holds the spares a random epoch is predicted to
            leave. The slots and reads keep at least the pack's minimum. Where the
            share has room beyond those spares, the server also reads ahead of a
            random sampler (``layout["read_ahead"]`` samples per slot, up to 4):
            the reads then overlap the batches instead of holding them up.

    Raises:
        NotFoundError: ``root`` is not a directory.
        InvalidArgumentError: ``memory_budget``, ``seed`` or ``overflow`` is not a valid
            number, or the budget is below the pack's minimum (naming both).
        CorruptFileError: the index is missing or damaged, or a chunk file is missing
            or of another length than the index gives it (naming the file).
        UnsupportedError: the pack is of a newer format version (naming the index).

        distributed: join the cluster of the job's ranks (Brand's distributed
            protocol, ``loader/dist``): every rank's server owns the abstract chunks
            ``g`` with ``g % world_size == rank`` (the layout is planned for the
            cluster's memory, ``world_size * memory_budget``); a request for a slot
            another rank owns goes to that rank over gRPC, which answers with the
            slot's sample and with samples already in its memory for this rank's
            upcoming requests (those of :meth:`sampler`), into slots free in this
            rank's remote memory. Rendezvous through torch.distributed's store
            (``init_process_group`` first: under torchrun nothing else is needed).
            The collective steps (every rank calls them): the first use,
            :meth:`set_epoch`, :meth:`state_dict`, :meth:`load_state_dict`.
            Default: False, unless ``rank`` and ``world_size`` are given.
        rank: this node's rank. Default: ``torch.distributed.get_rank()``.
        world_size: the number of nodes. Default: ``torch.distributed.get_world_size()``.
        store: a ``torch.distributed.Store`` every rank shares. Default: the
            default process group's.
        remote_memory: bytes (or a size) of this rank's remote abstract memory,
            the prefetched samples of other ranks' slots it holds at most, on top
            of ``memory_budget``. Default: a tenth of ``memory_budget`` (the paper's
            best, section 5.4).
        prefetch: owners prefetch along this rank's access sequence. Default: True.
        timeout: seconds to wait for another rank (rendezvous, barriers, calls), for
            the other DataLoader workers' parts of a state when they resume, and
            for the batches before a worker's own in the loader's order.
            Default: 300.

    Security (distributed): each rank's server listens on its interface that
    routes to the store's host (``MASTER_ADDR``; ``PYFASTENSOR_DATA_HOST``
    names another), not on every interface, and refuses any call without the
    job's token (made by rank 0, shared through the store, which is no more
    protected than the process group's own). The traffic is not encrypted.

    Example::

        >>> ds = pyfastensor.data.ChunkDataset("packed", memory_budget=8 << 30,
        ...                                    transform=decode_and_resize)
        >>> loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True)
        >>> for epoch in range(epochs):
        ...     ds.set_epoch(epoch)
        ...     for images, labels in loader:
        ...         ...
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        memory_budget: int | str,
        seed: int = 0,
        transform: Callable[[torch.Tensor], Any] | None = None,
        with_index: bool = False,
        overflow: float | None = None,
        distributed: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        store: Any = None,
        remote_memory: int | str | None = None,
        prefetch: bool = True,
        timeout: float = _dist.TIMEOUT_S,
    ) -> None:
        budget = config.parse_size(memory_budget) if isinstance(memory_budget, str) else memory_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget < 1 << 63:
            raise errors.InvalidArgumentError(
                f"memory_budget={memory_budget!r}: expected a positive number of bytes (or a size such as '8G')")
        _check_seed(seed)
        if overflow is not None and (isinstance(overflow, bool) or not isinstance(overflow, (int, float))
                                     or not 0 <= overflow <= 0.9):
            raise errors.InvalidArgumentError(f"overflow={overflow!r}: expected a share of the budget from 0 to 0.9")
        if not os.path.isdir(root):
            raise errors.NotFoundError(f"{root}: no such directory (a pack's, from `python -m pyfastensor data pack`)")
        self.root = os.fspath(root)
        self.memory_budget = budget
        self.seed = seed
        self.transform = transform
        self.with_index = with_index
        self.overflow = overflow
        self.distributed = bool(distributed) or rank is not None or world_size is not None
        for what, v in (("rank", rank), ("world_size", world_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise errors.InvalidArgumentError(f"{what}={v!r}: expected an integer >= 0")
        if (rank is None) != (world_size is None) or (world_size is not None and rank is not None and not rank < world_size):
            raise errors.InvalidArgumentError(f"rank={rank!r}, world_size={world_size!r}: give both, rank < world_size")
        remote = budget // 10 if remote_memory is None else (
            config.parse_size(remote_memory) if isinstance(remote_memory, str) else remote_memory)
        if isinstance(remote, bool) or not isinstance(remote, int) or not 0 <= remote < 1 << 62:
            raise errors.InvalidArgumentError(f"remote_memory={remote_memory!r}: expected a number of bytes >= 0")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 1e6:
            raise errors.InvalidArgumentError(f"timeout={timeout!r}: expected seconds > 0")
        self.rank, self.world_size = rank, world_size
        self.remote_memory = remote
        self.prefetch = bool(prefetch)
        self.timeout = float(timeout)
        self._store = store
        self._rendezvous: _dist.Rendezvous | None = None
        self._epoch = 0
        self._resume: dict[int, int] = {}  # epoch -> requests of this rank's share issued before the state
        # (epoch, position) where a resumed sampler's order starts: the loader's first request, or
        # a loader skipped requests the sampler skipped already (see _check_resumed)
        self._resumed_at: tuple[int, int] | None = None
        self._server: _native.Server | None = None
        self._closed = False
        self._lock = threading.Lock()
        # The server's address for workers: its owner's pid and a token, so
        # that forked and spawned workers know it before it listens.
        self._owner = os.getpid()
        self._token = secrets.token_hex(8)
        self._client: _client.Client | None = None
        self._client_pid = 0
        self._buffers: _client.BatchBuffers | None = None  # a worker's, for its batches
        self._buffers_pid = 0
        # A worker's part of a state (StatefulDataLoader): the server's state
        # after this worker's last batch (JSON bytes) and that batch's index
        # plus one, in epoch _part_epoch, in process _part_pid; and whether a
        # state was asked for (then batches come with the server's state).
        self._part_pid = 0
        self._part_epoch = -1
        self._part_batch = 0
        self._part_state = b""
        self._part_wanted = False
        if not self._in_worker():
            self._live()  # opened here, so a worker can reach it whatever the sampler calls

    def sampler(self, shuffle: bool = True, seed: int | None = None) -> ChunkSampler:
        """A sampler asking for this rank's share of each epoch's permutation, which it tells the
        loader (owners prefetch along it); it resumes after :meth:`load_state_dict`.

        Give it to ``DataLoader(sampler=...)`` in place of ``DistributedSampler``:
        rank ``r`` of ``w`` asks for ``perm[r::w]`` of the epoch's permutation,
        without the padding ``DistributedSampler`` adds (ranks may differ by one
        request), so the epoch's requests are a permutation.

        Args:
            shuffle: a random permutation per epoch (else ``range(len(dataset))``). Default: True.
            seed: the permutation's seed, with the epoch. Default: the dataset's seed.
        """
        return ChunkSampler(self, shuffle, self.seed if seed is None else seed)

    # What the pack holds.

    def __len__(self) -> int:
        """The number of samples in the pack (opening the server, as any first use does).

        Raises:
            CorruptFileError: the index is missing or damaged, or a chunk file is
                missing or of another length than the index gives it (naming the file).
            UnsupportedError: the pack is of a newer format version (naming the index);
                or this is a DataLoader worker process.
            InvalidArgumentError: ``memory_budget`` is below the pack's minimum (naming both).
        """
        if self._in_worker():
            return int(self._worker_client().info["samples"])
        return int(self._live().summary["samples"])

    @property
    def classes(self) -> list[str]:
        """The class names; an item's ``label`` indexes this list."""
        return list(self._live().summary["classes"])

    @property
    def layout(self) -> dict[str, Any]:
        """The abstract memory the budget gives (``loader.Layout``): ``chunks_per_group``,
        ``abstract_chunks``, ``slot_bytes``, ``read_bytes``, ``min_budget``, ..."""
        return dict(self._live().summary["layout"])

    # Serving.

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        """Serve one request (:meth:`__getitems__` of one).

        Args:
            index: the position requested, ``0 <= index < len(self)``.

        Returns:
            ``(data, label)``, or ``(data, label, index)`` with ``with_index``:
            the sample in ``index``'s slot, generally not sample ``index``.

        Raises:
            IndexError: ``index`` is outside the dataset.
            InvalidArgumentError: the epoch's requests are not a permutation (this
                slot has no sample left), or the epoch is complete.
            CorruptFileError: the chunk holding the sample is damaged (naming the file).
        """
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """Serve a batch of requests in one native call (torch's DataLoader calls this).

        The batch is admitted whole or not at all: an error leaves nothing served.

        Args:
            indices: the positions requested, each ``0 <= i < len(self)``.

        Returns:
            One item per request, in request order (see :meth:`__getitem__`).

        Raises:
            IndexError: an index is outside the dataset.
            InvalidArgumentError: the epoch's requests are not a permutation of the
                dataset's indices (a slot asked for more samples than it has left), or
                every sample of the epoch was delivered: call :meth:`set_epoch` first.
            CorruptFileError: a chunk read while serving is damaged (naming the chunk
                file and sample); the samples of the batch are lost to the epoch.
            ServerUnavailableError: in a DataLoader worker, the main process's server
                is not listening (not used there yet, or closed).
        """
        idx = [operator.index(i) for i in indices]
        if self._in_worker():
            return self._items(*self._fetch_in_worker(idx))
        server = self._live()
        n = int(server.summary["samples"])
        self._check_indices(idx, n)
        self._check_resumed(idx)
        try:
            meta, ticket = server.get(idx)
        except errors.EngineUnavailableError as e:
            raise self._node_failed(e) from None
        except errors.InvalidArgumentError as e:
            st = server.stats()
            if st["served"] == n and idx:
                raise errors.InvalidArgumentError(
                    f"{e} (call ChunkDataset.set_epoch({st['epoch'] + 1}) before the next epoch)") from e
            raise
        f = _native.META_FIELDS
        try:
            datas = [torch.empty(meta[k * f + 3], dtype=torch.uint8) for k in range(len(idx))]
        except BaseException:
            server.take(ticket, None)
            raise
        # datas owns the memory Go copies into: alive (this frame) until take returns.
        server.take(ticket, [d.data_ptr() for d in datas])
        return self._items(meta, datas)

    def _check_indices(self, idx: list[int], n: int) -> None:
        for i in idx:
            if not 0 <= i < n:
                raise IndexError(f"index {i} is outside ChunkDataset({self.root!r}) of {n} samples")

    def _items(self, meta: list[int], datas: list[torch.Tensor]) -> list[tuple[Any, ...]]:
        f = _native.META_FIELDS
        items: list[tuple[Any, ...]] = []
        for k, data in enumerate(datas):
            out = self.transform(data) if self.transform is not None else data
            label = meta[k * f + 2]
            items.append((out, label, meta[k * f]) if self.with_index else (out, label))
        return items

    # Epochs, resume, counters.

    def _check_resumed(self, idx: list[int]) -> None:
        """Refuse, before anything is served, a first request after a resume that is not where
        :meth:`sampler`'s resumed order starts: the loader dropped requests the sampler had
        skipped already, and their samples would be lost to the epoch."""
        if self._resumed_at is None or not idx:
            return
        (epoch, first), self._resumed_at = self._resumed_at, None
        if epoch == self._epoch and idx[0] != first:
            raise errors.InvalidArgumentError(
                f"ChunkDataset: the first request after resuming epoch {epoch} is position {idx[0]}, but "
                f"ds.sampler() resumed at position {first}: the loader skipped requests the sampler had skipped "
                "already (torchdata's StatefulDataLoader fast-forwards a batch_sampler it cannot restore, such as "
                "torch's BatchSampler over ds.sampler()). Give the loader sampler=ds.sampler() and batch_size "
                "instead; nothing was served")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: every sample undelivered again, the tie-breaks seeded anew.

        Call it before each epoch's first request (as with ``DistributedSampler``):
        requests after every sample of the epoch was delivered are refused.
        Distributed, every rank calls it: it waits for every rank to finish the
        epoch before, and for every rank to set the new one (an owner refuses
        requests of another epoch than its own).

        Args:
            epoch: the epoch, an integer >= 0.

        Raises:
            InvalidArgumentError: ``epoch`` is negative or not an integer.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 1 << 64:
            raise errors.InvalidArgumentError(f"epoch={epoch!r}: expected an integer >= 0")
        server = self._live()
        self._barrier(f"every node to finish its epoch before set_epoch({epoch})")
        server.set_epoch(epoch)
        self._epoch = epoch
        self._resume.pop(epoch, None)
        self._resumed_at = None
        self._barrier(f"every node to set_epoch({epoch})")

    def state_dict(self) -> dict[str, Any]:
        """The server's state: epoch, samples read and delivered, the tie-break position.

        Take it between batches (after a training step). Loaded into a dataset
        over the same pack, with a budget giving the same layout, in any
        process, it makes requests for exactly the indices not yet requested
        in its epoch deliver exactly the samples not yet delivered, each once,
        and the same samples this dataset would have. :meth:`sampler` resumes
        from it (its first iteration of the state's epoch skips the requests
        already made: the samples served, requests being served in order);
        resume any other sampler so that it asks for the rest of its epoch's
        permutation (a ``StatefulDataLoader`` saves and resumes both).
        With DataLoader workers, the batches they prefetched count as
        delivered: take it at an epoch's end, or let a ``StatefulDataLoader``
        take the state (see the class's Resume).

        In a DataLoader worker (``StatefulDataLoader`` calls it there after
        each batch) it is the worker's part of the loader's state instead:
        ``{"kind": "worker", ..., "worker", "num_workers", "batch", "state"}``,
        the server's state right after this worker's last batch this epoch
        and that batch's place in the epoch (none before its first).

        Distributed, every rank calls it at the same step: each gives the
        samples prefetched into its remote memory back to their owners, waits
        for the others, takes its server's state (the samples it owns; those
        given back are in it, read again on resume) and waits again. Each
        rank's state is its own: load it into the same rank of a cluster of
        the same size and budget. The state also holds how many requests of
        :meth:`sampler`'s share were made (``issued``): the sampler resumes
        after them. With ``num_workers=0`` that count is exact; with workers
        the batches they prefetched count as made.

        Returns:
            A dict of str, int and base64 str values (``torch.save`` and JSON both keep it).

        Example::

            >>> torch.save({"model": model.state_dict(), "data": ds.state_dict()}, "ckpt.pt")
        """
        if self._in_worker():
            return self._worker_state()
        server = self._live()
        if not self.distributed:
            return server.state()
        try:
            server.dist_drop()
        except errors.EngineUnavailableError as e:
            raise self._node_failed(e) from None
        self._barrier("every node to give its prefetched samples back before state_dict")
        state = server.state()
        self._barrier("every node to take its state_dict")
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from a :meth:`state_dict` (the dataset's seed becomes the state's).

        In a DataLoader worker (``StatefulDataLoader`` resuming), ``state_dict``
        is the worker's part: it goes to the main process's server, which
        waits for every worker's part, up to ``timeout`` seconds, and restores
        the state of the latest batch among them (parts of an older version:
        the union of the positions they delivered); this call returns then.

        Args:
            state_dict: what :meth:`state_dict` returned, in this process or another.

        Raises:
            TypeError: ``state_dict`` is not a mapping.
            InvalidArgumentError: the state is of another pack, of a budget giving
                another layout, of another rank or cluster size, or inconsistent (the
                message says what differs); a worker's part given to the main process,
                or a main process's state to a worker; the workers' parts are of other
                epochs or loaders.
            EngineUnavailableError: in a worker, the other workers' parts did not come
                within ``timeout`` (naming the workers missing).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping from ChunkDataset.state_dict(), got {type(state_dict).__name__}")
        try:
            state = json.loads(json.dumps(dict(state_dict)))
        except (TypeError, ValueError) as e:
            raise errors.InvalidArgumentError(f"state_dict: not a ChunkDataset state ({e})") from None
        if self._in_worker():
            self._worker_restore(state)
            return
        if state.get("kind") == "worker":
            raise errors.InvalidArgumentError(
                f"state_dict: DataLoader worker {state.get('worker')}'s part of a StatefulDataLoader's state, loaded "
                "into the main process's ChunkDataset: load the StatefulDataLoader's own state_dict into a "
                "StatefulDataLoader over this dataset (loader.load_state_dict(...)); its workers restore the "
                "dataset from their parts")
        world = int(state.get("world", 1) or 1)
        if world != self._share()[1] or (world > 1 and int(state.get("rank", -1)) != self._share()[0]):
            raise errors.InvalidArgumentError(
                f"state_dict: the state of rank {state.get('rank', 0)} of a cluster of {world} node(s); this "
                f"ChunkDataset is rank {self._share()[0]} of {self._share()[1]}: load each rank's state into that rank")
        self._live().restore(state)  # distributed: every rank loads its own, then waits for the others
        self.seed = int(state.get("seed", self.seed))
        self._epoch = int(state.get("epoch", 0))
        self._resume = {self._epoch: self._issued(state)}
        self._barrier("every node to load its state_dict")

    @staticmethod
    def _issued(state: Mapping[str, Any]) -> int:
        """How many requests of :meth:`sampler`'s share a state's epoch made before it was taken."""
        if "issued" in state:  # a distributed node counts them (loader/dist/node.go Issued)
            return int(state["issued"])
        # One node: a batch is served whole or not at all, in request order, so the
        # samples served this epoch answered the first ``served`` positions of the order.
        return int(state.get("served", 0))

    def stats(self) -> dict[str, Any]:
        """The server's counters: this epoch's ``served``, ``chunk_reads`` (of them
        ``ahead_reads`` started by the read-ahead, before a request needed them), ``bytes_read``,
        ``wasted_bytes``, ``bytes_delivered``; memory now (``held_bytes``,
        ``in_flight_bytes``) and at most (``peak_bytes``, over the server's life),
        against ``budget``; sample memory kept idle for reuse beside the budget (at
        most its read share), now and at most (``idle_sample_bytes``,
        ``peak_idle_sample_bytes``). Distributed, ``served`` counts the samples of this rank's
        slots, to any rank, and ``dist`` this node's: ``local_requests``,
        ``remote_hits`` (served from prefetched samples), ``remote_misses`` (asked
        of their owner), ``remote_requests`` (calls to owners), ``prefetched``,
        ``served_remote`` and ``prefetch_sent`` (as owner), ``remote_held_bytes``,
        ``remote_peak_bytes`` against ``remote_limit``."""
        return self._live().stats()

    def __repr__(self) -> str:
        dist = f", rank={self.rank}, world_size={self.world_size}" if self.distributed else ""
        return (f"ChunkDataset({self.root!r}, memory_budget={self.memory_budget}, seed={self.seed}, "
                f"with_index={self.with_index}, overflow={self.overflow}{dist})")

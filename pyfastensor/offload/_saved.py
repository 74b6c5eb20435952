"""What pack returns and unpack restores: entries (one per saved storage) and handles.

An :class:`Entry` stands for one storage that autograd saved (deduplicated:
two saves of the same storage at the same version share one entry). It is
either *resident* (kept in memory: a scheduling decision) or *stored* in a
slot of the native store. A :class:`Saved` handle (what pack returns) holds
its entry and the view to rebuild: shape, strides, storage offset, dtype.

Lifetime: autograd drops a handle when it no longer needs the saved tensor
(after backward, or when the graph is freed). When the last handle of an
entry goes, the entry's finalizer frees its slot. The finalizer does not
refer to the entry (only to the :class:`Held` part, which the store's
pending map shares), so an entry can die while its write is in flight:
freeing then waits for the write before the source memory is let go.

Reads: the storage restored by a handle's first unpack stays in memory
while the entry's other handles have not unpacked yet (a ReLU's output is
also the next layer's input), so each slot is read once per backward; a
later unpack (``retain_graph``) reads again if nothing holds it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NoSpaceError
from . import _staging, codecs
from ._pool import BufferPool
from ._store import SpillStore
from ._version import Version


class Meter:
    """Bytes of saved tensors held in the tensors' device memory because of us, and their peak.

    ``now`` and ``peak`` count device memory: the entries kept resident, the
    copies brought back (prefetched or restored) and, for CPU tensors, whose
    device memory is host memory, the payloads being written and the buffers
    read back. The pinned host buffers a CUDA payload passes through (its
    copy being written, a read-back on its way up) are host memory: they
    are counted in ``host`` only, which prefetching adds to ``now`` to
    bound how far it reads ahead. The source of a device-to-host copy in
    flight is not counted: torch's allocator frees it when the copy ends.

    Counted per storage, not per tensor object: a payload and the tensors
    decoded over it (aliases and views share its storage) count once, from
    :meth:`track` until the storage itself is freed (a finalizer on the
    storage, whose Python object lives as long as its memory provided
    nothing holds a torch ``StorageWeakRef`` to it: see
    :class:`pyfastensor._torch.StorageRef`).
    """

    def __init__(self) -> None:
        # Reentrant: the finalizers that count a storage out (:meth:`_untrack`, :meth:`sub`) run
        # when the garbage collector frees it, which can be on this thread inside any method here.
        self._lock = threading.RLock()
        self.now = 0
        self.peak = 0
        self.host = 0  # pinned host buffers holding saved tensors' bytes (not in now or peak)
        self._tracked: set[int] = set()  # data_ptr of storages counted by track()

    def add(self, n: int, host: bool = False) -> None:
        with self._lock:
            if host:
                self.host += n
                return
            self.now += n
            self.peak = max(self.peak, self.now)

    def sub(self, n: int, host: bool = False) -> None:
        with self._lock:
            if host:
                self.host -= n
            else:
                self.now -= n

    @property
    def ahead(self) -> int:
        """Bytes prefetching counts against its window: device bytes plus pinned ones."""
        return self.now + self.host

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.now

    def track(self, t: torch.Tensor) -> None:
        """Count the bytes of ``t``'s storage until that storage is freed (once per storage)."""
        storage = t.untyped_storage()
        key, n = storage.data_ptr(), storage.nbytes()
        with self._lock:
            if n == 0 or key in self._tracked:
                return
            self._tracked.add(key)
        self.add(n)
        weakref.finalize(storage, self._untrack, key, n)

    def track_host(self, t: torch.Tensor) -> None:
        """Count ``t`` (a pinned buffer taken from a pool) in :attr:`host` until the tensor
        object ``t`` is freed: the pool's storage outlives it, so it is not tracked by storage."""
        n = t.numel() * t.element_size()
        self.add(n, host=True)
        weakref.finalize(t, self.sub, n, True)

    def _untrack(self, key: int, n: int) -> None:
        with self._lock:
            self._tracked.discard(key)
        self.sub(n)


class Held:
    """A slot and the memory pinned for it until its write completes.

    ``keep`` is the payload being written (for the raw codec, a byte view of
    the saved storage itself; for a CUDA tensor, its pinned host copy, which
    ``host`` says); it is dropped once the write is done, so the memory can
    be freed. After a failed write (full disk) it stays: the tensor then
    simply lives in memory.
    """

    __slots__ = ("failed", "host", "keep", "lock", "meter", "released", "report", "slot", "store")

    def __init__(self, store: SpillStore, slot: int, keep: torch.Tensor, meter: Meter,
                 report: Callable[[NoSpaceError], None], host: bool = False) -> None:
        self.store = store
        self.report = report  # told of a full disk found only when the slot is freed
        self.slot = slot
        self.keep: torch.Tensor | None = keep
        self.failed = False
        self.released = False  # the slot is freed: nothing to read back
        self.meter = meter
        self.lock = threading.Lock()
        self.host = host  # keep is a pinned host copy, not the device's memory
        meter.add(keep.numel(), host)

    def written(self) -> None:
        """The write completed: let the payload go."""
        with self.lock:
            keep, self.keep = self.keep, None
        if keep is not None:
            self.meter.sub(keep.numel(), self.host)

    def release(self, pending: dict[int, Held]) -> None:
        """Free the slot (waiting for its write), then let the payload go. Runs once."""
        with self.lock:
            if self.released:
                return
            self.released = True
        if pending.pop(self.slot, None) is not None and not self.store.closed:
            try:  # nobody has looked at this write's outcome yet
                self.store.wait(self.slot)
            except NoSpaceError as e:
                self.report(e)
        try:
            self.store.free(self.slot)
        finally:
            self.written()


class Entry:
    """One saved storage: resident, or stored in a slot (see the module docstring)."""

    __slots__ = ("__weakref__", "device", "enc", "held", "hosted", "index", "kept", "meter", "nbytes", "payload_nbytes",
                 "pool", "prefetched", "reclaim", "recompute", "relu", "resident", "roots", "seen", "staging", "stashed",
                 "storage_ref", "waiting", "decode_seconds")

    def __init__(self, index: int, nbytes: int, device: torch.device, meter: Meter,
                 storage_ref: Any, relu: bool, pool: BufferPool) -> None:
        self.index = index
        self.pool = pool
        self.nbytes = nbytes
        self.device = device
        self.meter = meter
        self.storage_ref = storage_ref  # StorageRef: tells when the address may be reused
        self.relu = relu
        self.resident: torch.Tensor | None = None
        self.enc: codecs.Encoded | None = None  # metadata only: its payload is empty
        self.payload_nbytes = 0  # bytes in the slot
        self.held: Held | None = None
        # Host tier (accelerator tensors under tier="host", and policy="planned"'s
        # host tier): the bytes in a pinned host buffer, copied there (and
        # back) by ``staging``; no store slot.
        self.hosted: torch.Tensor | None = None
        self.staging: _staging.Staging | None = None
        self.reclaim: Callable[[], bool] | None = None  # lets a pinned buffer go (PinnedPool.take)
        self.prefetched: Any = None  # a read-back buffer, or the host tier's Upload
        # (key, GPU source) while the forward stash (:mod:`._stash`) keeps the source: unpack
        # then uses it and uploads nothing.
        self.stashed: tuple[int, torch.Tensor] | None = None
        self.roots: list[weakref.ref[torch.Tensor]] = []  # restored storages still alive
        self.seen = False  # unpacked at least once in this step
        # Handles (Saved) not unpacked yet, and the restored storage held for
        # them: a storage saved by two nodes (a ReLU's output, the next
        # layer's input) is read once, not once per node.
        self.waiting = 0
        self.kept: torch.Tensor | None = None
        self.decode_seconds = 0.0  # the last decode's time (the profiling step records it)
        # policy="auto": the recipe bound to this step's sources (:class:`._recompute.Bound`); the
        # storage is neither kept nor stored but made again by restore().
        self.recompute: Any = None

    def handle_done(self, root: torch.Tensor | None) -> None:
        """A handle unpacked for the first time (``root``: what it got) or died unpacked (None).

        Keeps ``root`` in memory while other handles of the entry have yet
        to unpack it; lets it go with the last of them.
        """
        self.waiting -= 1
        if self.waiting > 0:
            if root is not None:
                self.kept = root
        else:
            self.kept = None

    @property
    def stored(self) -> bool:
        return self.held is not None

    def stage(self, payload: torch.Tensor, staging: _staging.Staging, enc: codecs.Encoded | None = None) -> None:
        """Host tier: copy ``payload`` (the storage's bytes, or ``enc``'s encoding of them) into a
        pinned host buffer and keep only that: the buffer is the stored copy.

        The copy runs on the staging's side stream and nothing waits for it
        here; the source's memory is marked in use there, so it is not
        reused before the copy has read it, and the upload on unpack, on the
        same stream, follows it.
        """
        self.hosted, _ = staging.to_host(payload)
        self.staging = staging
        enc = enc if enc is not None else codecs.encode(payload, "raw")
        self.enc = codecs.with_payload(enc, torch.empty(0, dtype=torch.uint8))
        self.payload_nbytes = payload.numel() * payload.element_size()

    def _upload(self) -> _staging.Upload:
        """Issue the host tier's bytes' copy back to the entry's device (a copy of their own),
        counted by the meter from now on."""
        hosted, staging = self.hosted, self.staging
        assert hosted is not None and staging is not None
        up = staging.to_device(hosted, self.device)
        if up.out.untyped_storage().data_ptr() == hosted.untyped_storage().data_ptr():
            up.out = up.out.clone()  # host memory is the device's: never hand out the tier's buffer
        self.meter.track(up.out)
        return up

    def root(self) -> torch.Tensor | None:
        """A tensor over this entry's bytes that is already in memory, if any."""
        if self.resident is not None:
            return self.resident
        held = self.held
        if (held is not None and held.keep is not None and self.enc is not None and self.enc.codec == "raw"
                and self.staging is None):  # a staged entry's keep is its host copy, not its memory
            return held.keep
        for ref in self.roots:
            t = ref()
            if t is not None:
                return t
        self.roots.clear()
        return None

    def _buffer(self) -> torch.Tensor:
        """Host memory to read the slot into, counted by the meter: pinned when the entry goes
        back to an accelerator (host memory, not the device's).

        CPU read-backs come from the offload object's pool: mappings
        reused step after step, already faulted in, page-aligned.
        """
        if self.staging is not None:
            buf = self.staging.pinned(self.payload_nbytes, self.reclaim)
            self.meter.track_host(buf)
            return buf
        buf = self.pool.take(self.payload_nbytes)
        self.meter.track(buf)
        return buf

    def prefetch_staged(self) -> int:
        """:meth:`prefetch` for entries staged through pinned memory (accelerator tensors) not
        yet unpacked; 0 for others."""
        if self.staging is None or self.seen:
            return 0
        return self.prefetch()

    def prefetch(self) -> int:
        """Start reading the slot into a fresh buffer; return the bytes asked for (0 if none)."""
        if self.hosted is not None:
            if self.prefetched is not None or self.stashed is not None or self.root() is not None:
                return 0
            self.prefetched = self._upload()
            return self.payload_nbytes
        held = self.held
        if held is None or held.keep is not None or self.prefetched is not None or self.enc is None:
            return 0
        if self.root() is not None or held.released:
            return 0
        buf = self._buffer()
        held.store.prefetch(held.slot, buf.data_ptr(), buf.numel())
        self.prefetched = buf
        return buf.numel()

    def restore(self) -> torch.Tensor:
        """The entry's bytes as a 1-D tensor (uint8 or the encoded dtype) in memory."""
        root = self.root()
        if root is not None:
            return root
        if self.recompute is not None:
            started = time.perf_counter()
            root = self.recompute.run(self.device)
            self.decode_seconds = time.perf_counter() - started
            if root.numel() != self.nbytes:
                raise RuntimeError(f"pyfastensor.offload: a recomputed saved tensor has {root.numel()} bytes, "
                                   f"the one saved had {self.nbytes}: the step is not the profiled one")
            self.meter.track(root)
            self.roots.append(weakref.ref(root))
            return root
        held, enc = self.held, self.enc
        if self.hosted is not None and enc is not None and self.staging is not None:
            up, self.prefetched = self.prefetched, None
            if up is None:
                up = self._upload()
            root = codecs.decode(codecs.with_payload(enc, self.staging.join(up, self.device)))
            root = root if root._base is None else root._base
            self.roots.append(weakref.ref(root))
            return root
        assert held is not None and enc is not None
        if held.released:
            raise RuntimeError(
                "pyfastensor.offload: this saved tensor was released when its step's context exited "
                "with an exception; run backward inside a context that completed"
            )
        with held.lock:
            payload = held.keep
        if payload is None:
            payload = self.prefetched
            self.prefetched = None
            if payload is None:
                payload = self._buffer()
            held.store.get(held.slot, payload.data_ptr(), payload.numel())
        if self.staging is not None:  # pinned buffer (read back, or still being written), side stream
            payload = self.staging.join(self.staging.to_device(payload, self.device), self.device)
            self.meter.track(payload)  # the device's copy (the pinned one was counted as host memory)
        started = time.perf_counter()
        flat = codecs.decode(codecs.with_payload(enc, payload))
        self.decode_seconds = time.perf_counter() - started
        root = flat if flat._base is None else flat._base
        if root is not payload and root is not held.keep:
            self.meter.track(root)
        self.roots.append(weakref.ref(root))
        return root


class Saved:
    """What pack returns: an entry and the view of its storage autograd saved.

    For a resident entry the handle holds the saved tensor itself, and
    unpack returns it unchanged.
    """

    __slots__ = ("dtype", "entry", "offset", "size", "stride", "tensor", "unpacked", "version")

    def __init__(self, entry: Entry, t: torch.Tensor) -> None:
        self.entry = entry
        self.version = Version(t)  # checked at each unpack, as torch checks what it saves itself
        self.tensor = t if entry.resident is not None else None
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()
        self.dtype = t.dtype
        self.unpacked = self.tensor is not None  # resident: nothing to wait for
        if not self.unpacked:
            entry.waiting += 1

    def first_unpack(self, root: torch.Tensor) -> None:
        """Called on each unpack; counts the first one towards the entry's handles."""
        if not self.unpacked:
            self.unpacked = True
            self.entry.handle_done(root)

    def __del__(self) -> None:
        if not self.unpacked:  # dropped by autograd without being unpacked
            self.unpacked = True
            self.entry.handle_done(None)

    def view_of(self, root: torch.Tensor) -> torch.Tensor:
        """Rebuild the saved view (shape, strides, offset, dtype) over ``root``'s storage.

        ``root`` is a 1-D tensor at storage offset 0. The result is a view
        of it (so it keeps ``root`` alive) whenever the storage holds a whole
        number of elements of the view's dtype.
        """
        nbytes = root.numel() * root.element_size()
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        if root.storage_offset() == 0 and root.dim() == 1 and nbytes % itemsize == 0:
            return root.view(self.dtype).as_strided(self.size, self.stride, self.offset)
        out = torch.empty(0, dtype=self.dtype, device=root.device)
        return out.set_(root.untyped_storage(), self.offset, self.size, self.stride)

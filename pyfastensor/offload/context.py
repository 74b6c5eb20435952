"""``pyfastensor.offload``: saved activations to SSD or host memory during training.

:class:`Offload` is the context and its saved-tensor hooks. What it asks
of others: the options' checks (:mod:`._options`), the ``policy=`` mode's
decisions (:mod:`._policy`, one object per mode), the shared stores
(:mod:`._sharing`), the step's state (:mod:`._step`), the writes in flight
and full disks (:mod:`._writes`) and the summary (:mod:`._report`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from types import TracebackType
from typing import Any

import torch
from torch import nn

from .. import config
from .._device import PinnedPool
from .._torch import StorageRef, holds_no_data
from ..errors import NoSpaceError
from . import _options, _sharing, _staging, codecs
from ._filter import ModuleWatch, is_parameter, is_relu_output, storages_of, supported
from ._order import PlannedPrefetcher, Prefetcher
from ._pool import BufferPool
from ._profile import Recorder
from ._recast import Recast
from ._recompute import Bound, Unbound
from ._report import summarize
from ._saved import Entry, Meter, Saved
from ._stash import Stash
from ._step import Step
from ._store import SpillStore
from ._version import Kept, Version
from ._writes import Writes
from .summary import OffloadSummary

_EMPTY = torch.empty(0, dtype=torch.uint8)


class Offload:
    """Offload the tensors autograd saves for backward, over saved-tensor hooks.

    Enter the context around each training step (forward and backward): the
    tensors autograd saves are written asynchronously to a store (one
    unlinked spill file, or host memory), dropped from memory once written,
    and read back when backward needs them, prefetched in the order the
    first step (the profiling step) unpacked them. The same object is
    re-entered for every step. The store is one per process and spill
    configuration (tier, ``spill_dir``, engine choice), shared by the
    offload objects that ask for the same one and kept from step to step:
    the spill file grows to the largest step and its space is reused.
    :meth:`summary` describes the last step (this object's own transfers
    over that step, from its account in the store). :meth:`close` releases the store, as does the last object
    using it going away. An exception inside the context frees the step's
    slots at once (and closes the store if no other object uses it and no
    earlier step's graph holds slots in it: a skipped micro-batch leaves
    the one before it to its backward).
    ``policy="none"`` opens no store.

    Accelerator (CUDA) tensors are copied through pinned host memory on a
    side stream of the object's own, ordered by events: neither pack nor
    unpack waits for a copy on the CPU, and uploads are issued ahead of
    backward. With ``tier="host"`` the pinned buffer a tensor is copied
    into is its stored copy. The object's pinned pool is grown in its first
    step (after the profiling step, for ``"scheduled"`` and ``"planned"``)
    and reused after it, bounded by ``PYFASTENSOR_OFFLOAD_PINNED``;
    :meth:`close` lets it go.

    ``policy="planned"`` is G10's tensor migration (the G10 paper's sections 4.2
    to 4.4) at run time. The profiling step offloads every eligible tensor
    while recording the saved tensors (pack order, sizes), their unpack
    order in backward, grouped by backward node, and the compute time
    between hooks, and measures the spill store's bandwidths. From that it
    builds a trace (:class:`pyfastensor.plan.Trace`: each saved tensor
    written by the forward op that saved it and read by the backward nodes
    that unpack it) and hardware (device memory = ``budget``; host memory
    = ``host_bytes``; the SSD's bandwidths as measured), and G10's planner
    (:func:`pyfastensor.plan.make_plan`) decides for each saved tensor:
    stay resident, go to the SSD (the spill store), or to host memory
    (pinned buffers through a side stream; on CPU tensors, plain host
    memory), and the op at which its prefetch starts (a pack in forward or
    the first unpack of a backward node). Later steps carry that out:
    writes start at pack, prefetches at their planned points, each waiting
    while the resident saved tensors plus it would exceed the budget. It
    migrates the *saved tensors* only (activations autograd keeps for
    backward); parameters, gradients and optimizer state stay where torch
    keeps them. No codec: gradients are bit-identical to training without
    offload. A budget below what one op of the step needs at once (the
    largest saved tensor, or the tensors one backward node holds together)
    is not met by falling back: entering the context after the profiling
    step raises :class:`~pyfastensor.InvalidArgumentError` naming the budget
    and the need, and so does every later entry. Saved tensors the profiled
    step did not have (a changed graph) go to the store as they are.

    Without lossy compression, gradients are bit-identical to training
    without offload. Parameters and buffers are never offloaded; the same
    storage saved twice is written once; views come back with their shape,
    strides, storage offset and dtype; unpack may run more than once
    (``retain_graph``, double backward); a slot is freed when autograd drops
    the saved tensor.

    Args:
        tier: ``"ssd"`` (spill file in ``spill_dir``), ``"host"`` (host memory:
            for CPU tensors, memory owned by the native library; for
            accelerator tensors, the pinned buffers their device-to-host
            copies land in, kept as the stored copy) or ``"auto"`` (ssd, unless
            ``spill_dir`` is itself memory: tmpfs). Default ``"ssd"``.
        spill_dir: directory of the spill file. Default: the system's
            temporary directory. Checked when the context is entered.
        budget: bytes of saved tensors that may stay resident in the
            tensors' device memory (GPU memory for CUDA tensors: pinned
            host copies are not counted). With ``policy="all"``, pack waits
            for the oldest writes while more is resident (a CPU tensor's
            writes in flight included; a CUDA tensor's write, from its
            pinned copy, frees no device memory and is never waited for),
            and prefetching stays within it, pinned read-backs counted
            (default: no wait, and a prefetch window of twice the
            largest offloaded tensor); with ``"scheduled"`` the scheduler
            keeps tensors resident up to it; with ``"planned"`` it is the
            device memory G10 plans for (required for both).
        min_size: tensors smaller than this many bytes stay in memory.
            Default 1 MiB.
        policy: ``"all"`` offloads every eligible tensor; ``"scheduled"``
            lets the FlashNeuron scheduler choose after the profiling step;
            ``"planned"`` follows G10's migration plan made after the
            profiling step (see above; ``tier`` ``"ssd"`` or ``"auto"``, no
            compression); ``"none"`` offloads nothing and only measures.
            Default ``"all"``.
        compression: None, ``"fp16"`` (lossy, float32 only),
            ``"sparse"`` (lossless, ReLU outputs) or ``("fp16", "sparse")``.
        dictionary: the adaptive dictionary picking the spill engine per
            size, for writes and reads alike: ``"wr"`` (write+read, default),
            ``"w"`` (write) or ``"r"`` (read). Aware mode: the first
            transfers of a size explore each engine that works in
            ``spill_dir``, later ones use the fastest; measurements persist
            in this machine's dictionary file for that filesystem
            (``python -m pyfastensor dict show``). Unused with ``engine=``.
        on_full: ``"warn"`` (default): when the spill filesystem is full,
            keep the tensor in memory and warn once; ``"raise"``: raise
            :class:`~pyfastensor.NoSpaceError`.
        module: a module whose parameters and buffers must never be
            offloaded, recognised by storage. Without it, the parameters
            and buffers of every module whose forward runs inside the
            context are recognised the same way (a global forward
            pre-hook, active only inside the context), besides
            ``nn.Parameter`` and leaves that require grad; a buffer used
            by code outside any module's forward is not.
        engine: force one spill engine (``"posix"``, ``"direct"``...)
            instead of the dictionary's choice.
        verbose: print the scheduler's plan when it is made.
        host_bytes: ``policy="planned"`` with ``tier="auto"`` only: host
            memory G10 may use as its host tier. Default: the available
            host memory (``MemAvailable``) for accelerator tensors, 0 for
            CPU tensors (their memory is host memory already). With
            ``tier="ssd"`` there is no host tier.
        stash_bytes: ``policy="all"`` with accelerator tensors kept in
            pinned buffers (``tier="host"``): bytes of the last saved
            tensors packed whose GPU memory is also kept (the forward
            stash), the oldest let go first. Their device-to-host copies
            are issued as for the others; backward, which unpacks the last
            packed first, uses the ones still kept as they are, with no
            host-to-device copy. ``0`` turns the stash off. Default: twice
            the largest tensor offloaded (capped by ``budget``), the
            window prefetching holds at backward's start anyway: the stash
            counts in that window (and in ``resident_peak_bytes``), so
            backward starts on the stashed tensors instead of on uploads
            without holding more. Cleared when backward ends and when the
            context exits.
        recast: a saved tensor that is a cast of a parameter to another
            dtype (what ``torch.autocast`` saves of each weight a matmul
            uses) is not stored: backward casts the parameter again, which
            gives the same bits, and no copy goes either way. A parameter
            changed in place between forward and backward then makes
            backward raise ``RuntimeError``; a cast older than its
            parameter (made before the step, as autocast's weight cache
            keeps one across an optimizer step in its region) is stored.
            ``False`` stores such casts like any other tensor. Default ``True``.

    Raises:
        ValueError: for an unknown option value (the message names it).
        PermissionDeniedError, NotFoundError, FastensorError: on entry,
            when ``spill_dir`` cannot hold the spill file.
        InvalidArgumentError: with ``policy="planned"``, on entry after the
            profiling step, when the budget is infeasible (see above).
        RuntimeError: in backward, torch's own error when a saved tensor
            was changed in place since it was saved (torch skips that check
            under saved-tensor hooks; offload keeps it).

    Example::

        >>> import torch, pyfastensor
        >>> model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU())
        >>> off = pyfastensor.offload(min_size=64 << 10, module=model)
        >>> for _ in range(2):
        ...     with off:
        ...         model(torch.randn(256, 512)).sum().backward()
        >>> off.summary().offloaded_tensors
        2
    """

    def __init__(
        self,
        *,
        tier: str = "ssd",
        spill_dir: str | None = None,
        budget: int | None = None,
        min_size: int = 1 << 20,
        policy: str = "all",
        compression: None | str | tuple[str, ...] = None,
        dictionary: str = "wr",
        on_full: str = "warn",
        module: nn.Module | None = None,
        engine: str | None = None,
        verbose: bool = False,
        host_bytes: int | None = None,
        stash_bytes: int | None = None,
        recast: bool = True,
    ) -> None:
        _options.check(tier=tier, policy=policy, dictionary=dictionary, on_full=on_full, budget=budget,
                       compression=compression, host_bytes=host_bytes, min_size=min_size, stash_bytes=stash_bytes)
        self.tier, self.spill_dir, self.budget, self.min_size = tier, spill_dir, budget, min_size
        self.policy, self.dictionary, self.on_full = policy, dictionary, on_full
        self.compression = _options.compression(compression)
        self.module, self.engine, self.verbose = module, engine, verbose
        self.host_bytes, self.stash_bytes, self.recast = host_bytes, stash_bytes, recast
        self._policy = _options.policy_for(policy, compression=self.compression, budget=budget, host_bytes=host_bytes,
                                        tier=tier, verbose=verbose)
        self._staging: _staging.Staging | None = None  # planned's host tier; None: the device's (tests set a fake)
        # Accelerator tensors' copies through pinned memory; None: this object's own (made on first
        # use). Tests set a fake here, which stages every tensor, CPU ones included, as a CUDA
        # tensor would be.
        self._device_staging: _staging.Staging | None = None
        self._own_staging: _staging.Staging | None = None
        self._pinned_base = 0  # the staging pool's allocations when the step began
        self._device: torch.device | None = None  # of the saved tensors stored in the profiling step
        self.step = 0
        self._lock = threading.RLock()
        self._active = False
        # Without module=: the modules run in each step (one global hook, kept until close()).
        self._watch: ModuleWatch | None = None
        self._unwatch: weakref.finalize | None = None
        self._store: SpillStore | None = None  # kept across steps; None before the first and after close
        self._closed_store: SpillStore | None = None  # closed (exception, close()): the summary's stats
        self._base: dict[str, Any] = {}  # this object's account's totals when the step began
        self._account = 0  # this object's account in its store (SpillStore.account)
        self._meter = Meter()
        self._writes = Writes(on_full, self._meter)
        self._pool = BufferPool()  # read-back buffers, reused across steps
        self._stash = Stash(stash_bytes, budget, self._meter)  # the forward stash (tier="host", CUDA)
        self._graph: Any = None  # the op recorder of "auto"'s profiling step, while it runs
        self._order: list[int] | None = None  # unpack order of the profiling step
        self._order_count = 0  # stored entries in the profiling step
        self._summary = OffloadSummary()
        self._reset_step()

    @property
    def _recorder(self) -> Recorder | None:
        """The profiling step's record (None in other steps); the writes report to it too."""
        return self._writes.recorder

    @_recorder.setter
    def _recorder(self, rec: Recorder | None) -> None:
        self._writes.recorder = rec

    @property
    def _entries(self) -> list[weakref.ref[Entry]]:
        """The step's entries, by pack index."""
        return self._step.entries

    # -- context -------------------------------------------------------------

    def __enter__(self) -> Offload:
        if self._active:
            raise RuntimeError("pyfastensor.offload is not reentrant: exit the context before entering it again")
        self._learn_from_last_step()
        self._policy.begin_step()
        if self._policy.uses_store and (self._store is None or self._store.closed):
            self._store, self._account = _sharing.join(self, tier=self.tier, spill_dir=self.spill_dir,
                                                       engine=self.engine, dictionary=self.dictionary)
        self._closed_store = None
        self._base = self._store.stats(self._account) if self._store is not None else {}
        self._pool.lend_idle()  # reclaimable during forward; reused without faults if not reclaimed
        self._reset_step()
        pinned = self._pinned_pool()
        self._pinned_base = pinned.allocations + pinned.overflows if pinned is not None else 0
        if self._policy.profiles():
            self._recorder = Recorder(self.compression)  # this is the profiling step
        self._registered = storages_of(self.module)
        if self.module is None:
            if self._watch is None:
                self._watch = ModuleWatch()
                self._unwatch = weakref.finalize(self, self._watch.remove)
            self._watch.start(self._registered)
        self._graph = self._policy.op_recorder(self._registered)  # "auto"'s profiling step records its ops
        if self._graph is not None:
            self._graph.__enter__()
        self._hooks = (torch.autograd.graph.saved_tensors_hooks(*_never_compiled(self._pack, self._unpack))
                       if self._policy.needs_hooks() else contextlib.nullcontext())
        self._hooks.__enter__()
        self._active = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        hooks, self._hooks = self._hooks, None  # no cycle through the bound hooks
        hooks.__exit__(exc_type, exc, tb)
        graph, self._graph = self._graph, None
        if graph is not None:
            graph.__exit__(exc_type, exc, tb)
        self._stash.clear()
        if self._watch is not None:
            self._watch.stop()
        self._active = False
        self._step.ended = time.perf_counter()
        if self._recorder is not None:
            self._recorder.end = time.perf_counter()
        store = self._store
        try:
            if store is not None and exc_type is not None:
                self._abandon_step(store)
            elif store is not None:
                try:
                    self._writes.settle_all(store)
                    self._writes.raise_late()
                except BaseException:  # a full disk with on_full="raise": the step failed here
                    self._abandon_step(store)
                    raise
                self._prefetch_after(None)  # forward is done: backward's first reads can start
                self._reach(self._policy.at_backward())
                pinned = self._pinned_pool()
                if pinned is not None and self._recorder is None:  # a step as later ones will be
                    pinned.seal()
        finally:
            self._summary = self._make_summary(store)
            self.step += 1
        if exc_type is None:
            self._policy.stepped(self._summary)

    def close(self) -> None:
        """Stop using the store; close it (spill file or host memory, native
        handle) unless another offload object of the process uses it.

        Saved tensors of a graph that is still alive can no longer be
        unpacked once the store is closed (backward raises, naming the
        cause). Entering the context again opens a store again. Without
        ``close()``, the store goes when the last object using it and the
        last saved tensor in it are garbage collected.

        Raises:
            RuntimeError: inside the context.
        """
        if self._active:
            raise RuntimeError("pyfastensor.offload: close() inside the context; exit it first")
        self._pool.clear()
        if self._unwatch is not None:
            self._unwatch()  # the global hook goes
            self._watch = self._unwatch = None
        own, self._own_staging = self._own_staging, None
        if own is not None:
            own.close()
        self._drop_store()

    def _staging_for(self, device: torch.device) -> _staging.Staging | None:
        """The copies through pinned memory of saved tensors on ``device``: this object's own
        staging (one side stream, one pinned pool) for an accelerator, None for the CPU."""
        if self._device_staging is not None:
            return self._device_staging
        if device.type == "cpu":
            return None
        if self._own_staging is None:
            self._own_staging = _staging.Staging(pool_limit=config.offload_pinned())
        return self._own_staging

    def _pinned_pool(self) -> PinnedPool | None:
        st = self._device_staging or self._own_staging
        return st.pool if st is not None else None

    def _drop_store(self) -> None:
        """Stop using the store; close it if no other offload object uses it."""
        store, self._store = self._store, None
        if store is not None:
            self._closed_store = store
            _sharing.leave(self, store)

    def _abandon_step(self, store: SpillStore) -> None:
        """A step that raised: nothing may leak. Its slots are freed now
        (waiting for writes in flight), and the store closed unless another
        offload object uses it or an earlier step's graph still holds slots
        in it (a micro-batch whose backward is still to come, when the user
        skips a failed one); a dead graph still referencing the failed
        step's entries raises if unpacked."""
        self._writes.release(self._step.entries)
        if not (set(store.users) - {self}) and not store.stats().get("live_slots", 0):
            self._drop_store()

    def _reset_step(self) -> None:
        self._step = Step()
        self._writes.new_step()
        self._meter.reset_peak()
        window = self.budget if self.budget is not None else 0  # 0: chosen at first unpack
        meter = self._meter  # not self: no reference cycle to keep the store alive
        self._prefetcher: Prefetcher | None
        self._planned_pf: PlannedPrefetcher | None
        self._prefetcher, self._planned_pf = self._policy.prefetchers(self._order, window, lambda: meter.ahead)

    def _learn_from_last_step(self) -> None:
        """After the profiling step: keep its unpack order for prefetching, and make the policy's plan."""
        if self._order is None and self._step.unpack_log:
            self._order = list(self._step.unpack_log)
            self._order_count = len(self._step.entries)
        self._policy.check()
        rec, self._recorder = self._recorder, None
        if rec is not None and rec.tensors:
            last = self._store or self._closed_store
            tier = last.description.get("tier", "ssd") if last is not None else "ssd"
            self._policy.learn(rec, tier=tier, device=self._device)

    # -- hooks ---------------------------------------------------------------

    def _pack(self, t: torch.Tensor) -> Any:
        if type(t) is not torch.Tensor and holds_no_data(t):  # torch.compile tracing the step: not a step's tensor
            return Kept(t)
        start = time.perf_counter()
        step = self._step
        graph = self._graph
        if graph is not None:
            graph.paused += 1  # the hooks' own ops are not the model's
        try:
            self._writes.drain(self._store)
            seq = step.counts["saved"]
            step.counts["saved"] += 1
            if (not supported(t) or t.numel() * t.element_size() < self.min_size
                    or is_parameter(t, self._registered)):
                step.counts["skipped"] += 1
                if graph is not None:
                    graph.packed(None, seq, t)
                if reads := self._policy.source_kept(seq):
                    step.hold_source("kept", seq, t, reads)
                return Kept(t)
            if self.recast and (again := step.casts.recast_of(t)) is not None:
                step.counts["recast"] += 1
                step.recast_bytes += t.untyped_storage().nbytes()
                return again
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes(), t._version, str(t.device))
            with self._lock:
                entry = step.live.get(key)
                if entry is not None and not entry.storage_ref.expired():
                    step.counts["dedup"] += 1
                else:
                    self._writes.hold_to_budget(self._store, self.budget, storage.nbytes())
                    entry = self._new_entry(t, storage)
                    step.live[key] = entry
                    if self._recorder is not None and entry.held is not None:
                        self._recorder.packed(entry.index, entry.held.slot, t, entry.nbytes, entry.relu, start)
                    if graph is not None:
                        graph.packed(entry.index, seq, t)
                    if reads := self._policy.source_entry(entry.index):
                        step.hold_source("entry", entry.index, (entry, Version(t)), reads)
                    self._reach(self._policy.at_pack(entry.index))
            return Saved(entry, t)
        finally:
            spent = time.perf_counter() - start
            step.pack_seconds += spent
            if self._recorder is not None:
                self._recorder.pack_done(spent)
            if graph is not None:
                graph.paused -= 1

    def _unpack(self, h: Any) -> torch.Tensor:
        if isinstance(h, Kept):
            return h.unpack()
        if isinstance(h, Recast):
            return h.restore()
        graph = self._graph
        if graph is None:
            return self._unpack_saved(h)
        graph.paused += 1
        try:
            graph.unpacking(h.entry.index)
            return self._unpack_saved(h)
        finally:
            graph.paused -= 1

    def _unpack_saved(self, h: Saved) -> torch.Tensor:
        h.version.check()
        if h.tensor is not None:
            entry = h.entry
            if not entry.seen and self._recorder is None:
                # A resident entry's node: a point of the plan, and the prefetches it lets go.
                with self._lock:
                    entry.seen = True
                    self._reach(self._policy.at_unpack(entry.index))
                    self._prefetch_after(entry)
            return h.tensor
        start = time.perf_counter()
        rec = self._recorder
        if rec is not None:
            rec.unpacking(h.entry.index)
        try:
            if self._active:
                self._writes.drain(self._store)
            entry: Entry = h.entry
            if entry.stashed is not None:
                served = self._stash.take(entry)
                self._step.stash_hits += served > 0
                self._step.stash_bytes += served
            self._stash.arm()
            held = entry.held
            if self._active and held is not None:
                self._writes.settle_if_done(held)
            with self._lock:
                if not entry.seen:  # the backward node that starts a plan's op may be unpacking
                    self._reach(self._policy.at_unpack(entry.index))
                recomputed = entry.recompute is not None and not entry.roots
                root = entry.restore()
                if recomputed:
                    self._step.recompute_seconds += entry.decode_seconds
                out = h.view_of(root)
                h.first_unpack(root)
                if rec is not None and held is not None and not held.store.closed:
                    rec.measured(held.slot, held.store.slot_info(held.slot))
                if not entry.seen:
                    if rec is not None and entry.enc is not None and entry.enc.codec != "raw":
                        rec.coded(entry.index, entry.enc.codec, entry.decode_seconds)
                    entry.seen = True
                    self._step.unpack_log.append(entry.index)
                    self._prefetch_after(entry)
            return out
        finally:
            spent = time.perf_counter() - start
            self._step.unpack_seconds += spent
            if rec is not None:
                rec.unpack_done(spent)

    # -- entries -------------------------------------------------------------

    def _new_entry(self, t: torch.Tensor, storage: torch.UntypedStorage) -> Entry:
        step = self._step
        nbytes = storage.nbytes()
        entry = Entry(len(step.entries), nbytes, t.device, self._meter, StorageRef(storage),
                      is_relu_output(t), self._pool)
        step.entries.append(weakref.ref(entry))
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        recipe = self._policy.recipe(entry, t)
        if recipe is not None:
            try:
                entry.recompute = Bound(recipe, step.sources, step.kept_sources, self._policy.params, self._registered,
                                        t)
            except Unbound:
                pass  # not the profiled graph after all: stored below, as it is
            finally:
                step.read_by(recipe)
            if entry.recompute is not None:
                step.counts["recomputed"] += 1
                step.recompute_bytes += nbytes
                return entry
        codec = self._policy.codec(entry, t)
        if codec is None:
            return self._keep(entry, raw)
        self._device = t.device
        staging = self._staging_for(t.device)
        if self._policy.to_host(entry.index):
            entry.stage(raw, self._staging or staging or _staging.for_device(t.device))
            step.counts["staged"] += 1
            step.staged_bytes += nbytes
            return entry
        started = time.perf_counter()
        enc = codecs.encode(raw if codec == "raw" else raw.view(t.dtype), codec)
        if codec != "raw" and enc.nbytes >= nbytes:  # did not pay: store as is
            enc = codecs.encode(raw, "raw")
        if self._recorder is not None and codec != "raw":  # what trying the codec cost
            self._recorder.coded(entry.index, codec, time.perf_counter() - started)
        store = self._store
        assert store is not None
        if staging is not None and self._recorder is None and store.description.get("tier") == "host":
            # The host tier of an accelerator tensor: the pinned copy is the stored one. (A
            # profiling step stores it in the native store, which measures its transfers.)
            entry.stage(enc.payload, staging, enc)
            entry.enc = codecs.with_payload(enc, _EMPTY)
            if self._policy.stashes and "fp16" not in enc.codec:  # lossless: the source is the same bytes
                self._stash.put(entry, raw)
            step.counts["offloaded"] += 1
            step.raw_bytes += nbytes
            step.staged_bytes += entry.payload_nbytes
            sizes = step.codec_bytes.setdefault(enc.codec, [0, 0])
            sizes[0] += nbytes
            sizes[1] += entry.payload_nbytes
            return entry
        try:
            payload = self._writes.start(store, self._account, entry, enc.payload, staging)
        except NoSpaceError as e:  # the file could not even grow
            self._writes.full_disk(e)
            return self._keep(entry, raw)
        entry.enc = codecs.with_payload(enc, _EMPTY)
        step.counts["offloaded"] += 1
        step.raw_bytes += nbytes
        sizes = step.codec_bytes.setdefault(enc.codec, [0, 0])
        sizes[0] += nbytes
        sizes[1] += payload.numel()
        return entry

    def _keep(self, entry: Entry, raw: torch.Tensor) -> Entry:
        entry.resident = raw
        self._meter.add(entry.nbytes)
        weakref.finalize(entry, self._meter.sub, entry.nbytes)
        self._step.counts["resident"] += 1
        return entry

    # -- prefetching -----------------------------------------------------------

    def _prefetch_after(self, entry: Entry | None) -> None:
        """Prefetch along the recorded order after ``entry``'s unpack (None: before the first).

        Before an order was recorded (the first step), the accelerator tensors' entries are
        fetched ahead along the reverse of the pack order, backward's usual one (so the first
        step also sizes the pinned pool for the prefetches of the next): a wrong guess costs
        memory within the window.
        """
        pf = self._prefetcher
        entries = self._step.entries
        issue = Entry.prefetch
        if self._order is None:
            if pf is None and entry is not None:
                meter = self._meter  # not self: no reference cycle
                pf = self._prefetcher = Prefetcher(list(range(len(entries) - 1, -1, -1)), self.budget or 0,
                                                   lambda: meter.ahead)
            issue = Entry.prefetch_staged
        elif len(entries) != self._order_count:
            return
        if pf is None:
            return
        if pf.window == 0:  # no budget: two of the largest stored tensors
            sizes = [e.payload_nbytes for r in entries if (e := r()) is not None]
            pf.window = 2 * max(sizes, default=0)
        if entry is None:
            if pf.cursor == 0:  # backward has not started inside the context
                pf.ahead(entries, issue)
        else:
            pf.unpacked(entry, entries, issue)

    def _reach(self, at: int | None) -> None:
        """The step reached the plan's point ``at`` (None: no point): issue the prefetches due."""
        if at is not None and self._planned_pf is not None:
            self._planned_pf.reached(at, self._step.entries, Entry.prefetch)

    def flush(self) -> None:
        """Wait for every write in flight and let go of the tensors written.

        Useful between forward and backward to free the activations' memory
        at once, rather than as their writes complete.

        Raises:
            NoSpaceError: with ``on_full="raise"``, when a write found the
                spill filesystem full.
        """
        if self._store is not None:
            self._writes.settle_all(self._store)

    # -- reporting -------------------------------------------------------------

    def _make_summary(self, store: SpillStore | None) -> OffloadSummary:
        pinned = self._pinned_pool()
        out = summarize(step_number=self.step, step=self._step, full_disk_events=self._writes.full, store=store,
                        account=self._account, base=self._base, dictionary=self.dictionary, meter=self._meter,
                        pool=self._pool, pinned=pinned, pinned_base=self._pinned_base)
        out.step_seconds = (self._step.ended or time.perf_counter()) - self._step.started
        out.predicted_step_seconds, out.predicted_peak_bytes = self._policy.predicted()
        return out

    def plan(self) -> str | None:
        """The scheduler's decision, printable, or None before it is made.

        With ``policy="scheduled"``, the plan is made when the context is
        entered after the profiling step: which tensors are offloaded, with
        which codec, which stay resident, and the predicted overlap of
        writes with forward compute. With ``policy="planned"``: G10's
        migration table (tensor ids are pack indices, ops those of the
        trace) and the bytes per tier. The full record is in ``plan_details``.

        Returns:
            The plan as text, or None.
        """
        return None if self._policy.result is None else str(self._policy.result["text"])

    @property
    def plan_details(self) -> dict[str, Any] | None:
        """The plan as the scheduler returned it (decisions, phase, predicted times),
        with the profiling step's record it was made from under ``"profile"``.

        With ``policy="planned"``: ``"trace"`` and ``"hardware"`` (what G10
        planned over), ``"plan"`` (the :class:`pyfastensor.plan.MigrationPlan`),
        and ``"decisions"``, one per saved tensor: ``index`` (pack order),
        ``bytes``, ``tier`` (``"stay"``, ``"ssd"`` or ``"host"``),
        ``prefetch_at`` (the trace op whose start issues its prefetch, or
        None), ``pack_op`` and ``unpack_op``."""
        return self._policy.result

    def summary(self) -> OffloadSummary:
        """The summary of the current or last step (refreshed while its store is open).

        Returns:
            An :class:`OffloadSummary`.
        """
        store = self._store or self._closed_store
        if store is not None or not self._policy.uses_store:
            self._summary = self._make_summary(store)
            self._summary.step = self.step - (0 if self._active else 1)
        return self._summary


def offload(**options: Any) -> Offload:
    """Offload saved activations during training: ``with pyfastensor.offload(...):``.

    Takes the keyword arguments of :class:`Offload` and returns one; see
    there for what each does.

    Example::

        >>> import torch, pyfastensor
        >>> model = torch.nn.Linear(1024, 1024)
        >>> with pyfastensor.offload(tier="ssd", min_size=1 << 20) as off:
        ...     model(torch.randn(512, 1024)).relu().sum().backward()
        >>> off.summary().offloaded_tensors >= 1
        True
    """
    return Offload(**options)


def _never_compiled(*hooks: Any) -> tuple[Any, ...]:
    """The saved-tensor hooks, kept out of torch.compile.

    Autograd calls them from whatever runs the ops. Where that is eager code inside a compiled
    call (after a graph break, or in a module torch.compile leaves to eager mode, as torch 2.11
    does a builtin layer compiled in place), torch.compile takes each hook's frame for user
    code and compiles it: graph breaks inside, compiled again for new shapes (3 s of a 6 s
    run of 3 steps of an 8-layer MLP). Marked disabled, they run as written. Wrapped only
    once torch.compile has been used in the process (its module is imported): eager training
    pays nothing.
    """
    if "torch._dynamo" not in sys.modules:
        return hooks
    return tuple(torch.compiler.disable(h) for h in hooks)

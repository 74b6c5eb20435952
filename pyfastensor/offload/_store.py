"""The native spill store (``hooks.Store`` in Go) as a Python object.

One store per process and spill configuration (tier, directory, engine
choice), shared by every :class:`~pyfastensor.offload.Offload` object that
asks for it (:func:`shared`) and kept from step to step: a tier (``"ssd"``:
one unlinked spill file, grown as needed and its freed space reused;
``"host"``: Go memory) holding slots of bytes. Writes are asynchronous;
reads are synchronous or prefetched.

Lifetime: every live slot and every offload object using the store keeps a
reference to it, so it stays open until the last of them is gone, and
closes (releasing its native handle and its spill file) then; an offload
object's ``close()`` closes it at once when no other object uses it.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import itertools
import os
import queue
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .. import _lib

_BATCH = 256

#: Slot ids :meth:`SpillStore.put_after` hands out start here, far above the
#: native store's (which count up from 1), so the two never meet.
_DEFERRED_BASE = 1 << 62


def _fresh(error: BaseException) -> BaseException:
    """A copy of a kept error to raise, so that the kept one never gathers the frames it passes
    through (an unpack hook's hold the step's graph); the error itself where it cannot be copied."""
    try:
        return copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception type that cannot be remade from its args
        return error


class _Deferred:
    """A put waiting for its bytes to land (:meth:`SpillStore.put_after`)."""

    __slots__ = ("error", "issued", "slot")

    def __init__(self) -> None:
        self.issued = threading.Event()  # the native put was made (or failed)
        self.slot = 0  # the native slot, once issued
        self.error: BaseException | None = None

_shared: weakref.WeakValueDictionary[tuple[Any, ...], SpillStore] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared(key: tuple[Any, ...], open_store: Callable[[], SpillStore]) -> SpillStore:
    """The process's open store for ``key``, or a new one from ``open_store()``."""
    with _shared_lock:
        store = _shared.get(key)
        if store is None or store.closed:
            store = open_store()
            _shared[key] = store
        return store


@functools.lru_cache(maxsize=64)
def _spill_engines(directory: str) -> list[str]:
    """The engines that can write (and so read back) files in ``directory``."""
    from ..dictionary import Dictionaries
    from ..engines import cufile_driver_works, cufile_fallback

    with Dictionaries(path="", directory=directory) as probe:
        d = probe.describe()
    why = (d.get("excluded") or {}).get("cufile")
    if why and cufile_driver_works(directory):  # installed, yet it failed on this filesystem
        cufile_fallback(why)
    return list(d["write"])


class SpillStore:
    """A native slot store.

    Args:
        tier: ``"ssd"`` or ``"host"``.
        spill_dir: directory of the spill file (ssd tier).
        engine: gds engine of the spill file; None lets the store probe the
            directory (``direct`` when O_DIRECT works, else ``posix``); or the
            options naming a view of open dictionaries (``Dictionaries._view``)
            that choose the engine of every transfer.

    Raises:
        PermissionDeniedError, NotFoundError, FastensorError: when the spill
            directory cannot hold the spill file (the message names it).
    """

    def __init__(self, tier: str, spill_dir: str | None, engine: str | dict[str, Any] | None = None) -> None:
        self._handle = 0
        # Reentrant: a saved tensor's finalizer frees its slot (:meth:`free`) when the garbage
        # collector frees the tensor, which can be on this thread inside any method here.
        self._lock = threading.RLock()
        self._dictionaries: Any = None
        self.users: weakref.WeakSet[Any] = weakref.WeakSet()  # offload objects using the store
        out = _lib.u64()
        _lib.call(
            "pft_store_open", tier.encode(), _lib.cstr(spill_dir),
            _lib.options(engine) if not isinstance(engine, dict) else _lib.options(**engine),
            ctypes.byref(out),
        )
        self._handle = out.value
        _lib.close_at_exit(self)
        self.description: dict[str, Any] = self._json("pft_store_describe")
        if "cuFile" in (self.description.get("fallback") or ""):
            from ..engines import cufile_fallback

            cufile_fallback(self.description["fallback"])
        self.last_stats: dict[str, Any] = {}
        self._accounts: dict[int, dict[str, Any]] = {}  # account -> its figures when the store closed
        # put_after: ids handed out -> their puts; native slot -> id; the thread issuing them.
        self._deferred: dict[int, _Deferred] = {}
        self._by_native: dict[int, int] = {}
        self._ids = itertools.count(_DEFERRED_BASE)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._putter: threading.Thread | None = None

    @classmethod
    def with_dictionaries(cls, spill_dir: str | None, use: str) -> SpillStore:
        """An ssd store whose engine per transfer the adaptive dictionaries choose.

        The spill dictionaries of ``spill_dir``'s filesystem (aware mode,
        see :class:`pyfastensor.dictionary.Dictionaries`) are opened for the
        store and closed with it, once the last slot is freed: every
        transfer's time is observed, and the file carries what was learnt
        to the next store. They are kept apart from the checkpoints'
        (``<machine file>-spill.json``): a spill file is read and written
        by the same engines (no read-only ``mmap``), and its transfers are
        its own workload.

        Args:
            spill_dir: the spill directory (default: the system's temporary one).
            use: ``"write_read"``, ``"write"`` or ``"read"``: the dictionary
                that answers both directions.
        """
        from ..dictionary import Dictionaries, dictionary_path

        directory = spill_dir or tempfile.gettempdir()
        engines = _spill_engines(directory)
        main = dictionary_path(directory)
        d = Dictionaries(main.with_name(main.stem + "-spill.json"), directory=directory,
                         write=engines, read=engines)
        try:
            store = cls("ssd", spill_dir, d._view(use))
        except BaseException:
            d.close()
            raise
        store._dictionaries = d
        return store

    @property
    def closed(self) -> bool:
        return not self._handle

    def account(self) -> int:
        """Open an account: :meth:`stats` of it counts the transfers of the slots put in it.

        For one of several users of a shared store (each offload object), whose
        figures are its own; accounts last as long as the store.
        """
        acct = _lib.u64()
        _lib.call("pft_store_account", self._live(), ctypes.byref(acct))
        with self._lock:
            self._accounts[acct.value] = {}
        return acct.value

    def put(self, addr: int, nbytes: int, account: int = 0) -> int:
        """Start writing ``nbytes`` at ``addr`` into a new slot; return its id.

        The caller keeps the memory alive and unchanged until :meth:`poll`
        or :meth:`wait` reports the write done, or :meth:`free` returns.
        The slot's transfers count in ``account`` too (0: none; see
        :meth:`account`).
        """
        slot = _lib.u64()
        _lib.call("pft_store_put", self._live(), account, addr, nbytes, ctypes.byref(slot))
        return slot.value

    def put_after(self, ready: Callable[[], None], addr: int, nbytes: int, account: int = 0) -> int:
        """Like :meth:`put`, for memory still being filled: the write starts once ``ready()``
        has returned (the event of a device-to-host copy, say), and this returns at once.

        ``ready`` is called on the store's own thread, one put after another in
        the order they were asked for (copies on one stream complete in order).
        The id returned works with every other method: :meth:`poll` says False
        until the write has started and finished, :meth:`wait`, :meth:`get` and
        the others wait for the put first. An error of ``ready`` or of the put
        (NoSpaceError when the spill file cannot grow) is raised by
        :meth:`wait` and :meth:`poll`, as a failed write's is.
        """
        self._live()
        d = _Deferred()
        with self._lock:
            slot = next(self._ids)
            self._deferred[slot] = d
            if self._putter is None:
                self._putter = threading.Thread(target=self._put_loop, name="pyfastensor-put", daemon=True)
                self._putter.start()
        self._queue.put((d, slot, ready, addr, nbytes, account))
        return slot

    def _put_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            d, slot, ready, addr, nbytes, account = item
            try:
                ready()
                d.slot = self.put(addr, nbytes, account)
                with self._lock:
                    self._by_native[d.slot] = slot
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the slot
                d.error = e.with_traceback(None)
            d.issued.set()

    def _native(self, slot: int) -> int:
        """The native slot of ``slot``: itself, or, for :meth:`put_after`'s, once its put is made."""
        d = self._deferred.get(slot) if slot >= _DEFERRED_BASE else None
        if d is None:
            return slot
        d.issued.wait()
        if d.error is not None:
            raise _fresh(d.error)
        return d.slot

    def wait(self, slot: int) -> None:
        """Block until the slot's write is done; raise its error (NoSpaceError...)."""
        _lib.call("pft_store_wait", self._live(), self._native(slot))

    def poll(self, slot: int) -> bool:
        """Whether the slot's write is done; raises its error if it failed."""
        d = self._deferred.get(slot) if slot >= _DEFERRED_BASE else None
        if d is not None and not d.issued.is_set():
            return False
        done = _lib.c_int()
        _lib.call("pft_store_poll", self._live(), self._native(slot), ctypes.byref(done))
        return bool(done.value)

    def completed(self) -> list[int]:
        """Ids of slots whose writes finished since the last call."""
        out: list[int] = []
        buf = (_lib.u64 * _BATCH)()
        n = _lib.i64()
        while True:
            _lib.call("pft_store_completed", self._live(), buf, _BATCH, ctypes.byref(n))
            with self._lock:
                out.extend(self._by_native.get(s, s) for s in buf[: n.value])
            if n.value < _BATCH:
                return out

    def prefetch(self, slot: int, addr: int, nbytes: int) -> None:
        """Start reading the slot into ``[addr, addr+nbytes)``, kept alive until get/free."""
        _lib.call("pft_store_prefetch", self._live(), self._native(slot), addr, nbytes)

    def get(self, slot: int, addr: int, nbytes: int) -> None:
        """Fill ``[addr, addr+nbytes)`` with the slot's bytes (waits for a prefetch)."""
        _lib.call("pft_store_get", self._live(), self._native(slot), addr, nbytes)

    def free(self, slot: int) -> None:
        """Release a slot (waits for its write); a no-op once the store is closed."""
        d = self._deferred.get(slot) if slot >= _DEFERRED_BASE else None
        if d is not None:
            d.issued.wait()
            with self._lock:
                self._deferred.pop(slot, None)
                self._by_native.pop(d.slot, None)
            if d.error is not None:
                return  # nothing was stored
            slot = d.slot
        with self._lock:
            if not self._handle:
                return
            _lib.call("pft_store_free", self._handle, slot)

    def stats(self, account: int = 0) -> dict[str, Any]:
        """The store's totals (see ``hooks.Stats``), or an account's transfers beside the
        store's occupancy (:meth:`account`); the last ones once closed."""
        with self._lock:
            if self._handle:
                got = self._json("pft_store_stats", account)
                if not account:
                    self.last_stats = got
                return got
            return self._accounts.get(account, {}) if account else self.last_stats

    def slot_info(self, slot: int) -> dict[str, Any]:
        """What the store measured for a slot: size, write/read times and engines."""
        return _lib.call_json("pft_store_slot_info", self._live(), self._native(slot))

    def close(self) -> None:
        """Wait for transfers in flight (puts waiting for their bytes too), free every slot,
        drop the spill file."""
        putter = self._putter
        if putter is not None and putter is not threading.current_thread():
            self._queue.put(None)
            putter.join()
            self._putter = None
        with self._lock:
            if self._handle:
                self.last_stats = self._json("pft_store_stats", 0)
                for acct in self._accounts:
                    self._accounts[acct] = self._json("pft_store_stats", acct)
                h, self._handle = self._handle, 0
                try:
                    _lib.call("pft_store_close", h)
                finally:
                    if self._dictionaries is not None:
                        self._dictionaries.close()

    def _json(self, fn: str, *args: int) -> dict[str, Any]:
        return _lib.call_json(fn, self._handle, *args)

    def _live(self) -> int:
        if not self._handle:
            raise RuntimeError(
                "the offload store is closed (its context exited with an exception, or "
                "Offload.close() was called), so the saved tensors it held were released; "
                "run backward before closing, inside a context that completed"
            )
        return self._handle

    def __del__(self) -> None:
        if getattr(self, "_handle", 0) and _lib.loaded() and os.getpid() == _lib._loaded_pid:
            try:
                self.close()
            except Exception:
                pass

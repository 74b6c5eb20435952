"""pyfastensor.async_save: snapshot now, write in the background (:mod:`._in_flight`: how many at once)."""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import NotFoundError
from . import _in_flight
from ._skeleton import pickle_skeleton
from ._snapshot import snapshot

_log = logging.getLogger("pyfastensor")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_unasked: set[_Save] = set()  # failed saves whose result nobody has asked for yet


class _Save(Future[None]):
    """An ``async_save``'s future: knows whether its result was asked for, so that a failure
    nobody looked at is still reported (at exit)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def result(self, timeout: float | None = None) -> None:
        try:
            return super().result(timeout)
        finally:
            self._asked()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(timeout)
        finally:
            self._asked()

    def _asked(self) -> None:
        if self.done():  # its failure, if any, reached the caller
            with _lock:
                _unasked.discard(self)


def _report_unasked() -> None:
    """At exit (after the saves in flight ended): the failures nobody asked about."""
    with _lock:
        failed = list(_unasked)
        _unasked.clear()
    for fut in failed:
        sys.stderr.write(f"pyfastensor.async_save: the save to {fut.path} failed, and its result was never "
                         f"asked for: {super(_Save, fut).exception()}\n")


atexit.register(_report_unasked)  # registered first: runs after the pool's shutdown


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=_in_flight.SLOTS, thread_name_prefix=_in_flight.POOL_PREFIX)
            atexit.register(_executor.shutdown, wait=True)
        return _executor


def _forget_the_parents() -> None:
    """In a forked child: the parent's pool has no threads here, its failures are not this
    process's, its lock may have been held."""
    global _executor, _lock, _unasked
    _executor, _lock, _unasked = None, threading.Lock(), set()


os.register_at_fork(after_in_child=_forget_the_parents)


def async_save(
    obj: object,
    f: str | os.PathLike[str],
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    *,
    durable: bool = True,
    engine: str | None = None,
) -> Future[None]:
    """Save ``obj`` to the path ``f`` in the background, as :func:`pyfastensor.save` would.

    Before returning, the object is pickled and every tensor's storage copied
    (staging copy), so the caller may go on training and mutating parameters
    at once: the file holds the values as of the call. The file itself is
    written on a background thread, durably unless ``durable=False``.

    CUDA tensors are copied into a pinned host buffer allocated once per
    process and kept for the next saves: one device-to-host copy per storage,
    issued on a side stream, without the call waiting for them (the current
    stream waits instead, so later kernels cannot change the values being
    copied). The buffer takes the state's CUDA bytes rounded up to a power of
    two, up to ``PYFASTENSOR_SNAPSHOT_POOL`` (default: an eighth of the
    machine's memory; the first save pays for pinning it), and is held until
    the write ends. A larger state goes through that buffer in waves, each
    written to the file before the buffer is reused, and the call returns once
    the last wave is copied into it (see
    :class:`~pyfastensor.checkpoint._snapshot.Snapshot`).

    At most two saves are in flight (snapshot taken, file not yet committed):
    a third call waits for one of them to end before taking its snapshot, so a
    loop that saves faster than the disk writes holds at most two copies of
    its state. At most one save per target is in flight: a second
    ``async_save`` to the same path waits (after taking its snapshot) for the
    first one to finish, and a :func:`pyfastensor.save` to that path waits for
    it too, so the file left is the later call's.

    Args:
        obj: any picklable object holding tensors.
        f: the target path (file-like objects are not supported here).
        pickle_module: as in :func:`torch.save`. Default: :mod:`pickle`.
        pickle_protocol: as in :func:`torch.save`. Default: 2.
        durable: fsync the file and its directory. Default: ``True``.
        engine: one I/O engine for every record; default: chosen by size.

    Returns:
        A :class:`concurrent.futures.Future`; ``.result()`` returns None once the
        checkpoint is committed and raises the save's error if it failed
        (``NoSpaceError``, ``PermissionError``...). A failure is also logged
        (``logging.getLogger("pyfastensor")``) when it happens, and written to
        stderr at exit if nobody asked the future for it.

    Raises:
        NotFoundError: the target's directory does not exist (at once, not through the future).
        TypeError: ``f`` is not a path.

    Example::

        >>> import torch, pyfastensor
        >>> w = torch.ones(3)
        >>> fut = pyfastensor.async_save({"w": w}, "/tmp/w.pt")
        >>> w += 1  # does not change what is saved
        >>> fut.result()
        >>> pyfastensor.load("/tmp/w.pt")["w"]
        tensor([1., 1., 1.])
    """
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"async_save needs a path, got {type(f).__name__}; use pyfastensor.save for file-likes")
    path = os.path.abspath(os.fspath(f))
    if not os.path.isdir(os.path.dirname(path)):  # said now, not only by the future
        raise NotFoundError(f"async_save to {path}: no such directory {os.path.dirname(path)}")
    target = _in_flight.key(path)
    _in_flight.slot()  # before the snapshot: at most SLOTS copies of the state
    fut = _Save(path)
    try:
        snap = snapshot(pickle_skeleton(obj, pickle_module, pickle_protocol), path, durable=durable, engine=engine)
    except BaseException:
        _in_flight.free()
        raise
    try:
        _in_flight.claim(target, fut)
    except BaseException:
        snap.release()
        _in_flight.free()
        raise
    fut.set_running_or_notify_cancel()

    def write() -> None:
        error: BaseException | None = None
        try:
            snap.write()
        except BaseException as e:
            error = e
        finally:
            try:
                snap.release()
            except BaseException as e:  # the save's error if it had none; the target and slot go back anyway
                error = error or e
            snap.skeleton = None  # type: ignore[assignment]  # a failure's traceback holds the snapshot, not the state's copy
            _in_flight.leave(target, fut)
            _in_flight.free()
        if error is None:
            fut.set_result(None)
            return
        with _lock:
            _unasked.add(fut)
        _log.warning("pyfastensor.async_save to %s failed (its future raises it): %s", path, error)
        fut.set_exception(error)

    try:
        _pool().submit(write)
    except BaseException as e:
        snap.release()
        _in_flight.leave(target, fut)
        _in_flight.free()
        fut.set_exception(e)  # a save waiting for this one goes on
        raise
    return fut

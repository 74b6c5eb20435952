"""pyfastensor.async_save: snapshot now, write in the background, one save per target at a time."""

from __future__ import annotations

import atexit
import os
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ._skeleton import pickle_skeleton
from ._snapshot import snapshot

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_in_flight: dict[str, Future[None]] = {}


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pyfastensor-save")
            atexit.register(_executor.shutdown, wait=True)
        return _executor


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

    At most one save per target is in flight: a second ``async_save`` to the
    same path waits (after taking its snapshot) for the first one to finish.

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
        (``NoSpaceError``, ``PermissionError``...).

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
    snap = snapshot(pickle_skeleton(obj, pickle_module, pickle_protocol), path, durable=durable, engine=engine)
    with _lock:
        previous = _in_flight.get(path)
    if previous is not None:
        try:
            previous.result()
        except Exception:
            pass  # reported by its own future

    def write() -> None:
        try:
            snap.write()
        finally:
            snap.release()

    try:
        fut = _pool().submit(write)
    except BaseException:
        snap.release()
        raise
    with _lock:
        _in_flight[path] = fut

    def forget(done: Future[None]) -> None:
        with _lock:
            if _in_flight.get(path) is done:
                del _in_flight[path]

    fut.add_done_callback(forget)
    return fut

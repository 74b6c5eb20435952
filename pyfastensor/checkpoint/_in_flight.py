"""The ``async_save`` writes in flight: at most :data:`SLOTS` at once, one per target, and
a plain save to a target waiting for the one in flight to it.

An ``async_save`` takes a slot before its snapshot (:func:`slot`) and gives it back
when its write has ended, so a training loop that saves faster than the disk
writes holds at most :data:`SLOTS` copies of its state. It then claims its
target (:func:`claim`), waiting for an earlier save to the same target, and
leaves it (:func:`leave`) before its future's result is set. A
:func:`pyfastensor.save` to a target first waits (:func:`settle`) for the
``async_save`` in flight to it, so the later call's file is the one that stays.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

#: ``async_save`` writes in flight at once (the background pool's threads): a further
#: call waits, before taking its snapshot, for one of them to end.
SLOTS = 2
#: The names of the background pool's threads start so.
POOL_PREFIX = "pyfastensor-save"

_lock = threading.Lock()
_slots = threading.BoundedSemaphore(SLOTS)
_by_target: dict[str, Future[None]] = {}  # by target: the save in flight to it


def key(path: str) -> str:
    """What names ``path``'s target here: its real path (one file saved to through a link
    or a relative path is one target)."""
    return os.path.realpath(path)


def slot() -> None:
    """Wait for a free slot and take it; :func:`free` gives it back."""
    _slots.acquire()


def free() -> None:
    _slots.release()


def claim(target: str, fut: Future[None]) -> None:
    """Make ``fut`` the save in flight to ``target``, after the one there ends."""
    while True:  # the check and the claim under one lock
        with _lock:
            previous = _by_target.get(target)
            if previous is None:
                _by_target[target] = fut
                return
        _wait(previous)  # it leaves before its result is set: the next turn may claim


def leave(target: str, fut: Future[None]) -> None:
    """``fut`` is no longer the save in flight to ``target``."""
    with _lock:
        if _by_target.get(target) is fut:
            del _by_target[target]


def settle(target: str) -> None:
    """Wait until no ``async_save`` to ``target`` is in flight. On a thread of the saves' own
    pool (a future's done-callback) it does not wait: the write it would wait for may need
    that very thread."""
    if threading.current_thread().name.startswith(POOL_PREFIX):
        return
    while True:
        with _lock:
            previous = _by_target.get(target)
        if previous is None:
            return
        _wait(previous)


def _wait(fut: Future[None]) -> None:
    try:
        Future.result(fut)  # not the subclass's result(): nobody asked for this one
    except Exception:  # noqa: BLE001 - reported by its own future
        pass


def _forget_the_parents() -> None:
    """In a forked child: the parent's saves are not this process's; its locks may have been held."""
    global _lock, _slots, _by_target
    _lock, _slots, _by_target = threading.Lock(), threading.BoundedSemaphore(SLOTS), {}


os.register_at_fork(after_in_child=_forget_the_parents)

"""A progress bar for saves and loads that take more than a couple of seconds.

The native call runs on a helper thread (ctypes releases the GIL), advancing
a counter the Go side adds bytes to; this thread shows a tqdm bar from that
counter once the call has run for :data:`DELAY` seconds. Short calls never
show a bar and, when bars are off, no thread is started at all.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .. import config

T = TypeVar("T")

#: Seconds a call runs before its bar appears; 0 (or less) shows it from the
#: start, however short the call.
DELAY = 2.0

#: Transfers smaller than this never get a bar.
MIN_BYTES = 64 << 20


def enabled(progress: bool | None) -> bool:
    """Whether bars are on: the ``progress`` argument, else ``PYFASTENSOR_PROGRESS``."""
    return config.progress_enabled() if progress is None else bool(progress)


def run(
    fn: Callable[[ctypes.c_int64 | None], T], total: int, desc: str, progress: bool | None
) -> T:
    """Call ``fn(counter)`` and show a bar of ``counter`` against ``total`` bytes if it runs long."""
    if not enabled(progress) or total < MIN_BYTES:
        return fn(None)
    return Pending(fn, total, desc, progress).wait()


class Pending(Generic[T]):
    """``fn(counter)`` running on a helper thread from construction; :meth:`wait` joins it.

    The caller can do other work meanwhile (a load unpickles while its
    records are read). :meth:`wait` shows the bar, when bars are on, the
    call moves at least :data:`MIN_BYTES` and it is still running
    :data:`DELAY` seconds after it started.
    """

    def __init__(
        self, fn: Callable[[ctypes.c_int64 | None], T], total: int, desc: str, progress: bool | None
    ) -> None:
        self._bar = enabled(progress) and total >= MIN_BYTES
        self._total, self._desc = total, desc
        self._counter = ctypes.c_int64(0)
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self._started = time.monotonic()

        def work() -> None:
            try:
                self._result.append(fn(self._counter if self._bar else None))
            except BaseException as e:  # re-raised on the caller's thread
                self._error.append(e)

        self._thread = threading.Thread(target=work, name="pyfastensor-io", daemon=True)
        self._thread.start()

    def settle(self) -> None:
        """Wait for ``fn`` to finish, dropping its result or exception (another error wins)."""
        self._join()

    def wait(self) -> T:
        """Return ``fn``'s result once it has finished, or raise its exception.

        An interrupt (Ctrl-C) while waiting is raised once ``fn`` has finished: the native call
        reads or writes the caller's tensors, which must outlive it."""
        try:
            self._show()
        except BaseException as e:
            self._join(e)
        if self._error:
            raise self._error[0]
        return self._result[0]

    def _join(self, interrupted: BaseException | None = None) -> None:
        """Join the thread, whatever interrupts the wait; then raise the first interruption (or
        ``interrupted``, what interrupted the wait before)."""
        told = False
        while True:
            if isinstance(interrupted, KeyboardInterrupt) and not told:
                told = True
                sys.stderr.write("pyfastensor: interrupted; waiting for the transfer in flight to end "
                                 "(it reads or writes your tensors' memory)\n")
            try:
                self._thread.join()
                break
            except BaseException as e:  # KeyboardInterrupt: the native call cannot be stopped
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted

    def _show(self) -> None:
        """Wait for ``fn``, showing the bar if it runs long."""
        t = self._thread
        if not self._bar:
            t.join()
        elif DELAY > 0:
            t.join(max(0.0, DELAY - (time.monotonic() - self._started)))
        if self._bar and (DELAY <= 0 or t.is_alive()):
            with _bar(self._total, self._desc) as bar:
                while t.is_alive():
                    t.join(0.1)
                    bar.update(self._counter.value - bar.n)
                bar.update(self._counter.value - bar.n)
        t.join()


class Manual:
    """A bar for work done on the caller's own thread, in steps it reports (:meth:`add`).

    Shown, when bars are on and ``total`` is at least :data:`MIN_BYTES`, from
    the first step after :data:`DELAY` seconds; :meth:`close` ends it. For
    work that must stay on its thread (CUDA copies on the caller's streams).
    """

    def __init__(self, total: int, desc: str, progress: bool | None) -> None:
        self._on = enabled(progress) and total >= MIN_BYTES
        self._total, self._desc, self._done = total, desc, 0
        self._started = time.monotonic()
        self._bar: Any = None

    def add(self, n: int) -> None:
        """Count ``n`` more bytes done."""
        self._done += n
        if not self._on:
            return
        if self._bar is None and time.monotonic() - self._started >= DELAY:
            self._bar = _bar(self._total, self._desc)
        if self._bar is not None:
            self._bar.update(self._done - self._bar.n)

    def close(self) -> None:
        """End the bar, if one is shown."""
        if self._bar is not None:
            self._bar.update(self._done - self._bar.n)
            self._bar.close()
            self._bar = None


def _bar(total: int, desc: str) -> Any:
    """A tqdm bar of ``total`` bytes (tqdm imported on first use)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)

"""A progress bar for saves and loads that take more than a couple of seconds.

The native call runs on a helper thread (ctypes releases the GIL), advancing
a counter the Go side adds bytes to; this thread shows a tqdm bar from that
counter once the call has run for :data:`DELAY` seconds. Short calls never
show a bar and, when bars are off, no thread is started at all.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

from .. import config

T = TypeVar("T")

#: Seconds a call runs before its bar appears.
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
    counter = ctypes.c_int64(0)
    result: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        try:
            result.append(fn(counter))
        except BaseException as e:  # re-raised on the caller's thread
            error.append(e)

    t = threading.Thread(target=work, name="pyfastensor-io", daemon=True)
    t.start()
    t.join(DELAY)
    if t.is_alive():
        from tqdm.auto import tqdm

        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc) as bar:
            while t.is_alive():
                t.join(0.1)
                bar.update(counter.value - bar.n)
            bar.update(counter.value - bar.n)
    t.join()
    if error:
        raise error[0]
    return result[0]

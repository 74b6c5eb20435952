"""Exceptions raised by pyfastensor.

Every error from the native library arrives as one of these, carrying the
library's message (which names the engine, the file and the offset). Errors
that are operating-system conditions are also the matching built-in
``OSError`` subclass, so ``except FileNotFoundError`` and ``errno`` checks
work as usual.
"""

from __future__ import annotations

import errno
import functools
from typing import Any


class FastensorError(Exception):
    """Base class of every pyfastensor error."""


class InvalidArgumentError(FastensorError, ValueError):
    """A bad argument: negative offset, null address, unknown engine..."""


class EndOfFileError(FastensorError, EOFError):
    """A read reached the end of the file before filling its buffer."""


class _FromMessage:
    """An ``OSError`` made from its message alone, its errno fixed by its class: pickled and
    copied as it is made (``OSError``'s own way passes the errno too, which ``__init__`` does not
    take), so it crosses processes intact: DCP gathers each rank's exception to every rank."""

    strerror: str

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.strerror,), self.__dict__ or None


class NoSpaceError(_FromMessage, FastensorError, OSError):
    """The filesystem is full (``errno.ENOSPC``)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)


class NotFoundError(_FromMessage, FastensorError, FileNotFoundError):
    """No such file or directory (``errno.ENOENT``)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOENT, message)


class PermissionDeniedError(_FromMessage, FastensorError, PermissionError):
    """Permission denied (``errno.EACCES``)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)


class SystemCallError(FastensorError, OSError):
    """Another operating-system error of a file operation (``EIO``, ``EISDIR``, ``ENOTDIR``,
    ``ENAMETOOLONG``, ``EFBIG``...): an ``OSError`` with its ``errno``, and the built-in
    subclass Python has for that errno too (``IsADirectoryError``, ``FileExistsError``...) when
    made by :func:`system_call_error`; the message names the engine, path and offset."""

    def __init__(self, errno_: int, message: str) -> None:
        super().__init__(errno_, message)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as made: DCP gathers ranks' exceptions
        return system_call_error, (self.errno, self.strerror)


def system_call_error(errno_: int, message: str) -> SystemCallError:
    """A :class:`SystemCallError` of ``errno_``, also the built-in ``OSError`` subclass Python
    maps that errno to (as ``OSError(errno_, message)`` would be)."""
    builtin = type(OSError(errno_, message))
    return (SystemCallError if builtin is OSError else _with_builtin(builtin))(errno_, message)


@functools.cache
def _with_builtin(builtin: type[OSError]) -> type[SystemCallError]:
    return type("SystemCallError", (SystemCallError, builtin), {"__module__": __name__, "__doc__": SystemCallError.__doc__})


class EngineUnavailableError(FastensorError):
    """The I/O engine asked for cannot work on this machine; the message says why."""


class UnsupportedError(FastensorError):
    """Something this build does not do: an engine operation (writing through ``mmap``), a
    file from a newer format version, a training-data pack used from a DataLoader worker."""


class CorruptFileError(FastensorError):
    """A file failed a check (CRC-32, format, truncation); the message names file and record."""


class InternalError(FastensorError):
    """The native library hit an internal error (a bug in pyfastensor).

    After a Go panic at the boundary the library refuses further calls in
    this process, since its state can no longer be trusted: restart the
    process. A panic caught inside a transfer worker fails only that call.
    """


class ForkedProcessError(FastensorError, RuntimeError):
    """pyfastensor was used in a process forked after the library was loaded."""


class ServerUnavailableError(FastensorError, ConnectionError):
    """A DataLoader worker cannot reach its dataset's loader server in the main process.

    The server listens from the dataset's first use in the main process and
    stops when the dataset closes; a worker waits for it a while, then raises
    this naming the dataset and the address.
    """


class NodeFailedError(ServerUnavailableError):
    """Another node of a distributed ``ChunkDataset`` failed, or refused this node's call.

    Raised on the nodes that ask a failed node (killed, unreachable, timed
    out, or refusing a call without the job's token) for samples of its
    slots, or that wait for it at a collective step (``set_epoch``,
    ``state_dict``, ``load_state_dict``); the message names the node and its
    address. The epoch cannot go on: restart the job from a ``state_dict``.
    """

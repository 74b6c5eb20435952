"""pyfastensor: fast, durable, memory-frugal tensor I/O for PyTorch training.

A Go core (loaded on first use, never at import) moves bytes through
several I/O engines; this package is the thin Python side.
"""

from ._version import __version__
from .errors import (
    CorruptFileError,
    EndOfFileError,
    EngineUnavailableError,
    FastensorError,
    ForkedProcessError,
    InternalError,
    InvalidArgumentError,
    NoSpaceError,
    NotFoundError,
    PermissionDeniedError,
    UnsupportedError,
)
from .info import info

__all__ = [
    "CorruptFileError",
    "EndOfFileError",
    "EngineUnavailableError",
    "FastensorError",
    "ForkedProcessError",
    "InternalError",
    "InvalidArgumentError",
    "NoSpaceError",
    "NotFoundError",
    "PermissionDeniedError",
    "UnsupportedError",
    "__version__",
    "info",
]

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
    NodeFailedError,
    NoSpaceError,
    NotFoundError,
    PermissionDeniedError,
    ServerUnavailableError,
    SystemCallError,
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
    "NodeFailedError",
    "NoSpaceError",
    "NotFoundError",
    "Offload",
    "OffloadSummary",
    "PermissionDeniedError",
    "ServerUnavailableError",
    "SystemCallError",
    "UnsupportedError",
    "__version__",
    "async_save",
    "empty_cache",
    "info",
    "load",
    "open",
    "save",
    "offload",
    "route",
    "routed",
]

# Checkpoint and offload import torch, so they load on first use: importing
# pyfastensor stays cheap (no torch, no Go runtime).
_LAZY = {"save": ".checkpoint", "load": ".checkpoint", "open": ".checkpoint",
         "async_save": ".checkpoint", "empty_cache": "._buffers", "Offload": ".offload", "OffloadSummary": ".offload",
         "route": ".routing", "routed": ".routing"}

# Modules reached as attributes, imported on first use: offload (callable:
# pyfastensor.offload(...)), safetensors (save_file / load_file), dcp (Writer /
# Reader, imports torch.distributed), data (ChunkDataset), plan (no torch),
# lightning (CheckpointIO, imports Lightning), engines and dictionary. route() (routing) imports torch
# when called, not before.
_SUBPACKAGES = frozenset({"offload", "safetensors", "dcp", "data", "plan", "lightning", "engines", "dictionary"})


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

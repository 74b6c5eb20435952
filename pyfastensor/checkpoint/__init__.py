"""Checkpoints in PyTorch's own zip format: :func:`save` and :func:`load`, drop-ins for torch's.

The Go core (``checkpoint/``) lays out and validates the zip, moves records
through the I/O engines in parallel and checks CRC-32s; this package pickles
the object skeleton and unpickles it with torch's own machinery.
"""

from . import _cuda
from .async_save import async_save
from .lazy import CheckpointReader, open
from .load import load
from .save import save

__all__ = ["CheckpointReader", "async_save", "last_cuda_route", "load", "open", "save"]


def last_cuda_route() -> dict[str, str]:
    """How this process's last :func:`load` to CUDA moved its records.

    Returns:
        ``{"path": ..., "route": "cufile" | "pinned", "reason": ...}``: ``reason`` says why
        cuFile was not used (``""`` when it was); ``{}`` before the first such load.

    Example::

        >>> pyfastensor.load("model.pt", map_location="cuda")
        >>> pyfastensor.checkpoint.last_cuda_route()["route"]
        'pinned'
    """
    return dict(_cuda.last_route)

"""Checkpoints in PyTorch's own zip format: :func:`save` and :func:`load`, drop-ins for torch's.

The Go core (``checkpoint/``) lays out and validates the zip, moves records
through the I/O engines in parallel and checks CRC-32s; this package pickles
the object skeleton and unpickles it with torch's own machinery.
"""

from .async_save import async_save
from .lazy import CheckpointReader, open
from .load import load
from .save import save

__all__ = ["CheckpointReader", "async_save", "load", "open", "save"]

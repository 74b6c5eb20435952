"""safetensors through pyfastensor's engines: every function of :mod:`safetensors.torch`, and
:class:`safe_open`.

Same names, signatures and results as the safetensors package's (0.8,
``backend=`` included), so a caller can switch by its import, or
:func:`pyfastensor.route` can switch a whole program. The files are the
safetensors package's (it reads and validates ours, we read its): byte for
byte the same for the same tensors, but for the header's padding where a
tensor is 1 MiB or more (then the data starts on 4 KiB, where O_DIRECT and
GPUDirect Storage read it in place). What differs is how bytes move:
tensors are written and read in parallel through the Go core's engines,
straight from and into tensor memory, and saves are durable (temporary
file, fsync, rename, directory fsync).

===================  =====================================================
:func:`save_file`    a dict of tensors to a file
:func:`load_file`    a file to a dict of tensors (CPU, or CUDA through the pinned ring)
:func:`save`         a dict of tensors to bytes
:func:`load`         bytes to a dict of tensors
:func:`save_model`   a module's state dict, tied weights once
:func:`load_model`   a file into a module; ``(missing, unexpected)``
:class:`safe_open`   a file opened for tensors or slices one at a time
===================  =====================================================

The safetensors package itself is not needed, except by ``safe_open`` for
frameworks other than torch (it opens those with the package's own).
"""

import torch

from ._bytes import load, save
from ._files import load_file, save_file
from ._format import (
    DTYPES,
    CorruptSafetensorsError,
    SafetensorError,
    UnsupportedSafetensorsError,
    package,
)
from ._model import load_model, save_model
from ._open import TensorSlice, safe_open

__all__ = [
    "DTYPES",
    "CorruptSafetensorsError",
    "SafetensorError",
    "TensorSlice",
    "UnsupportedSafetensorsError",
    "load",
    "load_file",
    "load_model",
    "package",
    "safe_open",
    "save",
    "save_file",
    "save_model",
    "storage_ptr",
    "storage_size",
]


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage (0 for a meta tensor), as
    :func:`safetensors.torch.storage_ptr` gives it."""
    try:
        return tensor.untyped_storage().data_ptr()
    except NotImplementedError:
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The bytes of ``tensor``'s storage, as :func:`safetensors.torch.storage_size` gives it."""
    return tensor.untyped_storage().nbytes()

"""Activation offload: ``with pyfastensor.offload(...):`` (FlashNeuron, over saved-tensor hooks).

The Go store (``hooks/``) keeps the bytes; this package decides what to
offload, encodes it with torch ops (:mod:`.codecs`), and rebuilds the saved
views on unpack.

``pyfastensor.offload`` is both this package and the function that makes an
:class:`Offload` context: calling the module calls :func:`offload`, so
``pyfastensor.offload(tier="ssd")`` and ``pyfastensor.offload.codecs`` both
work.
"""

import sys
import types
from typing import Any

from .context import Offload, offload
from .summary import OffloadSummary

__all__ = ["Offload", "OffloadSummary", "offload"]


class _CallableModule(types.ModuleType):
    def __call__(self, **options: Any) -> Offload:
        return offload(**options)

    __call__.__doc__ = offload.__doc__


sys.modules[__name__].__class__ = _CallableModule

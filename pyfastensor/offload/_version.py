"""Torch's check that a saved tensor was not changed in place before backward, kept under offload.

Autograd compares a saved tensor's version counter when backward unpacks it with its version
when it was saved, and raises if an in-place operation changed it in between; with saved-tensor
hooks installed it skips that check, since it cannot see what the hooks keep. Under offload an
in-place change would then go unnoticed, and the gradient would use the old bytes or the new
ones depending on whether the spill write had read them yet. Every handle pack returns carries
a :class:`Version`, checked at each unpack, so the program torch would refuse is refused here too.
"""

from __future__ import annotations

import weakref

import torch


class Version:
    """A saved tensor's version when it was saved, and a weak reference to the tensor whose
    version counter it shares (its base for a view: every view of a base shares the base's
    counter and keeps the base alive). Once that tensor is gone no view of it is left either,
    so nothing can change the saved bytes in place any more and the check passes. (A
    ``detach()`` alias shares the counter without keeping the tensor alive: changed after the
    tensor is gone, it is not seen.)"""

    __slots__ = ("dtype", "owner", "saved", "size")

    def __init__(self, t: torch.Tensor) -> None:
        base = t if t._base is None else t._base
        self.owner: weakref.ref[torch.Tensor] | None
        try:
            self.saved = t._version
            self.owner = weakref.ref(base)
        except RuntimeError:  # an inference tensor has no version counter: nothing to check
            self.saved, self.owner = 0, None
        self.dtype, self.size = t.dtype, t.shape

    def check(self) -> None:
        """Raise torch's own error when the saved tensor was changed in place since it was saved.

        Raises:
            RuntimeError: it was, with torch's message and the versions.
        """
        owner = self.owner() if self.owner is not None else None
        if owner is None or owner._version == self.saved:
            return
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: [{self.dtype} {list(self.size)}] is at version {owner._version}; expected version "
            f"{self.saved} instead. It was saved under pyfastensor.offload, which keeps the check torch "
            "skips when saved-tensor hooks are installed. Hint: enable anomaly detection with "
            "torch.autograd.set_detect_anomaly(True) to find the operation that changed it, or change a "
            "clone() of it instead.")


class Kept:
    """What pack returns for a saved tensor it leaves in place (too small, a parameter, not a
    plain tensor): the tensor and its :class:`Version`."""

    __slots__ = ("tensor", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor, self.version = t, Version(t)

    def unpack(self) -> torch.Tensor:
        self.version.check()
        return self.tensor

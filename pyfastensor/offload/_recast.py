"""Saved tensors that are casts of a parameter: cast again when backward needs them, not stored.

Under ``torch.autocast`` every weight a matmul uses is cast to the low-precision dtype once per
forward, and the matmul saves that copy (or a transposed view of it) for backward: a tenth or
more of what a transformer saves. Moving it to the host and back costs two transfers of bytes
the parameter, which stays on the device, holds already; casting it again costs one kernel of
a fraction of a millisecond, and gives the same bits (a cast rounds one way).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from ._version import Version


class Recast:
    """A saved tensor kept as the parameter it was cast from: the view's geometry over the cast,
    and the parameter's version when it was saved."""

    __slots__ = ("cast", "dtype", "offset", "param", "size", "stride", "version")

    def __init__(self, param: nn.Parameter, t: torch.Tensor) -> None:
        self.param, self.dtype, self.version = param, t.dtype, param._version
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()
        self.cast = Version(t)  # the cast itself changed in place: torch's error, as unstored

    def restore(self) -> torch.Tensor:
        """The saved tensor: the parameter cast again, the saved view over it.

        Raises:
            RuntimeError: when the parameter was changed in place since the forward saved its
                cast (its cast now would differ from the one saved).
        """
        self.cast.check()
        p = self.param
        if p._version != self.version:
            raise RuntimeError(
                f"pyfastensor.offload: a parameter of shape {tuple(p.shape)} ({p.dtype}) changed in place "
                f"between the forward that saved its {self.dtype} cast and this backward (version "
                f"{self.version} then, {p._version} now); the cast is not stored but made again from the "
                "parameter, so the gradient would use the new values. Change parameters after backward, "
                "or pass recast=False to pyfastensor.offload to store such casts like other tensors")
        return p.to(self.dtype).as_strided(self.size, self.stride, self.offset)


class Casts:
    """One step's judge of which saved casts may be made again in backward.

    A cast is made again only where it is the parameter's cast as the parameter is. Two casts
    may not be, and are stored instead: one made before the step began (autocast's weight cache
    keeps a cast for its whole region, across an optimizer step inside it; a caller may keep one
    too), told by its autograd node's sequence number, which the step's start is compared with
    on its thread; and one saved again after its parameter changed since its first save in the
    step. (A parameter changed in place between its cast and that cast's first save, within one
    forward, is not seen: only a ``recast=False`` run stores such a cast as it was.)
    """

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.since = _clock()
        self.first: dict[int, int] = {}  # a cast's node sequence number -> its parameter's version then

    def recast_of(self, t: torch.Tensor) -> Recast | None:
        """A :class:`Recast` of ``t`` when ``t`` is (a view of) an unchanged cast of an
        ``nn.Parameter`` to another dtype on the same device, with the parameter's layout, made
        in this step from the parameter as it is; else None."""
        base = t if t._base is None else t._base
        fn = base.grad_fn
        if fn is None or fn.name() != "ToCopyBackward0" or base._version != 0:
            return None
        nexts = fn.next_functions
        if len(nexts) != 1 or nexts[0][0] is None:
            return None
        param = getattr(nexts[0][0], "variable", None)  # AccumulateGrad's leaf
        if (not isinstance(param, nn.Parameter) or param.device != base.device or param.dtype == base.dtype
                or param.shape != base.shape or not param.is_contiguous() or not base.is_contiguous()
                or base.storage_offset() != 0):
            return None
        if threading.get_ident() != self.thread:
            return None  # sequence numbers count per thread: this one's cannot be placed
        made = fn._sequence_nr()
        if made <= self.since or self.first.setdefault(made, param._version) != param._version:
            return None
        return Recast(param, t)


def _clock() -> int:
    """The sequence number of an autograd node made now on this thread: a later one's is larger."""
    with torch.inference_mode(False), torch.enable_grad():
        return (torch.ones((), requires_grad=True) * 1).grad_fn._sequence_nr()

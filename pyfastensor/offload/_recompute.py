"""A saved storage kept as its recipe and made again when backward needs it (``policy="auto"``).

At pack, a recipe (:class:`~._graph.Recipe`) is bound to this step's
values: each source entry (held, with the version its saved tensor had
when it was packed), each small saved tensor kept as it is, each
parameter or buffer (with its version now). Nothing of the storage itself
is kept. At its first unpack, :meth:`Bound.run` checks that no source
changed since (an in-place change would make other bytes), restores the
source entries (read back, or themselves recomputed), runs the recipe's
ops, and returns the storage's bytes.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._graph import Leaf, Recipe, leaf_at, replay
from ._version import Version


class Unbound(Exception):
    """A recipe's source is not there in this step (another graph): the entry is stored instead."""


class Bound:
    """A recipe bound to one step's sources (see the module docstring)."""

    __slots__ = ("entries", "kept", "params", "recipe")

    def __init__(self, recipe: Recipe, entries: dict[int, tuple[Any, Version]], kept: dict[int, torch.Tensor],
                 params: dict[int, weakref.ref[torch.Tensor]], registered: set[int], saved: torch.Tensor) -> None:
        self.recipe = recipe
        self.entries: dict[int, tuple[Any, Version]] = {}
        self.kept: dict[int, tuple[torch.Tensor, Version]] = {}
        self.params: dict[int, tuple[torch.Tensor, int]] = {}
        for lf in recipe.leaves.values():
            if lf.kind == "entry":
                got = entries.get(lf.key)
                if got is None:
                    raise Unbound(f"source entry {lf.key} is not in this step")
                self.entries[lf.key] = got
            elif lf.kind == "kept":
                t = kept.get(lf.key)
                if t is None:
                    raise Unbound(f"source saved tensor {lf.key} is not in this step")
                self.kept[lf.key] = (t, Version(t))
            else:
                # The parameter must be the one this step used there: one that requires grad is
                # the leaf at the same place of the saved tensor's autograd graph as in the
                # profile (its address may be another's); another (a frozen one, a buffer) is the
                # profile's own tensor, if the modules the step runs hold its storage.
                if lf.path is not None:
                    p = leaf_at(saved, lf.path)
                    if p is None or p.dtype != lf.dtype or not _fits(p, lf):
                        raise Unbound("a source parameter is not where the profile had it")
                else:
                    ref = params.get(lf.key)
                    p = ref() if ref is not None else None
                    if p is None or p.requires_grad or (registered and lf.key not in registered):
                        raise Unbound("a source parameter is not one of this step's")
                self.params[lf.key] = (p, p._version)

    def run(self, device: torch.device) -> torch.Tensor:
        """Make the storage again: its bytes as a 1-D uint8 tensor at offset 0.

        Raises:
            RuntimeError: a source changed in place since the forward (its version), naming it.
        """
        leaves: dict[int, torch.Tensor] = {}
        for v, lf in self.recipe.leaves.items():
            if lf.kind == "entry":
                entry, version = self.entries[lf.key]
                _check(version, f"saved tensor {lf.key}")
                base = entry.restore()
                if entry.waiting > 0:  # made (or read) before its own use: kept for it, not made twice
                    entry.kept = base
            elif lf.kind == "kept":
                base, version = self.kept[lf.key]
                _check(version, "a small saved tensor")
            else:
                base, was = self.params[lf.key]
                if base._version != was:
                    raise RuntimeError(
                        f"pyfastensor.offload: a parameter of shape {tuple(base.shape)} changed in place between "
                        f"the forward and this backward (version {was} then, {base._version} now); a saved tensor "
                        "the plan recomputes from it would differ from the one saved. Change parameters after "
                        "backward, or use another policy than 'auto'")
            leaves[v] = _view(base, lf)
        out = replay(self.recipe, leaves)
        storage = out.untyped_storage()
        return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


def _fits(p: torch.Tensor, lf: Leaf) -> bool:
    """Whether the view ``lf`` names lies within ``p``'s storage."""
    if any(n == 0 for n in lf.size):
        return True
    last = lf.offset + sum((n - 1) * st for n, st in zip(lf.size, lf.stride, strict=True))
    return lf.offset >= 0 and (last + 1) * p.element_size() <= p.untyped_storage().nbytes()

def _check(version: Version, what: str) -> None:
    try:
        version.check()
    except RuntimeError as e:
        raise RuntimeError(f"pyfastensor.offload: {what}, a source of a tensor the plan recomputes, changed in "
                           f"place since the forward: {e}") from None


def _view(base: torch.Tensor, lf: Leaf) -> torch.Tensor:
    """The view ``lf`` names over ``base``'s storage."""
    out = torch.empty(0, dtype=lf.dtype, device=base.device)
    return out.set_(base.untyped_storage(), lf.offset, lf.size, lf.stride)

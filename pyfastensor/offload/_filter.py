"""Which saved tensors may be offloaded at all."""

from __future__ import annotations

import torch
from torch import nn

# grad_fn names of ReLU outputs (the sparse codec's candidates).
_RELU = ("ReluBackward", "ThresholdBackward")


def storages_of(module: nn.Module | None, *, recurse: bool = True) -> set[int]:
    """Addresses of the storages of a module's parameters and buffers (its submodules' too
    unless ``recurse=False``)."""
    if module is None:
        return set()
    return {t.untyped_storage().data_ptr()
            for t in [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]}


class ModuleWatch:
    """Registers the parameters and buffers of every module run while a step is on.

    Without ``module=``, a buffer saved for backward looks like any input.
    A global forward pre-hook sees each module before its forward runs and
    adds the storages of its own parameters and buffers to ``registered``
    (once per module per step), so they are known before anything they
    feed is packed.

    The hook is registered once and kept from step to step (:meth:`start`,
    :meth:`stop`), until :meth:`remove`: torch.compile guards on the global
    hooks, and one added and removed every step recompiled the model every
    step (falling back to eager mode after its recompile limit).
    """

    def __init__(self) -> None:
        self.registered: set[int] = set()
        self._seen: set[int] = set()
        self._on = False
        self._handle = nn.modules.module.register_module_forward_pre_hook(self._pre)

    def start(self, registered: set[int]) -> None:
        """A step begins: add what its modules hold to ``registered``."""
        self.registered, self._seen, self._on = registered, set(), True

    def stop(self) -> None:
        """The step's forward is over: modules run until the next :meth:`start` are not watched."""
        self._on = False

    def _pre(self, module: nn.Module, args: object) -> None:
        if torch.compiler.is_dynamo_compiling():
            return  # a constant to torch.compile: no graph break in the user's model
        if not self._on or id(module) in self._seen:
            return
        try:
            own = storages_of(module, recurse=False)
        except RuntimeError:  # torch 2.4 compiling: a copy of the module over fake tensors
            return
        self._seen.add(id(module))
        self.registered |= own
        compiled = getattr(module, "_orig_mod", None)  # torch.compile's wrapper, called eagerly
        if isinstance(compiled, nn.Module):
            self.registered |= storages_of(compiled)

    def remove(self) -> None:
        self._handle.remove()


def _param_like(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad)


def is_parameter(t: torch.Tensor, registered: set[int]) -> bool:
    """A parameter, a view of one, a leaf that requires grad, or a registered storage."""
    if _param_like(t):
        return True
    base = t._base
    if base is not None and _param_like(base):
        return True
    return bool(registered) and t.untyped_storage().data_ptr() in registered


def supported(t: torch.Tensor) -> bool:
    """A plain strided tensor on CPU or CUDA whose bytes alone describe it."""
    return (
        type(t) in (torch.Tensor, nn.Parameter)
        and t.layout == torch.strided
        and t.device.type in ("cpu", "cuda")
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and not t.is_nested
    )


def is_relu_output(t: torch.Tensor) -> bool:
    """Whether autograd says ``t`` came out of a ReLU."""
    fn = t.grad_fn
    return fn is not None and fn.name().startswith(_RELU)

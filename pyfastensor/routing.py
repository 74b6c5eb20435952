"""Route a whole program's checkpoint I/O through pyfastensor: :func:`route`.

Frameworks call ``torch.save``, ``torch.load`` and safetensors themselves;
:func:`route` makes those names pyfastensor's, so their checkpoints go
through the Go core without an edit to their code:

==========================================================  ====================================
replaced                                                    by
==========================================================  ====================================
``torch.save``, ``torch.serialization.save``                :func:`pyfastensor.save`
``torch.load``, ``torch.serialization.load``                :func:`pyfastensor.load`
``safetensors.torch.{save,save_file,load,load_file}``       :mod:`pyfastensor.safetensors`'s
``safetensors.torch.{save_model,load_model}``               :mod:`pyfastensor.safetensors`'s
``safetensors.safe_open``                                   :class:`pyfastensor.safetensors.safe_open`
==========================================================  ====================================

A module that imported one of those functions under its own name before
routing began (``from safetensors.torch import load_file as safe_load_file``
in transformers, ``from safetensors.torch import load_model`` in accelerate,
``from safetensors import safe_open`` in both) has it replaced too: every
loaded module's global bound to one of torch's or safetensors' functions
is rebound, and bound back when routing ends. A module imported while
routing is on copies pyfastensor's functions itself and is bound back too.
What the scan cannot reach: a function kept elsewhere than in a module's
globals (a default argument, a class attribute, a closure).

pyfastensor hands back to torch what it does not read itself (legacy files,
``skip_data``, fake tensors...) by calling torch's own functions, captured
when pyfastensor loaded, never the name ``torch.load``: routed or not,
nothing recurses.

Threads see the routing (it is global). A DataLoader's worker processes see
it too: forked ones inherit it, and spawned or forkserver ones route
themselves before their first sample (their worker loop is a function of
this module while routing is on). Other processes a routed program starts
with spawn route where they call :func:`route` themselves.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any

__all__ = ["Routing", "route", "routed"]

_lock = threading.RLock()
_depth = 0
#: id(original) -> (original, replacement) while routing is on.
_pairs: dict[int, tuple[Any, Any]] = {}


def route() -> Routing:
    """Make ``torch.save``/``torch.load`` and safetensors' functions pyfastensor's, program-wide.

    Call it once at the start of a program, or use it as a context manager
    for a block; either way it takes effect at once. Calls nest: routing
    ends when every :func:`route` has been closed (a ``with`` inside
    another leaves the outer one routed). Thread-safe.

    Returns:
        A :class:`Routing`: ``close()`` it, or leave its ``with`` block, to
        bind torch's and safetensors' own functions back.

    Example::

        >>> import pyfastensor, torch
        >>> with pyfastensor.route():
        ...     torch.save({"w": torch.ones(2)}, "/tmp/w.pt")   # pyfastensor.save
        ...     torch.load("/tmp/w.pt")["w"]                     # pyfastensor.load
        tensor([1., 1.])
        >>> pyfastensor.routed()
        False

    A framework that imports ``safetensors`` under other names (transformers,
    accelerate) is routed whether it was imported before or after the call::

        pyfastensor.route()
        trainer = transformers.Trainer(...)       # its checkpoints go through pyfastensor
        trainer.train(resume_from_checkpoint=True)
    """
    global _depth
    with _lock:
        if _depth == 0:
            _install()
        _depth += 1
    return Routing()


def routed() -> bool:
    """Whether :func:`route` is in force in this process."""
    return _depth > 0


class Routing:
    """What :func:`route` returns: closes once, by :meth:`close` or at the end of a ``with``."""

    def __init__(self) -> None:
        self._open = True

    def close(self) -> None:
        """End this routing; torch's and safetensors' own functions are bound back once the
        last open routing of the process is closed. A second call does nothing."""
        global _depth
        with _lock:
            if not self._open:
                return
            self._open = False
            _depth -= 1
            if _depth == 0:
                _uninstall()

    def __enter__(self) -> Routing:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---------------------------------------------------------------------- what is replaced

def _replacements() -> list[tuple[Any, Any]]:
    """(original, pyfastensor's) for every function routing replaces: torch's, and
    safetensors' where it is installed."""
    from . import _torch
    from . import checkpoint as ckpt
    from . import safetensors as ours

    pairs: list[tuple[Any, Any]] = [(_torch.torch_save, ckpt.save), (_torch.torch_load, ckpt.load)]
    st = ours.package()
    if st is not None:
        pairs += [(getattr(st.torch, name), getattr(ours, name))
                  for name in ("save", "save_file", "load", "load_file", "save_model", "load_model")]
        pairs.append((st.safe_open, ours.safe_open))  # the package's class, as safetensors exports it
    pairs.append((_torch.dataloader_worker_loop, dataloader_worker_loop))
    return pairs


def _install() -> None:
    _pairs.update({id(orig): (orig, new) for orig, new in _replacements()})
    _rebind({id(orig): new for orig, new in _pairs.values()})


def _uninstall() -> None:
    _rebind({id(new): orig for orig, new in _pairs.values()})
    _pairs.clear()


def _rebind(table: dict[int, Any]) -> None:
    """In every loaded module but pyfastensor's own, rebind each global whose value is a key of
    ``table`` (by identity) to its value."""
    for name, module in list(sys.modules.items()):
        if not isinstance(module, ModuleType) or name == "pyfastensor" or name.startswith("pyfastensor."):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        hits = [(key, table[id(value)]) for key, value in list(namespace.items()) if id(value) in table]
        for key, value in hits:
            namespace[key] = value


# ---------------------------------------------------------------------- DataLoader workers

def dataloader_worker_loop(*args: Any, **kwargs: Any) -> Any:
    """A DataLoader worker's loop while routing is on: routes the worker's process (a spawned
    or forkserver worker starts without it), then runs torch's loop."""
    if not routed():
        route()
    loop: Callable[..., Any] = importlib.import_module("pyfastensor._torch").dataloader_worker_loop
    return loop(*args, **kwargs)

"""torch's private interfaces, in one place, with what each supported torch does.

pyfastensor reads and writes torch's own checkpoint format, rebuilds tensors
the way torch's unpickler does, times autograd nodes and shares storages
between processes, so it needs a few names torch does not promise to keep.
Every such name is reached through this module, and nothing else in the
package imports one (``tests/test_import_graph.py`` checks). Each behaviour
adapted here has a test of its own in ``tests/test_torch_compat.py``, so a
torch that changes one of them fails the test that names it.

Supported: torch :data:`FLOOR` (``pyproject.toml``'s floor) to the newest
release, tested on each minor release between (``make test-compat``). What
differs across that range, and how it is met:

=====================================  =========================================================
``torch.serialization._load``          takes ``weights_only=`` from 2.14 on; before, that
                                       keyword would reach the unpickler (``TypeError``), so
                                       :func:`load_records` passes it only where it is taken
``torch.utils.serialization.config``   2.7 and later; before, ``torch.load`` never maps a
                                       file unless asked (:func:`default_load_mmap` is False)
``serialization._serialization_tls``   2.5 and later (``skip_data``); before, never skipped
``get_crc32_options``                  2.6 and later; before, every record has its CRC-32
unsigned dtypes (``torch.uint16``...)  saved by ``torch.save`` from 2.6 on; before, its
                                       storage map lacks them (``KeyError``):
                                       :func:`unsaved_dtypes` names them for a clear error
DCP's ``set_up_storage_writer``/        are told the rank in DCP's group from 2.9 on; before,
``set_up_storage_reader``              only whether they coordinate: :data:`DCP_PASSES_RANK`
DCP's load, a ``read_metadata`` error    2.9 to 2.11 swallow it and fail on the missing
                                       metadata (an assertion): :data:`DCP_HIDES_METADATA_ERRORS`
``_weights_only_unpickler``            refuses with ``pickle.UnpicklingError`` from 2.5 on;
                                       2.4's refuses with ``RuntimeError``:
                                       :data:`weights_only_unpickler` turns its refusals
                                       (not errors of what it calls) into the later type
a storage's Python object              lives as long as the storage's memory, except that on
(``weakref.finalize`` on a storage)    2.4 a ``StorageWeakRef`` (torch's weak reference to the
                                       C++ storage) keeps it, and its finalizers, alive after
                                       the memory is freed, until that reference goes; 2.11
                                       and later let it go with the memory (2.5 to 2.10 not
                                       checked). :class:`StorageRef` tells when a storage is
                                       freed without holding its Python object
=====================================  =========================================================

The rest is the same on every supported torch and is here so that it is
named once: the weights-only unpickler and its allow-list, the restore
location and device check of ``torch.load``, ``_rebuild_tensor_v2`` (which
pickles by name, so it must be torch's own object), tensor metadata,
storage reference counts, the current autograd node, the dispatch mode and
pytree used by the trace recorder, shared-memory storages, torch's own ``save`` and ``load``
(hand-offs call them, never the name a program may have rebound) and the DataLoader's worker loop
(``torch.utils.data._utils.worker._worker_loop``, which :func:`pyfastensor.route` rebinds).
"""

from __future__ import annotations

import functools
import inspect
import pickle
import re
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch._utils
import torch.serialization
import torch.utils.data._utils.worker
from torch import _weights_only_unpickler
from torch._subclasses.fake_tensor import FakeTensor  # imported by torch itself: no start-up cost
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import UnsupportedError

__all__ = [
    "DCP_HIDES_METADATA_ERRORS", "DCP_PASSES_RANK", "FLOOR", "VERSION", "StorageRef", "TorchDispatchMode",
    "allowed_globals", "crc32_on_save", "current_autograd_node", "dataloader_worker_loop",
    "default_load_mmap", "fake_mode_active", "holds_no_data", "load_records", "new_dtypes",
    "new_shared_storage", "privateuse1_backend_name", "queue_backward_callback", "rebuild_tensor_v2", "require",
    "restore_location", "set_tensor_metadata", "skip_data", "storage_slice",
    "storage_use_count", "tensor_metadata", "torch_load", "torch_save", "tree_flatten", "tree_unflatten", "unsaved_dtypes",
    "validate_device", "weights_only_unpickler",
]

#: The oldest torch pyfastensor supports: the floor of ``pyproject.toml``'s ``torch>=``.
FLOOR = (2, 4)


def _parse(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"cannot read torch's version from {version!r}")
    return int(m.group(1)), int(m.group(2))


#: The running torch's (major, minor).
VERSION = _parse(torch.__version__)


#: Whether DCP passes ``rank=`` to a storage writer's and reader's set-up (torch 2.9 and later);
#: before, pyfastensor's DCP backend cannot tell which rank of DCP's group it is.
DCP_PASSES_RANK = VERSION >= (2, 9)


#: Whether DCP's load swallows a storage reader's ``read_metadata`` error (2.9 to 2.11 fall back
#: to per-rank metadata, then fail on its absence: 2.9's "assert metadata is not None", later
#: ones' "metadata is None"; 2.12 and later quote the error).
DCP_HIDES_METADATA_ERRORS = (2, 9) <= VERSION < (2, 12)


def require(feature: str, version: tuple[int, int]) -> None:
    """Raise :class:`~pyfastensor.errors.UnsupportedError` naming ``version`` unless the running
    torch is at least that.

    Args:
        feature: what needs it, as the user wrote it (``"load(..., mmap=True)"``).
        version: the first torch (major, minor) that has it.

    Raises:
        UnsupportedError: on an older torch, naming the feature, the version it needs and the
            version running.
    """
    if VERSION < version:
        raise UnsupportedError(
            f"{feature} needs torch {version[0]}.{version[1]} or later; this is torch "
            f"{torch.__version__}")


# ---------------------------------------------------------------------- serialization

#: torch's own ``torch.save`` and ``torch.load``, as ``torch.serialization`` defines them. Every
#: hand-off of pyfastensor's to torch calls these, never the name ``torch.save`` looked up when
#: it runs: :func:`pyfastensor.route` (or a program's own ``torch.load = pyfastensor.load``) makes
#: that name pyfastensor's, and calling it would recurse.
#: A wrapper put there before pyfastensor loaded is unwrapped (``__wrapped__``) to torch's function.
torch_save: Callable[..., None] = inspect.unwrap(torch.serialization.save)
torch_load: Callable[..., Any] = inspect.unwrap(torch.serialization.load)


class _RaisesUnpicklingError:
    """torch 2.4's weights-only unpickler, raising ``pickle.UnpicklingError`` as later ones do."""

    __name__ = _weights_only_unpickler.__name__

    class Unpickler(_weights_only_unpickler.Unpickler):
        def load(self) -> Any:
            try:
                return super().load()
            except RuntimeError as e:
                tb = e.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                if tb is not None and tb.tb_frame.f_code.co_filename == _weights_only_unpickler.__file__:
                    raise pickle.UnpicklingError(str(e)) from None  # a refusal of the unpickler's own
                raise  # from what it called (a storage's device check, say): as it is

    load = staticmethod(_weights_only_unpickler.load)


#: torch's weights-only unpickler, the ``pickle_module`` ``torch.load(weights_only=True)`` uses.
#: A refused stream raises ``pickle.UnpicklingError`` on every supported torch.
weights_only_unpickler: ModuleType | type[_RaisesUnpicklingError] = (
    _RaisesUnpicklingError if VERSION < (2, 5) else _weights_only_unpickler)


def allowed_globals() -> dict[str, Any]:
    """The globals torch's weights-only unpickler allows, by dotted name (the built-in allow-list
    with ``add_safe_globals``' additions)."""
    return dict(_weights_only_unpickler._get_allowed_globals())


@functools.cache
def _load_takes_weights_only() -> bool:
    return "weights_only" in inspect.signature(torch.serialization._load).parameters


def load_records(zip_file: Any, map_location: Any, pickle_module: Any, *, weights_only: bool,
                 overall_storage: Any = None, **pickle_load_args: Any) -> Any:
    """``torch.serialization._load``: the object pickled in ``zip_file``'s ``data.pkl``, its
    storages read through ``zip_file`` and placed by ``map_location``.

    ``weights_only`` is passed on only to a torch whose ``_load`` takes it (2.14 and later;
    before, torch.load told ``_load`` nothing and the keyword would reach the unpickler).
    """
    if _load_takes_weights_only():
        pickle_load_args["weights_only"] = weights_only
    return torch.serialization._load(zip_file, map_location, pickle_module,
                                     overall_storage=overall_storage, **pickle_load_args)


def restore_location(map_location: Any) -> Callable[[Any, str], Any]:
    """``torch.load``'s function that moves a storage saved at a location to where
    ``map_location`` says."""
    return torch.serialization._get_restore_location(map_location)


def validate_device(location: str, backend: str) -> torch.device:
    """``torch.load``'s check of a saved device location (``"cuda:3"``) against the devices
    present, with torch's message when the index is out of range."""
    return torch.serialization._validate_device(location, backend)


def crc32_on_save() -> bool:
    """Whether ``torch.save`` computes each record's CRC-32: ``torch.serialization.get_crc32_options()``
    (torch 2.6 and later; ``set_crc32_options(False)`` writes 0 instead), always before."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    return True if get is None else bool(get())


def skip_data() -> bool:
    """Whether ``torch.serialization.skip_data()`` is in force (torch 2.5 and later)."""
    tls = getattr(torch.serialization, "_serialization_tls", None)
    return bool(getattr(tls, "skip_data", False))


def fake_mode_active() -> bool:
    """Whether a fake tensor mode is active (tensors then hold no data: torch's path loads)."""
    import torch._guards

    return torch._guards.detect_fake_mode(None) is not None


def holds_no_data(t: torch.Tensor) -> bool:
    """Whether ``t`` is a tracer's stand-in (a fake or functional tensor, while torch.compile traces)
    rather than a tensor with bytes."""
    return isinstance(t, (FakeTensor, FunctionalTensor))


def default_load_mmap() -> bool:
    """``torch.load``'s ``mmap`` when not given: ``torch.utils.serialization.config.load.mmap``
    (torch 2.7 and later), else False."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return False
    return bool(config.load.mmap)


def privateuse1_backend_name() -> str:
    """The name the private-use backend is registered under (``"privateuseone"`` unless renamed)."""
    return torch._C._get_privateuse1_backend_name()


# ---------------------------------------------------------------------- tensors and storages

#: ``torch._utils._rebuild_tensor_v2``, torch's own object: it is pickled by its name.
rebuild_tensor_v2: Callable[..., torch.Tensor] = torch._utils._rebuild_tensor_v2


def new_dtypes() -> frozenset[torch.dtype]:
    """The dtypes torch pickles through an untyped storage (``_rebuild_tensor_v3``)."""
    return frozenset(torch.storage._new_dtypes())


def unsaved_dtypes() -> frozenset[torch.dtype]:
    """Dtypes this torch's ``torch.save`` cannot write: ``uint16``, ``uint32`` and ``uint64``
    before 2.6, none after."""
    if VERSION >= (2, 6):
        return frozenset()
    return frozenset({torch.uint16, torch.uint32, torch.uint64})


def tensor_metadata(t: torch.Tensor) -> dict[str, Any]:
    """The metadata torch pickles with a tensor (empty for a plain one)."""
    return torch._C._get_tensor_metadata(t)


def set_tensor_metadata(t: torch.Tensor, metadata: dict[str, Any]) -> None:
    """Give ``t`` the metadata torch pickled with it."""
    torch._utils.set_tensor_metadata(t, metadata)


#: ``StorageBase.__getitem__`` with a slice: a view of a storage's bytes, without
#: ``UntypedStorage.__getitem__``'s check for the meta device.
storage_slice: Callable[[torch.UntypedStorage, slice], torch.UntypedStorage] = (
    torch._C.StorageBase.__getitem__)


def storage_use_count(storage: torch.UntypedStorage) -> int:
    """How many references the C++ side holds to ``storage``'s data (tensors, views, copies in
    flight): 1 when only ``storage`` itself does."""
    return int(torch._C._storage_Use_Count(storage._cdata))


class StorageRef:
    """Whether a storage's memory has been freed, holding neither the memory nor the storage's
    Python object.

    torch keeps a storage's Python object alive exactly as long as the storage (it is
    preserved while tensors use the storage), so a plain weak reference to that object dies
    with the memory, and the finalizers on the object (``weakref.finalize``) run then. torch's
    own ``StorageWeakRef`` is not used: on 2.4 it keeps the Python object, and so its
    finalizers, alive after the memory is freed, for as long as the reference lives.

    Args:
        storage: the storage to watch.
    """

    __slots__ = ("_ref",)

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self._ref = weakref.ref(storage)

    def expired(self) -> bool:
        """Whether the storage's memory has been freed."""
        return self._ref() is None


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """A CPU storage of ``nbytes`` bytes in shared memory, as torch makes one to send to
    another process."""
    return torch.UntypedStorage._new_shared(nbytes)


# ---------------------------------------------------------------------- DataLoader

#: The function a DataLoader's worker process runs (``torch.utils.data._utils.worker._worker_loop``),
#: torch's own. The DataLoader looks it up by that name each time it starts workers, and a spawned
#: worker imports it by name: :func:`pyfastensor.route` binds a routing one there.
dataloader_worker_loop: Callable[..., Any] = torch.utils.data._utils.worker._worker_loop


# ---------------------------------------------------------------------- autograd

def queue_backward_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the backward pass running now ends (autograd's engine calls it).

    Raises:
        RuntimeError: when no backward pass is running.
    """
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def current_autograd_node() -> Any:
    """The autograd node running now on this thread (in backward), or None."""
    return torch._C._current_autograd_node()

"""Weights-only unpickling at C speed for the usual checkpoint, torch's unpickler for the rest.

torch's weights-only unpickler is an interpreter written in Python: it
spends about 0.2 ms per tensor, which is most of a warm load of a state
dict of small tensors. The usual checkpoint needs only a handful of
globals: ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2``,
``torch._utils._rebuild_parameter``, ``torch.Size``, ``torch.device`` and
the dtypes. :class:`FastUnpickler` is Python's C unpickler restricted to
those (the pattern of the ``pickle`` documentation's "Restricting
Globals": every callable the stream can reach comes from ``find_class``),
and each of them is also on torch's own weights-only allowlist. So no
stream runs anything torch's unpickler would not let it call. The C
unpickler is less strict about structure: a crafted stream may, say, set
an item on a tensor, which torch's interpreter refuses; what torch.save
writes never does.

Anything else, a global outside the set or any error at all, makes
:func:`unpickle` (and the caller of :func:`load_cpu`) start again with
torch's unpickler, which then decides, with torch's results and torch's
messages (``add_safe_globals``, ``safe_globals`` and the refusal of
arbitrary globals included).
"""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch

#: The globals the C unpickler resolves, where torch allows them too.
_FAST_NAMES = (
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch.storage.UntypedStorage",
    "torch._utils._rebuild_parameter",
    "torch.Size",
    "torch.device",
)


@functools.cache
def _fast_globals() -> dict[tuple[str, str], Any]:
    allowed = _torch.allowed_globals()
    out: dict[tuple[str, str], Any] = {}
    for full, obj in allowed.items():
        if full in _FAST_NAMES or isinstance(obj, torch.dtype):
            module, _, name = full.rpartition(".")
            out[(module, name)] = obj
    return out


class _NotFast(pickle.UnpicklingError):
    """The stream needs a global the fast path does not resolve."""


class FastUnpickler(pickle.Unpickler):
    """Python's C unpickler, resolving only the globals of :data:`_FAST_NAMES`, the dtypes
    and torch's legacy storage classes (``torch.FloatStorage``: a dtype holder, as torch maps them)."""

    def find_class(self, module: str, name: str) -> Any:
        if type(name) is str and "Storage" in name:  # as torch.serialization._load maps them
            try:
                return torch.serialization.StorageType(name)
            except KeyError:
                pass
        try:
            return _fast_globals()[(module, name)]
        except (KeyError, TypeError):
            raise _NotFast(f"{module}.{name}") from None


class _FastModule:
    """What ``torch.serialization._load`` uses of its ``pickle_module``."""

    Unpickler = FastUnpickler


def refused(path: str, e: pickle.UnpicklingError,
            to_torch: Callable[[str], Any] | None = None) -> pickle.UnpicklingError:
    """The error of a weights-only load of ``path`` whose pickle the restricted unpickler refused,
    naming the file: torch's own message for the refusal where ``to_torch`` (torch.load of the
    file, weights-only: it executes nothing from it) gives one, else ours with ``e``'s."""
    message = None
    if to_torch is not None:
        try:
            to_torch(path)
        except pickle.UnpicklingError as theirs:
            message = str(theirs)
        except Exception:  # noqa: BLE001 - torch failed otherwise: ours says what was refused
            pass
    if message is None:
        message = ("Weights only load failed: the file needs something the restricted unpickler does not "
                   "allow, and nothing from the file was executed. If you trust the file's source, load it "
                   "with weights_only=False, or allow the global with "
                   f"torch.serialization.add_safe_globals([...]).\n\n{e}")
    return pickle.UnpicklingError(f"{path}: {message}")


def unpickle(zip_file: Any, map_location: Any, pickle_module: Any, *, weights_only: bool,
             overall_storage: torch.UntypedStorage | None = None,
             before_general: Callable[[], None] | None = None, **pickle_load_args: Any) -> Any:
    """``torch.serialization._load`` over ``zip_file``; weights-only loads try :class:`FastUnpickler` first.

    Args:
        before_general: called before ``pickle_module``'s unpickler starts, once the
            :class:`FastUnpickler` attempt (which never reads a storage's bytes) is over:
            that unpickler may read them (a class's ``__setstate__``, torch's check of
            sparse tensors' indices), so a caller still filling the storages waits here.
    """
    if weights_only and not callable(map_location):  # a callable's side effects must happen once
        try:
            return restricted(zip_file, map_location, overall_storage=overall_storage, **pickle_load_args)
        except Exception:  # noqa: BLE001 - torch's unpickler decides, with its own message
            pass
    if before_general is not None:
        before_general()
    return _torch.load_records(zip_file, map_location, pickle_module, weights_only=weights_only,
                               overall_storage=overall_storage, **pickle_load_args)


def restricted(zip_file: Any, map_location: Any, *, overall_storage: torch.UntypedStorage | None = None,
               **pickle_load_args: Any) -> Any:
    """``torch.serialization._load`` with :class:`FastUnpickler`: what a weights-only load (or one
    with :mod:`pickle`) gives where it succeeds. Nothing it rebuilds reads a storage's bytes (no
    class's ``__setstate__``, no sparse tensor to check), so they may be filled afterwards.

    Raises:
        pickle.UnpicklingError: the stream needs a global it does not resolve (or anything else
            it cannot do): the caller goes to the general unpickler.
    """
    return _torch.load_records(zip_file, map_location, _FastModule, weights_only=True,
                               overall_storage=overall_storage, **pickle_load_args)


_slice = _torch.storage_slice


def load_cpu(zip_file: Any, overall_storage: torch.UntypedStorage | None, **pickle_load_args: Any) -> Any:
    """``torch.serialization._load`` with weights only (or with :mod:`pickle`, which reads the
    same stream the same way), for a file in this machine's byte order loaded to the CPU,
    without ``_load``'s per-storage device and fake-mode machinery.

    The same storages, typed the same way, shared by key as torch shares
    them. A storage saved from anywhere but the CPU, a key referenced under
    two dtypes, a global outside :class:`FastUnpickler`'s set or anything
    unusual raises before any storage's bytes are used, and the caller
    starts again on torch's path. Storages are not read from: the caller
    may still be filling them. Nothing else runs either: every global the
    stream can reach is :class:`FastUnpickler`'s (no ``__setstate__`` of a
    user's class, no sparse tensor for torch to validate).
    """
    loaded: dict[str, torch.storage.TypedStorage] = {}

    def persistent_load(saved_id: Any) -> torch.storage.TypedStorage:
        if type(saved_id) is not tuple or len(saved_id) != 5:
            raise _NotFast(f"persistent id {saved_id!r:.80}")
        tag, storage_type, key, location, numel = saved_id
        if (tag != "storage" and _ascii(tag) != "storage") or (location != "cpu" and _ascii(location) != "cpu"):
            raise _NotFast(f"persistent id {saved_id!r:.80}")
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        typed = loaded.get(key)
        if typed is not None:
            if typed.dtype != dtype:
                raise _NotFast(f"record {key} under two dtypes")
            return typed
        name = f"data/{key}"
        nbytes = numel * dtype.itemsize
        if overall_storage is not None:
            off = zip_file.get_record_offset(name)
            # StorageBase's slice, without UntypedStorage.__getitem__'s check for
            # the meta device (the mapping is on the CPU): a few µs per tensor.
            storage = _slice(overall_storage, slice(off, off + nbytes))
        else:
            storage = zip_file.get_storage_from_record(name, nbytes, torch.UntypedStorage).untyped_storage()
        typed = _typed(storage, dtype)
        loaded[key] = typed
        return typed

    unpickler = _CpuUnpickler(io.BytesIO(zip_file.get_record("data.pkl")), **pickle_load_args)
    unpickler.persistent_load = persistent_load
    return unpickler.load()


_TypedStorage = torch.storage.TypedStorage
_new = object.__new__


def _typed(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.storage.TypedStorage:
    """``TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)``: what its ``__init__``
    sets for a wrapped storage, without its argument checks (a few µs per tensor)."""
    typed = _new(_TypedStorage)
    typed.dtype = dtype
    typed._untyped_storage = storage
    return typed


def _rebuild_tensor_v2(storage: Any, storage_offset: int, size: Any, stride: Any, requires_grad: bool,
                       backward_hooks: Any, metadata: Any = None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` outside fake mode (load_cpu's case): the same steps,
    without the three fake-mode lookups per tensor that cost more than the rest together."""
    t = torch.empty(0, dtype=storage.dtype)
    t.set_(storage._untyped_storage, storage_offset, size, stride)
    if requires_grad:  # a new tensor's is False
        t.requires_grad = True
    if metadata:
        _torch.set_tensor_metadata(t, metadata)
    t._backward_hooks = backward_hooks
    return t


def _rebuild_tensor_v3(storage: Any, storage_offset: int, size: Any, stride: Any, requires_grad: bool,
                       backward_hooks: Any, dtype: torch.dtype, metadata: Any = None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v3`` outside fake mode, as :func:`_rebuild_tensor_v2`."""
    t = torch.empty((0,), dtype=dtype, requires_grad=requires_grad)
    t.set_(storage._untyped_storage, storage_offset, size, stride)
    if metadata:
        _torch.set_tensor_metadata(t, metadata)
    t._backward_hooks = backward_hooks
    return t


class _CpuUnpickler(FastUnpickler):
    """:class:`FastUnpickler` with tensors rebuilt without the fake-mode checks."""

    _OWN = {("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
            ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3}

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)  # refuses what the fast path does not resolve
        return self._OWN.get((module, name), found)


def _ascii(v: Any) -> Any:
    return v.decode("ascii") if isinstance(v, bytes) else v

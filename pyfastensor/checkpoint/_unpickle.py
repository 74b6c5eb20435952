"""Weights-only unpickling at C speed for the usual checkpoint, torch's unpickler for the rest.

torch's weights-only unpickler is an interpreter written in Python: it
spends about 0.2 ms per tensor, which is most of a warm load of a state
dict of small tensors. The usual checkpoint needs only a handful of
globals: ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2``,
``torch._utils._rebuild_parameter``, ``torch.Size``, ``torch.device`` and
the dtypes. :class:`FastUnpickler` is Python's C unpickler restricted to
those (the pattern of the ``pickle`` documentation's "Restricting
Globals": every callable the stream can reach comes from ``find_class``),
and each of them is also on torch's own weights-only allowlist, so a file
it accepts is one torch accepts too.

Anything else, a global outside the set or any error at all, makes
:func:`unpickle` start again with torch's unpickler, which then decides,
with torch's results and torch's messages (``add_safe_globals``,
``safe_globals`` and the refusal of arbitrary globals included).
"""

from __future__ import annotations

import functools
import io
import pickle
from typing import Any

import torch

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
    from torch import _weights_only_unpickler

    allowed = _weights_only_unpickler._get_allowed_globals()
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


def unpickle(zip_file: Any, map_location: Any, pickle_module: Any, *, weights_only: bool,
             overall_storage: torch.UntypedStorage | None = None, direct: bool = False,
             **pickle_load_args: Any) -> Any:
    """``torch.serialization._load`` over ``zip_file``; weights-only loads try :class:`FastUnpickler` first.

    With ``direct`` (the caller vouches that every storage was saved from
    the CPU in this machine's byte order and stays on the CPU), a
    weights-only load first tries :func:`_load_cpu`, which skips
    ``_load``'s per-storage device and fake-mode machinery as well.
    """
    if weights_only and direct:
        try:
            return _load_cpu(zip_file, overall_storage, **pickle_load_args)
        except Exception:  # noqa: BLE001 - the general path decides
            pass
    if weights_only and not callable(map_location):  # a callable's side effects must happen once
        try:
            return torch.serialization._load(zip_file, map_location, _FastModule,
                                             overall_storage=overall_storage, weights_only=True,
                                             **pickle_load_args)
        except Exception:  # noqa: BLE001 - torch's unpickler decides, with its own message
            pass
    return torch.serialization._load(zip_file, map_location, pickle_module, overall_storage=overall_storage,
                                     weights_only=weights_only, **pickle_load_args)


def _load_cpu(zip_file: Any, overall_storage: torch.UntypedStorage | None, **pickle_load_args: Any) -> Any:
    """``torch.serialization._load`` for CPU storages in native byte order loaded to the CPU.

    The same storages, typed the same way, shared by key as torch shares
    them; a storage whose location is not ``cpu``, a key referenced under
    two dtypes, or anything unusual raises, and the caller starts again
    on torch's path.
    """
    loaded: dict[str, torch.storage.TypedStorage] = {}

    def persistent_load(saved_id: Any) -> torch.storage.TypedStorage:
        if not isinstance(saved_id, tuple) or len(saved_id) != 5 or _ascii(saved_id[0]) != "storage":
            raise _NotFast(f"persistent id {saved_id!r:.80}")
        _, storage_type, key, location, numel = saved_id
        if _ascii(location) != "cpu":
            raise _NotFast(f"storage at {location!r}")
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        typed = loaded.get(key)
        if typed is not None:
            if typed.dtype != dtype:
                raise _NotFast(f"record {key} under two dtypes")
            return typed
        name = f"data/{key}"
        nbytes = numel * torch._utils._element_size(dtype)
        if overall_storage is not None:
            off = zip_file.get_record_offset(name)
            storage = overall_storage[off: off + nbytes]
        else:
            storage = zip_file.get_storage_from_record(name, nbytes, torch.UntypedStorage).untyped_storage()
        typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
        loaded[key] = typed
        return typed

    unpickler = FastUnpickler(io.BytesIO(zip_file.get_record("data.pkl")), **pickle_load_args)
    unpickler.persistent_load = persistent_load
    return unpickler.load()


def _ascii(v: Any) -> Any:
    return v.decode("ascii") if isinstance(v, bytes) else v

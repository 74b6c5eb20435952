"""Pickling of an object's skeleton, exactly as :func:`torch.save` does it.

Tensors pickle themselves through their storages; each storage becomes a
persistent id ``("storage", storage_type, key, location, numel)`` and its
bytes become the record ``data/<key>``. This mirrors ``torch.serialization._save``
(same keys in the same order, same dtype checks, same location tags), so the
pickle bytes match torch's and stock :func:`torch.load` reads our files.
"""

from __future__ import annotations

import collections
import io
import pickle
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch.serialization import location_tag, normalize_storage_type

#: Types whose objects are never storages (exact types: a subclass could be anything).
_NEVER_STORAGES = frozenset({int, float, bool, str, bytes, tuple, list, dict, type(None), torch.Size,
                             torch.dtype, torch.device, collections.OrderedDict, torch.Tensor,
                             torch.nn.Parameter, type, types.FunctionType, types.BuiltinFunctionType})


@dataclass
class Skeleton:
    """The pickled object and the storages it refers to, keyed as in the pickle."""

    data: bytes
    storages: dict[str, torch.UntypedStorage]


def pickle_skeleton(obj: Any, pickle_module: Any = pickle, pickle_protocol: int = 2) -> Skeleton:
    """Pickle ``obj`` with storages as persistent ids, as ``torch.save`` does.

    Raises:
        RuntimeError: when two tensors view the same memory as different dtypes
            (torch refuses this too).
    """
    storages: dict[str, torch.UntypedStorage] = {}
    id_map: dict[int, str] = {}
    storage_dtypes: dict[int, torch.dtype] = {}

    def persistent_id(obj: Any) -> tuple | None:
        if not (isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj)):
            return None
        if isinstance(obj, torch.storage.TypedStorage):
            storage = obj._untyped_storage
            storage_dtype = obj.dtype
            storage_type = getattr(torch, obj._pickle_storage_type())
            numel = obj._size()
        else:
            storage = obj
            storage_dtype = torch.uint8
            storage_type = normalize_storage_type(type(obj))
            numel = storage.nbytes()
        if str(storage.device) != "meta" and storage.data_ptr() != 0:
            seen = storage_dtypes.setdefault(storage.data_ptr(), storage_dtype)
            if seen != storage_dtype:
                raise RuntimeError(
                    "Cannot save multiple tensors or storages that view the same data as different types"
                )
        key = id_map.setdefault(storage._cdata, str(len(id_map)))
        if getattr(obj, "_fake_device", None) is not None:
            location = str(obj._fake_device)
        else:
            location = location_tag(storage)
        storages[key] = storage
        return ("storage", storage_type, key, location, numel)

    class Pickler(pickle_module.Pickler):  # type: ignore[name-defined,misc]
        def persistent_id(self, obj: Any) -> Any:
            # Called for every object pickled (about 19 per tensor: sizes,
            # strides, keys...): the common types answer without the checks.
            if type(obj) in _NEVER_STORAGES:
                return None
            return persistent_id(obj)

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle_protocol).dump(obj)
    return Skeleton(buf.getvalue(), storages)

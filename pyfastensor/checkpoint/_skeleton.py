"""Pickling of an object's skeleton, exactly as :func:`torch.save` does it.

Tensors pickle themselves through their storages; each storage becomes a
persistent id ``("storage", storage_type, key, location, numel)`` and its
bytes become the record ``data/<key>``. This mirrors ``torch.serialization._save``
(same keys in the same order, same dtype checks, same location tags), so the
pickle bytes match torch's and stock :func:`torch.load` reads our files.

Plain tensors (exactly :class:`torch.Tensor`, strided and not nested, on
the CPU or CUDA, without backward hooks (an empty dict of them, as a loaded
tensor has, pickles the same), Python attributes, conjugate or negative
bits, of a dtype torch pickles through a typed storage) are reduced here to
the same ``_rebuild_tensor_v2`` call torch's ``Tensor.__reduce_ex__``
builds, without its checks for every other kind of tensor; so is the empty
``OrderedDict`` (without attributes) of its arguments. Together they were
half the pickling time of a state dict of 10,000 small tensors. Any other
object goes to the pickler's own ``reducer_override`` if it has one
(cloudpickle's), then through torch's own reduction.

The usual checkpoint (dicts, lists, tuples, strings, numbers, ordered
dicts and plain tensors, pickled with :mod:`pickle` at protocol 2) is
written without a pickler at all (``_encode.py``): the same bytes, without
the pickler's call of ``persistent_id`` for every object.
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

from .. import _torch
from .._torch import new_dtypes, tensor_metadata
from .._torch import rebuild_tensor_v2 as _rebuild_tensor_v2
from ._encode import Unsupported, encode

#: Types whose objects are never storages (exact types: a subclass could be anything).
_NEVER_STORAGES = frozenset({int, float, bool, str, bytes, tuple, list, dict, type(None), torch.Size,
                             torch.dtype, torch.device, collections.OrderedDict, torch.Tensor,
                             torch.nn.Parameter, type, types.FunctionType, types.BuiltinFunctionType,
                             type(torch.FloatStorage)})  # the storage classes the persistent ids name


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
    if pickle_module is pickle and pickle_protocol == 2:
        try:
            return _encoded(obj)
        except Unsupported:
            pass  # the pickler writes it, from the start
    storages: dict[str, torch.UntypedStorage] = {}
    id_map: dict[int, str] = {}
    storage_dtypes: dict[int, torch.dtype] = {}
    locations: dict[torch.device, str] = {}
    storage_types: dict[torch.dtype, Any] = {}

    def persistent_id(obj: Any) -> tuple | None:
        if type(obj) is torch.storage.TypedStorage:  # a tensor's, from _reduce_plain: the common case first
            typed = True
        elif isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj):
            typed = isinstance(obj, torch.storage.TypedStorage)
        else:
            return None
        if typed:
            storage = obj._untyped_storage
            storage_dtype = obj.dtype
            storage_type = storage_types.get(storage_dtype)
            if storage_type is None:
                storage_type = storage_types[storage_dtype] = getattr(torch, obj._pickle_storage_type())
            numel = storage.nbytes() // storage_dtype.itemsize  # obj._size(), without its lookups
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
            device = storage.device
            location = locations.get(device)
            if location is None:
                location = locations[device] = location_tag(storage)
        storages[key] = storage
        return ("storage", storage_type, key, location, numel)

    # The base pickler's own override, if any: cloudpickle's pickles lambdas and
    # classes by value there, and must still see everything ours leaves alone.
    base_override = getattr(pickle_module.Pickler, "reducer_override", None)

    class Pickler(pickle_module.Pickler):  # type: ignore[name-defined,misc]
        def persistent_id(self, obj: Any) -> Any:
            # Called for every object pickled (about 19 per tensor: sizes,
            # strides, keys...): the common types answer without the checks.
            if type(obj) in _NEVER_STORAGES:
                return None
            return persistent_id(obj)

        def reducer_override(self, obj: Any) -> Any:
            if _UNSAVED and isinstance(obj, torch.Tensor) and obj.dtype in _UNSAVED:  # torch < 2.6 only
                _torch.require(f"saving a {obj.dtype} tensor", (2, 6))
            if type(obj) is torch.Tensor and _plain(obj):
                return _reduce_plain(obj)
            if type(obj) is collections.OrderedDict and not obj and not obj.__dict__:
                # Each plain tensor's backward_hooks. OrderedDict's own reduction
                # asks copyreg for its slot names every time (a builtin type
                # cannot cache them): 12 us a tensor. Same reduction, same bytes.
                # One with attributes (a state dict's _metadata) pickles them as
                # its state: left to its own reduction.
                return collections.OrderedDict, (), None, None, iter(())
            if base_override is not None:
                return base_override(self, obj)
            return NotImplemented

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle_protocol).dump(obj)
    return Skeleton(buf.getvalue(), storages)


#: Dtypes torch pickles through an untyped storage (``_rebuild_tensor_v3``): left to torch.
#: Dtypes this torch cannot save (unsigned ones before 2.6): refused by name, not by torch's
#: KeyError (never plain, so the encoder leaves them to the pickler, which refuses them).
_UNSAVED = _torch.unsaved_dtypes()
_V3_DTYPES = new_dtypes() | _UNSAVED


def _plain(t: torch.Tensor) -> bool:
    """Whether torch's ``Tensor.__reduce_ex__`` would reduce ``t`` to ``_rebuild_tensor_v2``
    with no more than :func:`_reduce_plain` gives (see the module's docstring)."""
    return (
        # A nested tensor is strided too, but has no sizes: torch reduces it to its buffer.
        not t.is_nested and t.layout == torch.strided and (t.is_cpu or t.is_cuda) and not t.is_quantized
        and t.dtype not in _V3_DTYPES and not t.is_conj() and not t.is_neg()
        and not t._backward_hooks and not t.__dict__ and not tensor_metadata(t)
    )


def _reduce_plain(t: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    """``t``'s reduction, as torch's ``Tensor._reduce_ex_internal`` builds it for a plain tensor."""
    storage = torch.storage.TypedStorage(wrap_storage=t.untyped_storage(), dtype=t.dtype, _internal=True)
    return _rebuild_tensor_v2, (storage, t.storage_offset(), tuple(t.size()), t.stride(), t.requires_grad,
                                collections.OrderedDict())


def _encoded(obj: Any) -> Skeleton:
    """:func:`pickle_skeleton` through :func:`~pyfastensor.checkpoint._encode.encode`: the same
    bytes and storages for the objects it writes.

    Raises:
        Unsupported: ``obj`` holds an object :func:`encode` does not write.
    """
    storages: dict[str, torch.UntypedStorage] = {}
    id_map: dict[int, str] = {}
    storage_dtypes: dict[int, torch.dtype] = {}
    locations: dict[torch.device, str] = {}
    storage_types: dict[torch.dtype, Any] = {}

    def tensor_pid(t: torch.Tensor) -> tuple[Any, ...]:
        # persistent_id of _reduce_plain's TypedStorage, without building it: a plain
        # tensor is on the CPU or CUDA (never meta) and has no fake device.
        storage = t.untyped_storage()
        dtype = t.dtype
        storage_type = storage_types.get(dtype)
        if storage_type is None:
            typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
            storage_type = storage_types[dtype] = getattr(torch, typed._pickle_storage_type())
        ptr = storage.data_ptr()
        if ptr != 0 and storage_dtypes.setdefault(ptr, dtype) != dtype:
            raise RuntimeError(
                "Cannot save multiple tensors or storages that view the same data as different types"
            )
        key = id_map.setdefault(storage._cdata, str(len(id_map)))
        device = t.device
        location = locations.get(device)
        if location is None:
            location = locations[device] = location_tag(storage)
        storages[key] = storage
        return ("storage", storage_type, key, location, storage.nbytes() // dtype.itemsize)

    return Skeleton(encode(obj, tensor_pid, _plain), storages)

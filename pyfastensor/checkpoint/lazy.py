"""pyfastensor.open: the keys of a checkpoint now, the tensors you choose when you ask."""

from __future__ import annotations

import copy
import os
import pickle
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .. import _torch
from .._buffers import empty_bytes
from ..errors import CorruptFileError
from ._native import Archive
from ._torchzip import PreloadedZip
from ._unpickle import unpickle
from .load import MapLocation, _with_keys


class _SkeletonZip(PreloadedZip):
    """Serves the small records for real and every storage as an empty meta storage."""

    def __init__(self, archive: Archive, prefix: str) -> None:
        self.archive, self.prefix = archive, prefix
        self._small = {e.name: archive.read_bytes(e.name) for e in archive.entries
                       if not e.name.startswith(prefix + "data/")}
        self.meta: dict[int, str] = {}  # meta storage _cdata -> record name
        self._keep: list[torch.Tensor] = []

    def get_storage_from_record(self, name: str, numel: int, _cls: Any) -> torch.Tensor:
        t = torch.empty(numel, dtype=torch.uint8, device="meta")
        self._keep.append(t)
        self.meta[t.untyped_storage()._cdata] = self.prefix + name
        return t


class CheckpointReader:
    """A checkpoint opened for lazy, partial loading; see :func:`open`.

    The object's skeleton is unpickled when the reader opens (tensors as
    shape-only meta tensors, no data read); each :meth:`load` then reads only
    the storage records its tensors need, in one parallel native read,
    straight into their destination storages. Tensors that share a storage
    share it in what you load too, across calls, for as long as the reader
    lives. The reader holds the file open and reads that file: a save that
    replaces it at its path meanwhile does not change what it loads (open
    the path again for the new checkpoint). Not safe for concurrent use from
    several threads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_location: MapLocation = None,
        weights_only: bool = True,
        verify: bool = True,
        engine: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._archive = Archive(self.path)
        prefix = self._archive.prefix
        if not prefix:
            raise ValueError(f"{self.path} is not a torch zip checkpoint")
        if self._archive.index.get(prefix + "byteorder") is not None:
            order = self._archive.read_bytes(prefix + "byteorder").decode()
            if order != sys.byteorder:
                raise NotImplementedError(f"{self.path} is {order}-endian; use pyfastensor.load")
        self._zip = _SkeletonZip(self._archive, prefix)
        self._locations: dict[int, str] = {}

        def note_location(storage: Any, location: str) -> Any:
            self._locations[storage._cdata] = location
            return storage

        module = _torch.weights_only_unpickler if weights_only else pickle
        self._skeleton = unpickle(self._zip, note_location, module, weights_only=weights_only,
                                  encoding="utf-8")
        self._restore = _torch.restore_location(map_location)
        self._verify, self._engine = verify, engine
        # record name -> weak references to the tensors built on its storage, so
        # a storage loaded once is shared by later loads while any of them lives.
        self._loaded: dict[str, list[weakref.ref[torch.Tensor]]] = {}
        self._by_name = {name: cdata for cdata, name in self._zip.meta.items()}

    @property
    def skeleton(self) -> Any:
        """The whole object with every tensor as a meta tensor (shapes, dtypes, no data)."""
        return self._skeleton

    def keys(self) -> list[Any]:
        """Top-level keys, when the saved object is a mapping (a state dict)."""
        if not isinstance(self._skeleton, dict):
            raise TypeError(f"{self.path} holds a {type(self._skeleton).__name__}, not a mapping")
        return list(self._skeleton.keys())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, key: object) -> bool:
        return isinstance(self._skeleton, dict) and key in self._skeleton

    def __getitem__(self, key: Any) -> Any:
        return self.load([key])[key]

    def load(self, keys: Iterable[Any] | None = None) -> Any:
        """Load the values of ``keys`` (all of the object when None), reading only their records.

        Tensors (and storages) are found in dicts, lists, tuples and named
        tuples, and in any other object that pickles them (a dataclass, a
        module, an object of your own): such an object comes back as a deep
        copy of its skeleton with its tensors loaded.

        Returns:
            A dict of key to value for ``keys``; the whole object for None.

        Raises:
            TypeError: a value holds an object whose tensors cannot be found
                or replaced (it cannot be pickled or deep-copied, or its
                ``__deepcopy__`` ignores the memo), naming the key; load the
                file with :func:`pyfastensor.load` instead.
        """
        if keys is None:
            return self._materialize([self._skeleton], [None])[0]
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"{missing!r} not in {self.path}")
        values = self._materialize([self._skeleton[k] for k in keys], keys)
        return dict(zip(keys, values, strict=True))

    def _materialize(self, values: list[Any], keys: list[Any]) -> list[Any]:
        metas: list[Any] = []  # meta tensors and typed storages, in walk order
        found: dict[int, list[Any]] = {}  # id of an object walked by pickling -> what it holds
        for value, key in zip(values, keys, strict=True):
            try:
                _collect(value, metas, found, self._zip.meta)
            except _Unwalkable as e:
                raise self._unwalkable(key, e) from e.__cause__
        storages: dict[str, Any] = {}
        need: dict[str, int] = {}
        for t in metas:
            name = self._zip.meta[_untyped(t)._cdata]
            if name in storages or name in need:
                continue
            alive = [r() for r in self._loaded.get(name, [])]
            alive = [a for a in alive if a is not None]
            if alive:
                storages[name] = _untyped(alive[0])
            else:
                need[name] = self._archive.index[name]
        fresh: dict[str, torch.Tensor] = {n: empty_bytes(self._archive.entries[i].size)
                                          for n, i in need.items()}
        if fresh:
            try:
                self._archive.read([(need[n], t.data_ptr(), t.numel()) for n, t in fresh.items()],
                                   verify=self._verify, engine=self._engine)
            except CorruptFileError as e:
                raise CorruptFileError(_with_keys(str(e), self._archive)) from None
        for n, t in fresh.items():
            location = self._locations.get(self._by_name[n], "cpu")
            storages[n] = self._restore(t.untyped_storage(), location)

        def loaded(meta_t: Any, t: Any) -> None:
            name = self._zip.meta[_untyped(meta_t)._cdata]
            self._loaded.setdefault(name, []).append(weakref.ref(t))

        built = []
        for value, key in zip(values, keys, strict=True):
            try:
                built.append(_rebuild(value, self._zip.meta, storages, found, loaded))
            except _Unwalkable as e:
                raise self._unwalkable(key, e) from e.__cause__
        return built

    def _unwalkable(self, key: Any, e: _Unwalkable) -> TypeError:
        where = "the checkpoint" if key is None else f"key {key!r}"
        return TypeError(
            f"pyfastensor.open cannot load {where} of {self.path}: it holds a "
            f"{type(e.obj).__module__}.{type(e.obj).__qualname__} that {e.why}, so its tensors "
            "cannot be found or loaded lazily (they would stay on the meta device); load "
            "the file with pyfastensor.load (or torch.load) instead")

    def close(self) -> None:
        """Release the native handle."""
        self._archive.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Values that hold no tensor: neither walked nor copied.
_ATOMIC = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size,
           torch.layout, torch.memory_format)


class _Unwalkable(Exception):  # noqa: N818 - internal, turned into a TypeError naming the key
    def __init__(self, obj: Any, why: str) -> None:
        super().__init__(why)
        self.obj, self.why = obj, why


class _Sink:
    def write(self, b: Any) -> int:
        return len(b)


class _Finder(pickle.Pickler):
    """Pickles an object to nowhere, noting every tensor and storage it reaches, in order."""

    def __init__(self, out: list[Any]) -> None:
        super().__init__(_Sink(), protocol=pickle.HIGHEST_PROTOCOL)
        self.out = out

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.storage.TypedStorage)):
            self.out.append(obj)
            return len(self.out)
        return None


def _is_walked(obj: Any) -> bool:
    """Types :func:`_collect` and :func:`_rebuild` walk themselves."""
    return (isinstance(obj, dict) or type(obj) is list or type(obj) is tuple
            or (isinstance(obj, tuple) and hasattr(type(obj), "_make") and hasattr(obj, "_fields")))


def _untyped(obj: Any) -> torch.UntypedStorage:
    if isinstance(obj, torch.storage.TypedStorage):
        return obj._untyped_storage
    return obj.untyped_storage()


def _held(obj: Any, found: dict[int, list[Any]]) -> list[Any]:
    """The tensors and typed storages an object of another type holds, found by pickling it."""
    held = found.get(id(obj))
    if held is None:
        held = []
        try:
            _Finder(held).dump(obj)
        except Exception as e:  # noqa: BLE001 - anything its __reduce__ raises
            raise _Unwalkable(obj, f"cannot be pickled ({type(e).__name__}: {e})") from e
        found[id(obj)] = held
    return held


def _collect(obj: Any, out: list[Any], found: dict[int, list[Any]], meta: dict[int, str]) -> None:
    """Append to ``out`` the meta tensors and storages of the file that ``obj`` holds."""
    if isinstance(obj, (torch.Tensor, torch.storage.TypedStorage)):
        if _untyped(obj)._cdata in meta:
            out.append(obj)
    elif isinstance(obj, _ATOMIC):
        pass
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, out, found, meta)
    elif _is_walked(obj):
        for v in obj:
            _collect(v, out, found, meta)
    else:
        out.extend(h for h in _held(obj, found) if _untyped(h)._cdata in meta)


def _rebuild(obj: Any, meta: dict[int, str], storages: dict[str, Any], found: dict[int, list[Any]],
             loaded: Any) -> Any:
    if isinstance(obj, (torch.Tensor, torch.storage.TypedStorage)) and _untyped(obj)._cdata not in meta:
        return obj  # not the file's: made by the unpickling itself (weights_only=False)
    if isinstance(obj, torch.Tensor):
        storage = storages[meta[obj.untyped_storage()._cdata]]
        t = torch.empty(0, dtype=obj.dtype, device=storage.device)
        t.set_(storage, obj.storage_offset(), obj.size(), obj.stride())
        if isinstance(obj, torch.nn.Parameter):
            t = torch.nn.Parameter(t, requires_grad=obj.requires_grad)
        elif obj.requires_grad:
            t.requires_grad_(True)
        loaded(obj, t)
        return t
    if isinstance(obj, torch.storage.TypedStorage):
        s = torch.storage.TypedStorage(wrap_storage=storages[meta[obj._untyped_storage._cdata]],
                                       dtype=obj.dtype, _internal=True)
        loaded(obj, s)
        return s
    if isinstance(obj, _ATOMIC):
        return obj
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the type and attributes (a state dict's _metadata)
        for k, v in obj.items():
            out[k] = _rebuild(v, meta, storages, found, loaded)
        return out
    if type(obj) is list:
        return [_rebuild(v, meta, storages, found, loaded) for v in obj]
    if type(obj) is tuple:
        return tuple(_rebuild(v, meta, storages, found, loaded) for v in obj)
    if _is_walked(obj):  # a named tuple
        return type(obj)._make(_rebuild(v, meta, storages, found, loaded) for v in obj)
    held = _held(obj, found)
    if not any(_untyped(h)._cdata in meta for h in held):
        return obj
    # Any other object: a deep copy of its skeleton, each meta tensor and storage it
    # holds replaced by its loaded one (deepcopy's memo is consulted before copying).
    memo: dict[int, Any] = {}
    for h in held:  # the file's loaded; any other (made by its unpickling) kept as it is
        if id(h) not in memo:
            memo[id(h)] = _rebuild(h, meta, storages, found, loaded)
    ours = {id(v) for v in memo.values()}
    try:
        out = copy.deepcopy(obj, memo)
    except Exception as e:  # noqa: BLE001 - anything its __deepcopy__ or __reduce__ raises
        raise _Unwalkable(obj, f"cannot be deep-copied ({type(e).__name__}: {e})") from e
    left: list[Any] = []
    try:
        _Finder(left).dump(out)
    except Exception as e:  # noqa: BLE001
        raise _Unwalkable(obj, f"cannot be pickled once copied ({type(e).__name__}: {e})") from e
    if any(id(x) not in ours and (_untyped(x)._cdata in meta or _untyped(x).device.type == "meta") for x in left):
        raise _Unwalkable(obj, "keeps its meta tensors when deep-copied (its __deepcopy__ ignores the memo)")
    return out


def open(  # noqa: A001 - the name is the API
    path: str | os.PathLike[str],
    *,
    map_location: MapLocation = None,
    weights_only: bool = True,
    verify: bool = True,
    engine: str | None = None,
) -> CheckpointReader:
    """Open a checkpoint for lazy, partial loading.

    Only the central directory and the pickled skeleton are read at open;
    the data of a tensor is read when you load it, straight into its
    destination storage, CRC-32 checked.

    Args:
        path: a checkpoint written by :func:`pyfastensor.save` or :func:`torch.save`.
        map_location: as in :func:`torch.load`. Default: where storages were saved from.
        weights_only: restricted unpickler for the skeleton. Default: ``True``.
        verify: check CRC-32s of the records read. Default: ``True``.
        engine: one I/O engine for every record; default: chosen by size.

    Returns:
        A :class:`CheckpointReader`: ``keys()``, ``reader[key]``,
        ``reader.load([k1, k2])``, ``reader.skeleton``.

    Example::

        >>> import torch, pyfastensor
        >>> pyfastensor.save({"a": torch.ones(2), "b": torch.zeros(3)}, "/tmp/ab.pt")
        >>> with pyfastensor.open("/tmp/ab.pt") as ck:
        ...     ck.keys(), ck["b"]
        (['a', 'b'], tensor([0., 0., 0.]))
    """
    return CheckpointReader(path, map_location=map_location, weights_only=weights_only,
                            verify=verify, engine=engine)

"""The pickle of a state dict of plain tensors, written without a pickler: the same bytes.

``pickle.Pickler`` calls the skeleton's ``persistent_id`` hook for every
object it writes (about 19 per tensor: the tensor, its reduction's
arguments, sizes, strides, the persistent id's fields...) and its
``reducer_override`` twice per tensor; with the tensor's own reduction
that was most of a save of thousands of small tensors. :func:`encode`
writes the protocol 2 stream of the usual checkpoint itself: dicts,
lists, tuples, strings, numbers, ``None``, ordered dicts and plain tensors
(:func:`~pyfastensor.checkpoint._skeleton._plain`), opcode for opcode as
the C pickler writes them (the same memo, batches of 1,000 items, the
same persistent ids), so the file is what ``torch.save`` writes. Any other
object raises :class:`Unsupported`, and the caller pickles the whole object
with the pickler instead.
"""

from __future__ import annotations

import collections
import pickle
import struct
from collections.abc import Callable
from typing import Any

import torch

from .._torch import rebuild_tensor_v2 as _rebuild_tensor_v2

_BATCH = 1000  # pickle's BATCHSIZE
_PACK_I = struct.Struct("<i").pack
_PACK_I_U = struct.Struct("<I").pack
_PACK_H = struct.Struct("<H").pack
_PACK_D = struct.Struct(">d").pack
_K = [b"K" + bytes((i,)) for i in range(256)]  # BININT1
_BINPUT = [b"q" + bytes((i,)) for i in range(256)]
_BINGET = [b"h" + bytes((i,)) for i in range(256)]
_TUPLE_N = (b")", b"\x85", b"\x86", b"\x87")  # EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3
_ORDERED_DICT = collections.OrderedDict


class Unsupported(Exception):
    """The object holds something :func:`encode` does not write: pickle it instead."""


#: A tensor's persistent id, from its untyped storage and dtype: ``("storage", storage type,
#: key, location, numel)``, its storage registered as the skeleton's ``persistent_id`` does.
TensorPid = Callable[[torch.Tensor], tuple[Any, ...]]


def encode(obj: Any, tensor_pid: TensorPid, plain: Callable[[torch.Tensor], bool]) -> bytes:
    """The protocol 2 pickle of ``obj``, as ``pickle.Pickler(f, 2)`` with the skeleton's hooks writes it.

    Raises:
        Unsupported: ``obj`` holds an object not written here.
    """
    return _Encoder(tensor_pid, plain).run(obj)


_GLOBALS: dict[int, bytes] = {}


def _global_bytes(obj: Any) -> bytes:
    """The GLOBAL opcode the pickler writes for ``obj`` (a class or function), from the pickler itself."""
    b = _GLOBALS.get(id(obj))
    if b is None:
        whole = pickle.dumps(obj, protocol=2)
        if not (whole.startswith(b"\x80\x02c") and whole.endswith(b"q\x00.")):
            raise Unsupported(f"global {obj!r}")
        b = _GLOBALS[id(obj)] = whole[2:-3]
    return b


class _Encoder:
    def __init__(self, tensor_pid: TensorPid, plain: Callable[[torch.Tensor], bool]) -> None:
        self.parts: list[bytes] = [b"\x80\x02"]
        self.memo: dict[int, int] = {}  # id -> memo index
        self.keep: list[Any] = []  # memoized objects, alive until the end, as in the pickler's memo
        self.n = 0  # memo entries
        self.tensor_pid = tensor_pid
        self.plain = plain
        self.open_tuples: set[int] = set()
        #: (storage type, location) -> the opcodes of a tensor's fixed parts, once all are memoized
        self.fixed: dict[tuple[int, int], tuple[bytes, bytes, bytes]] = {}
        self.dispatch: dict[type, Callable[[Any], None]] = {
            str: self.str_, dict: self.dict_, list: self.list_,
            tuple: self.tuple_, torch.Tensor: self.tensor, _ORDERED_DICT: self.ordered_dict,
        }

    def run(self, obj: Any) -> bytes:
        self.save(obj)
        self.parts.append(b".")
        return b"".join(self.parts)

    # memo

    def put(self, obj: Any) -> None:
        """memo_put: the next memo index for ``obj`` (None: an object never met again)."""
        i = self.n
        self.n = i + 1
        if obj is not None:
            self.memo[id(obj)] = i
            self.keep.append(obj)
        self.parts.append(_put(i))

    def get(self, i: int) -> None:
        self.parts.append(_get(i))

    # objects

    def save(self, obj: Any) -> None:
        t = type(obj)
        if obj is None:
            self.parts.append(b"N")
        elif obj is True:
            self.parts.append(b"\x88")
        elif obj is False:
            self.parts.append(b"\x89")
        elif t is int:
            self.int_(obj)
        elif t is float:
            self.parts.append(b"G" + _PACK_D(obj))
        else:
            i = self.memo.get(id(obj))
            if i is not None:
                self.get(i)
                return
            fn = self.dispatch.get(t)
            if fn is None:
                raise Unsupported(t.__name__)
            fn(obj)

    def int_(self, v: int) -> None:
        self.parts.append(_int(v))

    def str_(self, s: str) -> None:
        b = s.encode("utf-8", "surrogatepass")
        self.parts.append(b"X" + _PACK_I_U(len(b)) + b)
        self.put(s)

    def global_(self, obj: Any) -> None:
        i = self.memo.get(id(obj))
        if i is not None:
            self.get(i)
            return
        self.parts.append(_global_bytes(obj))
        self.put(obj)

    def tuple_(self, t: tuple[Any, ...]) -> None:
        n = len(t)
        if n == 0:
            self.parts.append(b")")
            return
        if id(t) in self.open_tuples:  # a tuple that holds itself through a list or dict
            raise Unsupported("recursive tuple")
        self.open_tuples.add(id(t))
        if n > 3:
            self.parts.append(b"(")
        save = self.save
        for x in t:
            save(x)
        self.open_tuples.discard(id(t))
        if id(t) in self.memo:  # memoized while its items were written: recursive
            raise Unsupported("recursive tuple")
        self.parts.append(_TUPLE_N[n] if n <= 3 else b"t")
        self.put(t)

    def list_(self, lst: list[Any]) -> None:
        self.parts.append(b"]")
        self.put(lst)
        n = len(lst)
        save = self.save
        if n == 1:
            save(lst[0])
            self.parts.append(b"a")
            return
        i = 0
        while i < n:  # batch_list_exact
            self.parts.append(b"(")
            for x in lst[i:i + _BATCH]:
                save(x)
            i += _BATCH
            self.parts.append(b"e")
            if len(lst) != n:
                raise Unsupported("list changed size while pickled")

    def dict_(self, d: dict[Any, Any]) -> None:
        self.parts.append(b"}")
        self.put(d)
        n = len(d)
        if n == 0:
            return
        save = self.save
        if n == 1:
            for k, v in d.items():
                save(k)
                save(v)
            self.parts.append(b"s")
            return
        items = list(d.items())
        i = 0
        while True:  # batch_dict_exact: a dict of a multiple of 1,000 items ends with an empty batch
            self.parts.append(b"(")
            batch = items[i:i + _BATCH]
            self.items(batch)
            i += len(batch)
            self.parts.append(b"u")
            if len(batch) != _BATCH:
                break
        if len(d) != n:
            raise Unsupported("dict changed size while pickled")

    def items(self, batch: list[tuple[Any, Any]]) -> None:
        """Keys and values of a dict, as :meth:`save` writes them; new string keys and new
        tensors, the usual state dict's items, without its dispatch."""
        memo, parts, keep, save, tensor = self.memo, self.parts, self.keep, self.save, self.tensor
        for k, v in batch:
            if type(k) is str and id(k) not in memo:
                kb = k.encode("utf-8", "surrogatepass")
                n = self.n
                parts.append(b"X" + _PACK_I_U(len(kb)) + kb + (_BINPUT[n] if n < 256 else b"r" + _PACK_I_U(n)))
                memo[id(k)] = n
                keep.append(k)
                self.n = n + 1
            else:
                save(k)
            if type(v) is torch.Tensor and id(v) not in memo:
                tensor(v)
            else:
                save(v)

    def ordered_dict(self, d: collections.OrderedDict[Any, Any]) -> None:
        # OrderedDict.__reduce__: (OrderedDict, (), its __dict__ or None, None, iter(items))
        state = d.__dict__ or None
        self.global_(_ORDERED_DICT)
        self.parts.append(b")R")
        self.put(d)
        items = list(d.items())
        save = self.save
        i, n = 0, len(items)
        while i < n:  # batch_dict over an iterator: no empty batch
            if n - i == 1:
                save(items[i][0])
                save(items[i][1])
                self.parts.append(b"s")
                break
            self.parts.append(b"(")
            batch = items[i:i + _BATCH]
            self.items(batch)
            i += len(batch)
            self.parts.append(b"u")
            if len(batch) != _BATCH:
                break
        if state is not None:
            save(state)
            self.parts.append(b"b")

    def tensor(self, t: torch.Tensor) -> None:
        """``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict())``, the
        storage as its persistent id, as the skeleton's ``reducer_override`` reduces it."""
        if not self.plain(t):
            raise Unsupported("a tensor torch reduces otherwise")
        tag, storage_type, key, location, numel = self.tensor_pid(t)
        memo = self.memo
        fixed = self.fixed.get((id(storage_type), id(location)))
        if fixed is None:
            at = (memo.get(id(_rebuild_tensor_v2)), memo.get(id(tag)), memo.get(id(storage_type)),
                  memo.get(id(location)), memo.get(id(_ORDERED_DICT)))
            if None in at:  # the first tensor of its kind: the globals and strings it names are new
                self._tensor_slowly(t, tag, storage_type, key, location, numel)
                return
            # memoized objects keep their index: their opcodes are written the same from now on
            fixed = self.fixed[(id(storage_type), id(location))] = (
                _get(at[0]) + b"((" + _get(at[1]) + _get(at[2]), _get(at[3]), _get(at[4]) + b")R")
        head, location_bytes, hooks = fixed
        n = self.n
        key_at = memo.get(id(key))  # a storage shared with an earlier tensor: its key was written
        if key_at is None:
            kb = key.encode("utf-8", "surrogatepass")
            key_bytes = b"X" + _PACK_I_U(len(kb)) + kb + _put(n)
            memo[id(key)] = n
            self.keep.append(key)
            n += 1
        else:
            key_bytes = _get(key_at)
        pid_at = n
        n += 1
        size, stride = t.size(), t.stride()
        if len(size) == 1:  # the usual case, without _ints' loop
            size_bytes = _int(size[0]) + b"\x85" + _put(n)
            stride_bytes = _int(stride[0]) + b"\x85" + _put(n + 1)
            n += 2
        else:
            size_bytes = _ints(tuple(size))
            if size:
                size_bytes += _put(n)
                n += 1
            stride_bytes = _ints(stride)
            if stride:
                stride_bytes += _put(n)
                n += 1
        # the pid tuple, the size and stride tuples, the hooks and the arguments are new
        # objects, met once: their memo entries are counted, not recorded
        self.parts.append(b"".join((
            head, key_bytes, location_bytes, _int(numel), b"t", _put(pid_at), b"Q", _int(t.storage_offset()),
            size_bytes, stride_bytes, b"\x88" if t.requires_grad else b"\x89", hooks, _put(n), b"t",
            _put(n + 1), b"R", _put(n + 2))))
        memo[id(t)] = n + 2
        self.keep.append(t)
        self.n = n + 3

    def _tensor_slowly(self, t: torch.Tensor, tag: str, storage_type: Any, key: str, location: str,
                       numel: int) -> None:
        """:meth:`tensor` through the general methods, which memoize what is new."""
        parts, save = self.parts, self.save
        self.global_(_rebuild_tensor_v2)
        parts.append(b"(")  # the arguments: 6 items
        parts.append(b"(")  # the persistent id: 5 items
        save(tag)
        self.global_(storage_type)
        save(key)
        save(location)
        self.int_(numel)
        parts.append(b"t")
        self.put(None)
        parts.append(b"Q")
        self.int_(t.storage_offset())
        self.tuple_(tuple(t.size()))
        self.tuple_(t.stride())
        parts.append(b"\x88" if t.requires_grad else b"\x89")
        self.global_(_ORDERED_DICT)  # the empty backward hooks
        parts.append(b")R")
        self.put(None)
        parts.append(b"t")
        self.put(None)
        parts.append(b"R")
        self.put(t)


def _put(i: int) -> bytes:
    return _BINPUT[i] if i < 256 else b"r" + _PACK_I_U(i)


def _get(i: int) -> bytes:
    return _BINGET[i] if i < 256 else b"j" + _PACK_I_U(i)


def _int(v: int) -> bytes:
    """BININT1, BININT2, BININT or LONG1/LONG4 of ``v``, as the pickler chooses."""
    if 0 <= v < 256:
        return _K[v]
    if 0 <= v < 65536:
        return b"M" + _PACK_H(v)
    if -(1 << 31) <= v < (1 << 31):
        return b"J" + _PACK_I(v)
    n = (v.bit_length() >> 3) + 1
    b = v.to_bytes(n, "little", signed=True)
    if v < 0 and n > 1 and b[-1] == 0xFF and b[-2] & 0x80:
        b = b[:-1]
    return (b"\x8a" + bytes((len(b),)) if len(b) < 256 else b"\x8b" + _PACK_I(len(b))) + b


def _ints(t: tuple[int, ...]) -> bytes:
    """A tuple of ints, new to the memo, less its memo entry: EMPTY_TUPLE, TUPLE1-3 or MARK ... TUPLE."""
    n = len(t)
    if n <= 3:
        return b"".join(map(_int, t)) + _TUPLE_N[n]
    return b"(" + b"".join(map(_int, t)) + b"t"

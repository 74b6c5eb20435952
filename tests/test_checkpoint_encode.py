"""The usual checkpoint's pickle, written without a pickler (checkpoint/_encode.py), is torch.save's, byte for byte."""

from __future__ import annotations

import collections
import io
import math
import pickle
import zipfile

import pytest
import torch
from checkpoint_helpers import training_state

import pyfastensor
from pyfastensor import _torch
from pyfastensor.checkpoint._encode import Unsupported
from pyfastensor.checkpoint._skeleton import _encoded, pickle_skeleton


def torch_pickle(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(buf) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def tensors(n: int, shape: tuple[int, ...] = (3,)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def with_metadata() -> collections.OrderedDict:
    sd = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2)).state_dict()
    assert sd._metadata  # an ordered dict with state: reduced with BUILD
    return sd


def shared() -> dict:
    base = torch.arange(24, dtype=torch.float32)
    t = torch.ones(2)
    same_list, same_tuple = [1, 2], (3, "x", None, 4.5)
    return {"base": base, "view": base[4:10].view(2, 3), "t": base.view(4, 6).t(), "again": t, "twice": t,
            "lists": [same_list, same_list], "tuples": (same_tuple, same_tuple), "scalar": torch.tensor(2.0),
            "empty": torch.zeros(0, 3), "grad": torch.ones(2, requires_grad=True), "strided": base[::3]}


def numbers() -> list:
    ints = [0, 1, 255, 256, 65535, 65536, -1, -256, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, 2**63, -(2**63),
            2**64 - 1, 2**2100, -(2**2100), -128, -129, -(2**15), -(2**23) - 1]
    return ints + [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e308, True, False, None]


def dtypes() -> dict:
    return {str(d): torch.ones(4, dtype=d) for d in (torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                                    torch.int8, torch.uint8, torch.bool, torch.complex64)}


def _saved(obj: object) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


CASES = {
    "training_state": training_state,
    "with_metadata": with_metadata,
    "shared": shared,
    "numbers": numbers,
    "dtypes": dtypes,
    "strings": lambda: {"ключ": torch.ones(1), "emoji 🙂": [""], "surrogate \udc80": ("a", "a"), "": {}},
    "tuples": lambda: [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (((),),), tuple(tensors(5))],
    "empty_ordered": lambda: {"hooks": collections.OrderedDict(), "od": collections.OrderedDict(a=1)},
    "empty_with_metadata": lambda: {"relu": torch.nn.ReLU().state_dict(), "w": torch.ones(2)},  # BUILD, no items
    "loaded": lambda: torch.load(_saved({"a": torch.ones(2), "b": [torch.zeros(3)]})),  # empty _backward_hooks
    "shapes": lambda: [torch.zeros(()), torch.zeros(2, 3, 4, 5), torch.zeros(1, 1, 1, 1, 1).expand(1, 3, 1, 1, 2)],
}
for _n in (0, 1, 2, 999, 1000, 1001, 2000, 2001):
    CASES[f"dict{_n}"] = lambda n=_n: {f"k{i}": t for i, t in enumerate(tensors(n))}
    CASES[f"list{_n}"] = lambda n=_n: tensors(n)
    CASES[f"ordered{_n}"] = lambda n=_n: collections.OrderedDict((i, t) for i, t in enumerate(tensors(n)))


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_encoded_pickle_is_torchs(make):
    obj = make()
    skel = _encoded(obj)  # written by the encoder, not handed to the pickler
    assert skel.data == torch_pickle(obj)
    assert skel.data == pickle_skeleton(obj, pickle_module=_Pickle).data  # the pickler, hooks and all
    assert list(skel.storages) == list(pickle_skeleton(obj, pickle_module=_Pickle).storages)


def test_recursive_containers_are_encoded():
    lst: list = [1]
    lst.append(lst)
    d: dict = {"w": torch.ones(2)}
    d["self"] = d
    obj = {"list": lst, "dict": d}
    assert _encoded(obj).data == torch_pickle(obj)


class _Pickle:
    """Not the pickle module itself: pickle_skeleton uses the pickler."""

    from pickle import Pickler


class Other:
    pass


@pytest.mark.parametrize("obj", [
    {"p": torch.nn.Parameter(torch.ones(2))}, {"s": {1, 2}}, {"b": b"bytes"}, [Other()],
    {"conj": torch.randn(2, dtype=torch.complex64).conj()}, {"v3": torch.ones(2).to(torch.float8_e5m2)},
    {"sub": collections.defaultdict(list)}, [torch.float32], [1, torch.Size([2])],
])
def test_anything_else_goes_to_the_pickler_and_still_matches(tmp_path, obj):
    with pytest.raises(Unsupported):
        _encoded(obj)
    pyfastensor.save(obj, tmp_path / "x.pt")
    with zipfile.ZipFile(tmp_path / "x.pt") as z:
        assert z.read("archive/data.pkl") == torch_pickle(obj)


def test_two_dtypes_over_one_storage_are_refused_as_torch_refuses():
    base = torch.zeros(4)
    obj = {"f": base, "i": base.view(torch.int32)}
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        torch_pickle(obj)
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        _encoded(obj)


@pytest.mark.parametrize("no_byteorder", [False, True])
def test_saved_records_are_torchs_with_the_cores_alignment(tmp_path, no_byteorder):
    obj = {"a": torch.ones(3), "b": torch.arange(5), "e": torch.zeros(0)}
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    pyfastensor.save(obj, ours, _disable_byteorder_record=no_byteorder)
    torch.save(obj, theirs)
    raw = ours.read_bytes()
    with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
        want = [n.split("/", 1)[1] for n in b.namelist() if not (no_byteorder and n.endswith("/byteorder"))]
        if _torch.VERSION < (2, 7):  # the records torch 2.7 added, which older torches ignore
            want[1:1] = [".format_version", ".storage_alignment"]
        # torch's records in torch's order (less the byte order when disabled), under "archive/"
        assert a.namelist() == ["archive/" + n for n in want]
        align = int(a.read("archive/.storage_alignment"))
        assert align == pyfastensor._lib.settings()["alignment"]
        for info in a.infolist():
            if "/data/" in info.filename and info.file_size:
                at = info.header_offset
                start = at + 30 + int.from_bytes(raw[at + 26:at + 28], "little") + int.from_bytes(raw[at + 28:at + 30],
                                                                                                  "little")
                assert start % align == 0, info.filename
    for k, v in torch.load(ours).items():
        assert torch.equal(v, obj[k])


def _data_pkl(path: object) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


@pytest.mark.parametrize("how", ["parameter", "protocol4", "pickle_module"])
def test_empty_state_dict_keeps_its_metadata(tmp_path, how):
    """An empty OrderedDict with attributes (a parameterless module's state dict and its
    _metadata, which load_state_dict's migrations read) keeps them on the pickler's path."""
    sd = torch.nn.ReLU().state_dict()
    assert not sd and sd._metadata
    obj: dict = {"relu": sd}
    kw: dict = {}
    if how == "parameter":
        obj["p"] = torch.nn.Parameter(torch.ones(2))
    elif how == "protocol4":
        kw["pickle_protocol"] = 4
    else:
        kw["pickle_module"] = _Pickle
    pyfastensor.save(obj, tmp_path / "ours.pt", **kw)
    torch.save(obj, tmp_path / "theirs.pt", **kw)
    assert _data_pkl(tmp_path / "ours.pt") == _data_pkl(tmp_path / "theirs.pt")
    weights_only = how != "protocol4"  # torch's restricted unpickler refuses protocol 4's FRAME
    for load in (pyfastensor.load, torch.load):
        got = load(tmp_path / "ours.pt", weights_only=weights_only)
        assert got["relu"]._metadata == sd._metadata
        assert type(got["relu"]) is collections.OrderedDict and not got["relu"]


class _Replaced:
    pass


class _OverridingPickle:
    """A pickle module whose Pickler has a reducer_override of its own (as cloudpickle's does)."""

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: object) -> object:
            if type(obj) is _Replaced:
                return str, ("reduced by the module's own override",)
            return NotImplemented


def test_the_pickle_modules_own_reducer_override_still_runs(tmp_path):
    obj = {"w": torch.ones(2), "r": _Replaced(), "hooks": collections.OrderedDict()}
    pyfastensor.save(obj, tmp_path / "ours.pt", pickle_module=_OverridingPickle)
    torch.save(obj, tmp_path / "theirs.pt", pickle_module=_OverridingPickle)
    assert _data_pkl(tmp_path / "ours.pt") == _data_pkl(tmp_path / "theirs.pt")
    got = pyfastensor.load(tmp_path / "ours.pt", weights_only=False)
    assert got["r"] == "reduced by the module's own override" and torch.equal(got["w"], obj["w"])


def test_cloudpickle_pickles_lambdas_by_value(tmp_path):
    cloudpickle = pytest.importorskip("cloudpickle", reason="cloudpickle is not installed (pip install cloudpickle)")
    obj = {"w": torch.ones(2), "fn": lambda x: x * 2}  # a local lambda: pickle refuses it, cloudpickle does not
    pyfastensor.save(obj, tmp_path / "x.pt", pickle_module=cloudpickle)
    for load in (pyfastensor.load, torch.load):
        got = load(tmp_path / "x.pt", weights_only=False)
        assert got["fn"](3) == 6 and torch.equal(got["w"], obj["w"])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensors_are_reduced_by_torch(tmp_path):
    """A nested tensor is strided but not plain (it has no sizes): torch's reduction writes it."""
    nt = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0) + 5])
    obj = {"n": nt, "w": torch.ones(2)}
    with pytest.raises(Unsupported):
        _encoded(obj)
    pyfastensor.save(obj, tmp_path / "x.pt")
    assert _data_pkl(tmp_path / "x.pt") == torch_pickle(obj)
    for load in (pyfastensor.load, torch.load):
        got = load(tmp_path / "x.pt", weights_only=False)
        assert got["n"].is_nested
        assert all(torch.equal(a, b) for a, b in zip(got["n"].unbind(), nt.unbind(), strict=True))
        assert torch.equal(got["w"], obj["w"])

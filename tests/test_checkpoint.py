"""pyfastensor.save / load as drop-ins for torch.save / torch.load."""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import os
import pickle
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator

import pytest
import torch
from checkpoint_helpers import (
    Tiny,
    assert_same,
    evict,
    sharing,
    tensor_bytes,
    tensors,
    training_state,
)

import pyfastensor
from pyfastensor import _torch
from pyfastensor.errors import UnsupportedError

#: Every dtype torch saves; the unsigned ones from torch 2.6 (test_unsigned_dtypes_need_torch_2_6).
DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
    *(d for d in (torch.uint16, torch.uint32, torch.uint64) if d not in _torch.unsaved_dtypes()),
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
]


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    t = raw.view(dtype)[: torch.Size(shape).numel()].reshape(shape)
    return t.clone()


def odd_tensors() -> dict:
    base = torch.arange(100, dtype=torch.float32)
    mat = torch.randn(6, 7)
    obj = {f"{d}".replace("torch.", ""): sample(d, (3, 5)) for d in DTYPES}
    obj.update({
        "base": base, "slice": base[10:20], "view2d": base.view(10, 10), "transposed": base.view(10, 10).t(),
        "strided": mat[:, ::2], "mat": mat, "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
        "empty_int": torch.zeros(0, dtype=torch.int64), "grad": torch.ones(3, requires_grad=True),
        "param": torch.nn.Parameter(torch.randn(2, 2)), "nested": [{"a": (base[5:7], torch.tensor([1, 2]))}],
        "frozen_param": torch.nn.Parameter(torch.randn(2), requires_grad=False),
    })
    return obj


@pytest.mark.parametrize("make", [training_state, odd_tensors], ids=["train_state", "odd_tensors"])
@pytest.mark.parametrize("weights_only", [True, False])
def test_round_trip_matches_torch(tmp_path, make, weights_only):
    obj = make()
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    pyfastensor.save(obj, ours)
    torch.save(obj, theirs)
    reference = torch.load(theirs, weights_only=weights_only)
    for got in (
        pyfastensor.load(ours, weights_only=weights_only),  # ours by us
        torch.load(ours, weights_only=weights_only),  # ours by stock torch
        pyfastensor.load(theirs, weights_only=weights_only),  # torch's by us
    ):
        assert_same(got, reference)
        assert sharing(got) == sharing(reference)


class Tagged(torch.Tensor):
    """A tensor subclass: pickled by torch's own reduction, with its type."""


def fast_path_edges() -> dict:
    hooked = torch.ones(3, requires_grad=True)
    hooked.register_hook(lambda g: g)  # torch warns that hooks are not saved
    attributed = torch.ones(2)
    attributed.note = "kept"  # Python state: torch pickles it with _rebuild_from_type_v2
    return {
        "conj": torch.randn(3, dtype=torch.complex64).conj(), "neg": torch.randn(3, dtype=torch.complex64).conj().imag,
        "v3": torch.ones(3).to(torch.float8_e5m2),  # _rebuild_tensor_v3 on every torch
        "hooked": hooked, "attributed": attributed,
        "subclass": torch.ones(2).as_subclass(Tagged), "hooks_dict": collections.OrderedDict(),
        "full_odict": collections.OrderedDict(a=torch.ones(1)), "meta_free": torch.zeros(0),
    }


@pytest.mark.skipif(not _torch.unsaved_dtypes(), reason=f"torch {torch.__version__} saves unsigned dtypes (2.6+)")
@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_dtypes_need_torch_2_6(tmp_path, dtype):
    with pytest.raises(UnsupportedError) as e:
        pyfastensor.save({"w": torch.ones(2, dtype=dtype)}, tmp_path / "u.pt")
    assert str(e.value) == f"saving a {dtype} tensor needs torch 2.6 or later; this is torch {torch.__version__}"
    assert not (tmp_path / "u.pt").exists()


@pytest.mark.parametrize("make", [training_state, odd_tensors, fast_path_edges])
def test_pickle_is_torchs_byte_for_byte(tmp_path, make):
    # save pickles plain tensors and empty OrderedDicts without torch's
    # reduction (checkpoint/_skeleton.py); every tensor still pickles to the
    # bytes torch.save writes, and the rest falls back to torch's own.
    obj = make()
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    with pytest.warns() if make is fast_path_edges else contextlib.nullcontext():
        pyfastensor.save(obj, ours)
    torch.save(obj, theirs)
    with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
        pkl = [next(n for n in z.namelist() if n.endswith("/data.pkl")) for z in (a, b)]
        assert a.read(pkl[0]) == b.read(pkl[1])
    got, reference = pyfastensor.load(ours, weights_only=False), torch.load(theirs, weights_only=False)
    if make is not fast_path_edges:
        assert_same(got, reference)
        return
    for k, want in reference.items():
        if isinstance(want, torch.Tensor):
            assert (got[k].is_conj(), got[k].is_neg()) == (want.is_conj(), want.is_neg()), k
            assert tensor_bytes(got[k].resolve_conj().resolve_neg()) == tensor_bytes(
                want.resolve_conj().resolve_neg()), k
    assert type(got["subclass"]) is Tagged and got["attributed"].note == "kept"


def test_views_share_storage_after_load(tmp_path):
    obj = odd_tensors()
    pyfastensor.save(obj, tmp_path / "x.pt")
    got = pyfastensor.load(tmp_path / "x.pt")
    base = got["base"]
    for k in ("slice", "view2d", "transposed"):
        assert got[k].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert got["slice"].storage_offset() == 10
    assert got["nested"][0]["a"][0].storage_offset() == 5
    got["base"][12] = -1.0
    assert got["slice"][2] == -1.0
    m = training_state()["model"]
    pyfastensor.save(m, tmp_path / "m.pt")
    m2 = pyfastensor.load(tmp_path / "m.pt")
    assert m2["head.weight"].data_ptr() == m2["emb.weight"].data_ptr()  # tied stays tied


def test_storage_records_are_4k_aligned_and_zip_valid(tmp_path):
    pyfastensor.save(odd_tensors(), tmp_path / "x.pt")
    with zipfile.ZipFile(tmp_path / "x.pt") as z:
        assert z.testzip() is None  # every CRC-32 right
        assert z.read("archive/.storage_alignment") == b"4096"
        for info in z.infolist():
            if info.filename.startswith("archive/data/"):
                data_off = info.header_offset + 30 + len(info.filename) + len(
                    _local_extra(tmp_path / "x.pt", info.header_offset))
                assert data_off % 4096 == 0, info.filename
                assert info.compress_type == zipfile.ZIP_STORED


def _local_extra(path, off: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(off)
        h = f.read(30)
        n, m = int.from_bytes(h[26:28], "little"), int.from_bytes(h[28:30], "little")
        f.seek(off + 30 + n)
        return f.read(m)


@pytest.mark.skipif(_torch.VERSION < (2, 7), reason="torch's load.calculate_storage_offsets is torch 2.7's")
def test_torch_offset_arithmetic_agrees(tmp_path):
    """torch's mmap loader computes record offsets from miniz's layout; ours must match."""
    pyfastensor.save(odd_tensors(), tmp_path / "x.pt")
    code = (
        "import torch, sys\n"
        "from torch.utils.serialization import config\n"
        "config.load.calculate_storage_offsets = True\n"
        "a = torch.load(sys.argv[1], mmap=True)\n"
        "b = torch.load(sys.argv[1], map_location='meta')\n"
        "assert torch.equal(a['base'], torch.arange(100, dtype=torch.float32))\n"
    )
    env = dict(os.environ, TORCH_SERIALIZATION_DEBUG="1")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.pt")], check=True, env=env)


@pytest.mark.parametrize("engine", ["posix", "direct"])
def test_reads_torch_files_unaligned(tmp_path, engine):
    obj = {"big": torch.randn(300_001), "small": torch.arange(7), "odd": torch.randn(5000, 3)[:, 1]}
    torch.save(obj, tmp_path / "t.pt")
    assert_same(pyfastensor.load(tmp_path / "t.pt", engine=engine), torch.load(tmp_path / "t.pt"))
    pyfastensor.save(obj, tmp_path / "o.pt", engine=engine)
    assert_same(pyfastensor.load(tmp_path / "o.pt", engine=engine), torch.load(tmp_path / "t.pt"))


def test_legacy_format_is_handed_to_torch(tmp_path):
    obj = training_state()
    torch.save(obj, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert_same(pyfastensor.load(tmp_path / "legacy.pt"), torch.load(tmp_path / "legacy.pt"))
    pyfastensor.save(obj, tmp_path / "legacy2.pt", _use_new_zipfile_serialization=False)
    with open(tmp_path / "legacy2.pt", "rb") as f:
        assert not zipfile.is_zipfile(f)
    assert_same(pyfastensor.load(tmp_path / "legacy2.pt"), torch.load(tmp_path / "legacy.pt"))


def test_the_native_call_decides_the_fallback_and_python_opens_nothing(tmp_path, monkeypatch):
    from pyfastensor.checkpoint._native import Archive

    obj = training_state()
    torch.save(obj, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("legacy.pt", "empty.pt"):
        with Archive.load(tmp_path / name) as a:
            assert a.fallback.startswith("not a zip archive") and a.entries == [] and a.arena is None
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    torch.jit.save(scripted, tmp_path / "script.pt")
    with Archive.load(tmp_path / "script.pt") as a:
        assert "TorchScript" in a.fallback or "compressed" in a.fallback
    pyfastensor.save(obj, tmp_path / "ours.pt")
    with Archive.load(tmp_path / "ours.pt") as a:
        assert a.fallback == "" and a.prefix == "archive/" and a.plan["reason"]

    # The loads open their files in the native call only (torch.load opens the legacy one).
    opened: list[str] = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else "")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    assert_same(pyfastensor.load(tmp_path / "ours.pt"), obj)
    assert str(tmp_path / "ours.pt") not in opened
    assert_same(pyfastensor.load(tmp_path / "legacy.pt"), obj)
    with pytest.raises(FileNotFoundError):
        pyfastensor.load(tmp_path / "missing.pt")
    with pytest.raises(IsADirectoryError):  # torch.load's error
        pyfastensor.load(tmp_path)


def test_file_like_objects(tmp_path):
    obj = training_state()
    buf = io.BytesIO()
    buf.write(b"prefix")
    pyfastensor.save(obj, buf)
    assert_same(torch.load(io.BytesIO(buf.getvalue()[6:])), obj)  # torch 2.4 reads a zip only from 0
    buf.seek(6)
    assert_same(pyfastensor.load(buf), obj)
    torch_buf = io.BytesIO()
    torch.save(obj, torch_buf)
    torch_buf.seek(0)
    assert_same(pyfastensor.load(torch_buf), obj)
    with open(tmp_path / "f.pt", "wb") as f:
        pyfastensor.save(obj, f)
    with open(tmp_path / "f.pt", "rb") as f:
        assert_same(pyfastensor.load(f), obj)


def test_map_location_forms(tmp_path):
    obj = odd_tensors()
    pyfastensor.save(obj, tmp_path / "x.pt")
    seen = []

    def relocate(storage, location):
        seen.append((location, bytes(storage[:4]) if storage.nbytes() >= 4 else b""))
        return storage

    for ml in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, relocate, lambda s, loc: None):
        ours = pyfastensor.load(tmp_path / "x.pt", map_location=ml)
        theirs = torch.load(tmp_path / "x.pt", map_location=ml)
        assert_same(ours, theirs)
    # The callable sees filled CPU storages, tagged with their saved location, as torch's does.
    assert seen[: len(seen) // 2] == seen[len(seen) // 2:]
    assert all(loc == "cpu" for loc, _ in seen)


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {Payload.marker}",))


def test_weights_only_refuses_code(tmp_path):
    Payload.marker = str(tmp_path / "pwned")
    torch.save({"w": torch.ones(2), "evil": Payload()}, tmp_path / "evil.pt")
    # torch's own message for the refusal (it names what was refused), after the file's name
    with pytest.raises(pickle.UnpicklingError, match=r"evil\.pt: Weights only load failed(.|\n)*posix"):
        pyfastensor.load(tmp_path / "evil.pt")
    assert not os.path.exists(Payload.marker)
    pyfastensor.save({"w": torch.ones(2), "evil": Payload()}, tmp_path / "evil2.pt")
    with pytest.raises(pickle.UnpicklingError):
        pyfastensor.load(tmp_path / "evil2.pt", weights_only=True)
    assert not os.path.exists(Payload.marker)


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


@contextlib.contextmanager
def safe_globals(objs: list) -> Iterator[None]:
    """``torch.serialization.safe_globals`` (torch 2.5), or its effect on torch 2.4."""
    if hasattr(torch.serialization, "safe_globals"):
        with torch.serialization.safe_globals(objs):
            yield
        return
    before = list(torch.serialization.get_safe_globals())  # a copy: 2.4 returns its own list
    torch.serialization.add_safe_globals(objs)
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


@pytest.mark.parametrize("mmap", [False, True])
def test_usual_checkpoints_skip_torchs_python_unpickler(tmp_path, monkeypatch, mmap):
    """State dicts, Adam state, Parameters and every dtype load through the C unpickler;
    anything else (an allowlisted class, a refused global) goes to torch's, which decides."""
    from pyfastensor._torch import weights_only_unpickler as _weights_only_unpickler

    obj, odd = training_state(), odd_tensors()
    for name, o in (("state", obj), ("odd", odd)):
        pyfastensor.save(o, tmp_path / f"{name}.pt")
    pyfastensor.save({"p": Point(3), "w": torch.ones(2)}, tmp_path / "point.pt")
    Payload.marker = str(tmp_path / "pwned")
    pyfastensor.save({"evil": Payload()}, tmp_path / "evil.pt")

    def refuse(self):
        raise AssertionError("torch's Python unpickler was used")

    with monkeypatch.context() as m:
        m.setattr(_weights_only_unpickler.Unpickler, "load", refuse)
        assert_same(pyfastensor.load(tmp_path / "state.pt", mmap=mmap), obj)
        assert_same(pyfastensor.load(tmp_path / "odd.pt", mmap=mmap), odd)
        assert_same(pyfastensor.load(tmp_path / "state.pt", mmap=mmap, map_location={"cpu": "cpu"}), obj)
        with pytest.raises(AssertionError, match="Python unpickler was used"):
            pyfastensor.load(tmp_path / "point.pt", mmap=mmap)
    with pytest.raises(pickle.UnpicklingError, match="Point"):
        pyfastensor.load(tmp_path / "point.pt", mmap=mmap)
    with safe_globals([Point]):
        got = pyfastensor.load(tmp_path / "point.pt", mmap=mmap)
    assert got["p"].x == 3 and torch.equal(got["w"], torch.ones(2))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        pyfastensor.load(tmp_path / "evil.pt", mmap=mmap)
    assert not os.path.exists(Payload.marker)


def test_weights_only_false_loads_arbitrary_objects(tmp_path):
    obj = {"set": {1, 2}, "t": torch.ones(2), "cls": Tiny}
    pyfastensor.save(obj, tmp_path / "x.pt")
    got = pyfastensor.load(tmp_path / "x.pt", weights_only=False)
    assert got["set"] == {1, 2} and got["cls"] is Tiny


class Summed:
    """A tensor and its sum, taken again when unpickled: ``__setstate__`` reads the tensor's bytes."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.total = float(t.sum())

    def __getstate__(self) -> dict:
        return {"t": self.t}

    def __setstate__(self, state: dict) -> None:
        self.t = state["t"]
        self.total = float(self.t.sum())


@pytest.fixture
def held_reads(monkeypatch) -> threading.Event:
    """Hold pyfastensor.load's background read of the storages until the load waits for it
    (or the test sets the event returned), the storages full of 0xFF bytes until then:
    whatever unpickling reads of them before it waits sees 0xFF, every time."""
    from pyfastensor.checkpoint import _progress
    from pyfastensor.checkpoint._torchzip import PreloadedZip

    release = threading.Event()
    init, read, wait = PreloadedZip.__init__, PreloadedZip.read_storages, _progress.Pending.wait

    def poisoned(self, archive, **kw) -> None:
        init(self, archive, **kw)
        assert self.arena is None  # a small file: read record by record, into these tensors
        for t in self._tensors.values():
            t.fill_(0xFF)

    def held(self, **kw) -> None:
        assert release.wait(60), "the load never waited for its storages' read"
        read(self, **kw)

    def waited(self) -> object:
        release.set()
        return wait(self)

    monkeypatch.setattr(PreloadedZip, "__init__", poisoned)
    monkeypatch.setattr(PreloadedZip, "read_storages", held)
    monkeypatch.setattr(_progress.Pending, "wait", waited)
    return release


@pytest.mark.parametrize("weights_only", [False, True])
def test_setstate_reading_its_tensor_sees_the_loaded_values(tmp_path, held_reads, weights_only):
    """A class's __setstate__ (any class, or an allowlisted one) runs once the storages are read."""
    t = torch.arange(1000, dtype=torch.float32)
    pyfastensor.save({"s": Summed(t)}, tmp_path / "x.pt")
    with safe_globals([Summed]):
        got = pyfastensor.load(tmp_path / "x.pt", weights_only=weights_only)
    assert got["s"].total == 499500.0
    assert torch.equal(got["s"].t, t)


@pytest.mark.filterwarnings("ignore:Validating sparse tensor invariants because weights_only")
def test_sparse_tensors_are_checked_once_their_records_are_read(tmp_path, held_reads):
    """torch checks a loaded sparse tensor's indices when the unpickling ends (always with
    weights_only from torch 2.15, with the invariant checks on before): after the read."""
    idx = torch.tensor([[0, 3, 7, 9]])
    s = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 3.0, 4.0]), (10,), check_invariants=True).coalesce()
    pyfastensor.save({"s": s}, tmp_path / "x.pt")
    with torch.sparse.check_sparse_tensor_invariants(enable=True):
        got = pyfastensor.load(tmp_path / "x.pt")["s"]
    assert got.is_coalesced()
    assert torch.equal(got._indices(), s._indices()) and torch.equal(got._values(), s._values())


def test_swapped_byte_order_waits_for_the_records(tmp_path, held_reads):
    """Without a byteorder record torch swaps as get_default_load_endianness says: not while
    the records are still being read."""
    ends = torch.serialization.LoadEndianness
    t = torch.arange(100, dtype=torch.int32)
    pyfastensor.save({"t": t}, tmp_path / "x.pt", _disable_byteorder_record=True)
    before = torch.serialization.get_default_load_endianness()
    other = ends.BIG if sys.byteorder == "little" else ends.LITTLE
    torch.serialization.set_default_load_endianness(other)
    try:
        want = torch.load(tmp_path / "x.pt")["t"]
        got = pyfastensor.load(tmp_path / "x.pt")["t"]
    finally:
        torch.serialization.set_default_load_endianness(before)
    assert not torch.equal(want, t)  # swapped
    assert torch.equal(got, want)


@pytest.mark.parametrize("weights_only", [False, True])
def test_usual_checkpoints_unpickle_while_their_records_are_read(tmp_path, held_reads, monkeypatch,
                                                                 weights_only):
    """The C unpickler's fast path (no class of the file's, no sparse tensor) still overlaps the read."""
    load_mod = importlib.import_module("pyfastensor.checkpoint.load")  # the package exports the function

    obj = training_state()
    pyfastensor.save(obj, tmp_path / "x.pt")
    overlapped: list[bool] = []
    real = load_mod.load_cpu

    def load_cpu(*args, **kw) -> object:
        out = real(*args, **kw)
        overlapped.append(not held_reads.is_set())  # unpickled, the read still held
        return out

    monkeypatch.setattr(load_mod, "load_cpu", load_cpu)
    assert_same(pyfastensor.load(tmp_path / "x.pt", weights_only=weights_only), obj)
    assert overlapped == [True]


def test_same_memory_as_two_dtypes_is_refused_like_torch(tmp_path):
    t = torch.zeros(4)
    with pytest.raises(RuntimeError, match="different types"):
        pyfastensor.save([t, t.view(torch.int32)], tmp_path / "x.pt")


@pytest.mark.skipif(_torch.VERSION < (2, 6), reason="torch.serialization.set_crc32_options is torch 2.6's")
def test_torch_files_without_crcs_load(tmp_path):
    """torch.serialization.set_crc32_options(False) writes 0 for every CRC: nothing to verify."""
    obj = training_state()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(obj, tmp_path / "nocrc.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    assert_same(pyfastensor.load(tmp_path / "nocrc.pt"), torch.load(tmp_path / "nocrc.pt"))


def test_mmap_and_weights_only_env_follow_torch(tmp_path, monkeypatch):
    obj = odd_tensors()
    pyfastensor.save(obj, tmp_path / "x.pt")
    assert_same(pyfastensor.load(tmp_path / "x.pt", mmap=True), torch.load(tmp_path / "x.pt", mmap=True))
    pyfastensor.save({"cls": Tiny}, tmp_path / "set.pt")
    with pytest.raises(pickle.UnpicklingError):
        pyfastensor.load(tmp_path / "set.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    assert pyfastensor.load(tmp_path / "set.pt") == {"cls": Tiny}
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    with pytest.raises(pickle.UnpicklingError):
        pyfastensor.load(tmp_path / "set.pt", weights_only=False)


@pytest.mark.parametrize("writer", ["pyfastensor", "torch"])
def test_mmap_storages_are_views_of_one_mapping_of_the_file(tmp_path, writer):
    """mmap=True: every storage lies in one mapping of the file, at one of its records' offsets."""
    obj = training_state()
    path = tmp_path / "m.pt"
    (pyfastensor.save if writer == "pyfastensor" else torch.save)(obj, path)
    got = pyfastensor.load(path, mmap=True)
    assert_same(got, torch.load(path, mmap=True))
    assert sharing(got) == sharing(obj)
    offsets = set()
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset + 26)
            h = f.read(4)
            offsets.add(info.header_offset + 30 + int.from_bytes(h[:2], "little") + int.from_bytes(h[2:], "little"))
    with open("/proc/self/maps") as m:  # start, file offset of each mapping of this file
        maps = [ln.split() for ln in m if ln.rstrip().endswith(str(path))]
    starts = [int(r[0].split("-")[0], 16) for r in maps if int(r[2], 16) == 0]
    assert len(starts) == 1
    ptrs = {t.untyped_storage().data_ptr() for t in tensors(got) if t.numel()}
    assert len(ptrs) > 5 and {p - starts[0] for p in ptrs} <= offsets


def _drop_pages(path) -> bool:
    """Drop ``path``'s cached pages; False when the filesystem keeps them (tmpfs)."""
    from pyfastensor.checkpoint._native import Archive

    evict(path)
    with Archive(path) as a:  # opening reads the small records' headers: look at the big ones
        return max(r for e, r in zip(a.entries, a.resident(), strict=True) if e.size >= 1 << 20) < 0.5


def test_cold_large_storages_load_page_aligned_and_shareable(tmp_path):
    """Cold storages of 1 MiB and up come back in page-aligned memory O_DIRECT fills in place;
    they share between processes like any other, and refuse resizing like mmap=True ones."""
    path = tmp_path / "big.pt"
    sd = {"big": torch.randn(1 << 20), "small": torch.randn(100)}
    pyfastensor.save(sd, path)
    if not _drop_pages(path):
        pytest.skip("the temporary directory keeps its pages cached")
    got = pyfastensor.load(path)
    assert torch.equal(got["big"], sd["big"]) and torch.equal(got["small"], sd["small"])
    assert got["big"].data_ptr() % 4096 == 0
    got["big"].share_memory_()
    assert got["big"].is_shared() and torch.equal(got["big"], sd["big"])
    _drop_pages(path)
    with pytest.raises(RuntimeError, match="not resizable"):
        pyfastensor.load(path)["big"].untyped_storage().resize_(8)


def test_cached_large_storages_load_into_aligned_memory_too(tmp_path):
    """A large record the page cache holds is copied from it into page-aligned memory of its
    own (huge pages: a fault per 2 MiB); a small one into torch's."""
    path = tmp_path / "big.pt"
    sd = {"big": torch.randn(1 << 20), "small": torch.randn(100)}
    pyfastensor.save(sd, path)
    path.read_bytes()  # now cached
    got = pyfastensor.load(path)
    assert torch.equal(got["big"], sd["big"]) and torch.equal(got["small"], sd["small"])
    assert got["big"].data_ptr() % 4096 == 0
    with pytest.raises(RuntimeError, match="not resizable"):
        got["big"].untyped_storage().resize_(8)
    got["small"].untyped_storage().resize_(8)  # torch's allocator: resizable


def test_load_falls_back_to_torch_memory_when_mappings_run_out(tmp_path, monkeypatch):
    from pyfastensor import _buffers

    path = tmp_path / "big.pt"
    sd = {"big": torch.randn(1 << 20)}
    pyfastensor.save(sd, path)

    pyfastensor.empty_cache()  # no run kept from an earlier load to reuse
    monkeypatch.setattr(_buffers, "_map_pages", lambda maplen: None)  # the kernel refuses every mapping
    got = pyfastensor.load(path)
    assert torch.equal(got["big"], sd["big"])
    got["big"].untyped_storage().resize_(8)  # torch's own storage: resizable, unlike a mapping

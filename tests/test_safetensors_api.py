"""pyfastensor.safetensors as the whole of safetensors.torch: the same functions, signatures and
results, checked against the safetensors package itself."""

from __future__ import annotations

import inspect
import struct

import pytest
import safetensors
import safetensors.torch as st
import torch

import pyfastensor
import pyfastensor.safetensors as ours
from pyfastensor import CorruptFileError


def mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "f32": torch.randn(3, 4, generator=g),  # F32 and I32 are both 32 bits: the package's order
        "i32": torch.randint(-9, 9, (5,), generator=g, dtype=torch.int32),
        "bf16": torch.randn(2, 2, generator=g).to(torch.bfloat16),
        "u8": torch.randint(0, 255, (7,), generator=g, dtype=torch.uint8),
        "b": torch.tensor([True, False]),
        "f64": torch.randn(1, generator=g, dtype=torch.float64),
        "i64": torch.arange(3),
        "c64": torch.randn(2, generator=g, dtype=torch.complex64),
        "é名 \"quoted\"\n": torch.ones(1),  # serde_json's spelling: UTF-8 as it is, control escaped
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(1.5),
    }


def test_every_public_function_of_safetensors_torch_is_here_with_its_signature():
    for name in ("save", "save_file", "load", "load_file", "save_model", "load_model", "storage_ptr",
                 "storage_size"):
        theirs, mine = inspect.signature(getattr(st, name)), inspect.signature(getattr(ours, name))
        for p in theirs.parameters.values():
            assert p.name in mine.parameters, f"{name}: no {p.name}"
            q = mine.parameters[p.name]
            assert (q.kind, q.default) == (p.kind, p.default), f"{name}({p.name})"
    theirs_open = inspect.signature(safetensors.safe_open.__init__)
    mine_open = inspect.signature(ours.safe_open.__init__)
    assert "backend" in mine_open.parameters and mine_open.parameters["backend"].default == "mmap"
    assert {"get_tensor", "get_slice", "get_tensors", "keys", "offset_keys", "metadata"} <= set(dir(ours.safe_open))
    del theirs_open


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {}])
def test_save_gives_the_packages_bytes(metadata):
    t = mixed()
    assert ours.save(t, metadata) == st.save(t, metadata)


def test_save_file_of_small_tensors_is_the_packages_file_and_of_large_ones_page_aligned(tmp_path):
    t = mixed()
    ours.save_file(t, tmp_path / "ours.safetensors", {"format": "pt"})
    st.save_file(t, tmp_path / "theirs.safetensors", {"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    t["big"] = torch.zeros(1 << 18)  # 1 MiB: O_DIRECT reads it in place from a 4 KiB boundary
    ours.save_file(t, tmp_path / "big.safetensors")
    head = (tmp_path / "big.safetensors").read_bytes()[:8]
    assert (8 + struct.unpack("<Q", head)[0]) % 4096 == 0
    back = st.load_file(tmp_path / "big.safetensors")
    assert all(torch.equal(back[k], t[k]) for k in t if t[k].dtype != torch.bool) and torch.equal(back["b"], t["b"])


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_load_reads_the_packages_bytes(wrap):
    t = mixed()
    got = ours.load(wrap(st.save(t)))
    assert sorted(got) == sorted(st.load(st.save(t)))  # the package's order is its hash map's
    for k in t:
        assert got[k].dtype == t[k].dtype and torch.equal(got[k].view(torch.uint8) if t[k].dim() else got[k],
                                                          t[k].view(torch.uint8) if t[k].dim() else t[k])


def test_bad_bytes_are_a_safetensors_error_and_a_corrupt_file_error():
    data = bytearray(ours.save({"a": torch.ones(4)}))
    data[0] = 200  # a header length beyond the bytes
    with pytest.raises(CorruptFileError) as e:
        ours.load(bytes(data))
    assert isinstance(e.value, safetensors.SafetensorError) and isinstance(e.value, ours.SafetensorError)
    with pytest.raises(safetensors.SafetensorError):
        ours.load(b"")


def test_load_file_takes_backend_as_the_package_does(tmp_path):
    t = {"a": torch.randn(3, 3)}
    ours.save_file(t, tmp_path / "a.safetensors")
    for backend in ("mmap", "pread"):
        assert torch.equal(ours.load_file(tmp_path / "a.safetensors", backend=backend)["a"], t["a"])
    with pytest.raises(safetensors.SafetensorError, match="backend 'nope'"):
        ours.load_file(tmp_path / "a.safetensors", backend="nope")
    with pytest.raises(FileNotFoundError) as e:
        ours.load_file(tmp_path / "missing.safetensors")
    assert str(e.value) == f"No such file or directory: {tmp_path / 'missing.safetensors'}"


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_save_model_keeps_tied_weights_once_and_both_packages_load_it(tmp_path):
    model = Tied()
    ours.save_model(model, tmp_path / "ours.safetensors")
    with safetensors.safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.keys() == ["embed.weight"] and f.metadata() == {"head.weight": "embed.weight"}
    for load_model in (ours.load_model, st.load_model):
        other = Tied()
        assert load_model(other, tmp_path / "ours.safetensors") in (([], []), (set(), []))
        assert torch.equal(other.embed.weight, model.embed.weight) and other.head.weight is other.embed.weight
    st.save_model(model, tmp_path / "theirs.safetensors")
    other = Tied()
    assert ours.load_model(other, tmp_path / "theirs.safetensors") == ([], [])
    assert torch.equal(other.head.weight, model.head.weight)


def test_load_model_names_what_is_missing_and_unexpected(tmp_path):
    ours.save_file({"weight": torch.ones(2, 2), "extra": torch.ones(1)}, tmp_path / "m.safetensors")
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "bias".*\n.*Unexpected key\(s\) in '
                                           r'state_dict: "extra"'):
        ours.load_model(lin, tmp_path / "m.safetensors")
    assert ours.load_model(lin, tmp_path / "m.safetensors", strict=False) == (["bias"], ["extra"])
    assert torch.equal(lin.weight, torch.ones(2, 2))


def test_save_model_refuses_shared_tensors_none_of_which_covers_the_storage(tmp_path):
    class Halves(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            base = torch.zeros(10)
            self.a = torch.nn.Parameter(base[:6])
            self.b = torch.nn.Parameter(base[4:])

    with pytest.raises(RuntimeError, match=r"share memory but none covers all of it"):
        ours.save_model(Halves(), tmp_path / "h.safetensors")


@pytest.fixture
def sliced(tmp_path):
    a = torch.arange(60.0).reshape(10, 6)
    ours.save_file({"a": a, "v": torch.arange(7), "s": torch.tensor(3.0)}, tmp_path / "s.safetensors",
                   metadata={"k": "v"})
    return tmp_path / "s.safetensors", a


def test_safe_open_gives_what_the_packages_gives(sliced):
    path, a = sliced
    with ours.safe_open(path, framework="pt") as f, safetensors.safe_open(path, framework="pt") as g:
        assert f.keys() == g.keys() and f.offset_keys() == g.offset_keys() and f.metadata() == g.metadata()
        for k in g.keys():
            assert torch.equal(f.get_tensor(k), g.get_tensor(k))
        assert sorted(f.get_tensors()) == sorted(g.get_tensors())
        fs, gs = f.get_slice("a"), g.get_slice("a")
        assert fs.get_shape() == gs.get_shape() == [10, 6] and fs.get_dtype() == gs.get_dtype() == "F32"
        for index in (slice(None), (), slice(2, 5), (slice(None), slice(1, 3)), (0, slice(None, 2)),
                      (slice(2, None), 0), (slice(2, None), -1), [], (slice(1, 9, 3), slice(None, None, 2)),
                      (slice(None, 3), 4), 7):
            got, want = fs[index], gs[index] if not isinstance(index, tuple) or all(
                not isinstance(i, slice) or i.step is None for i in index) else a[index]
            assert torch.equal(got, want), index
            assert got.is_contiguous() and got.untyped_storage().nbytes() == got.numel() * 4, index
        assert torch.equal(f.get_slice("s")[()], g.get_slice("s")[()])


def test_a_slice_reads_only_the_rows_it_spans(sliced, monkeypatch):
    path, a = sliced
    sizes = []
    real = ours._files.read_raw
    monkeypatch.setattr(ours._files, "read_raw",
                        lambda src, extents, **kw: sizes.extend(n for _, _, n in extents) or real(src, extents, **kw))
    with ours.safe_open(path, "pt") as f:
        assert torch.equal(f.get_slice("a")[3:5], a[3:5])
    assert sizes == [2 * 6 * 4]


def test_safe_open_refuses_as_the_package_does(sliced):
    path, _ = sliced
    with ours.safe_open(path, "pt") as f:
        s = f.get_slice("a")
        for index, says in (((slice(2, None), -7), "Invalid index -7 for dimension 1 of size 6"),
                            ([0, 1], "Non empty lists are not implemented"),
                            (slice(None, 20), "index 19 out of bounds for tensor dimension #0 of size 10")):
            with pytest.raises(safetensors.SafetensorError, match=says):
                s[index]
        with pytest.raises(safetensors.SafetensorError, match="does not contain tensor nope"):
            f.get_tensor("nope")
    with pytest.raises(safetensors.SafetensorError, match="File is closed"):
        f.keys()
    with pytest.raises(safetensors.SafetensorError):
        ours.safe_open(path, "pt", backend="nope")
    with pytest.raises(FileNotFoundError, match="No such file or directory"):
        ours.safe_open(path.with_name("missing"), "pt")


def test_safe_open_of_another_framework_is_the_packages(sliced):
    path, a = sliced
    with ours.safe_open(path, framework="np") as f:
        assert isinstance(f, safetensors.safe_open)
        assert (f.get_tensor("a") == a.numpy()).all()


def test_safe_open_to_a_cuda_device_goes_through_the_pinned_ring(sliced):
    from cuda_fakes import FakeCuda

    from pyfastensor import _device

    path, a = sliced
    fake = FakeCuda()
    with _device.using(fake), ours.safe_open(path, "pt", device="cuda:1") as f:
        whole = f.get_tensor("a")
        rows = f.get_slice("a")[2:4]
    assert torch.equal(whole, a) and torch.equal(rows, a[2:4])
    assert {loc for _, loc in fake.empties} == {"cuda:1"}


def test_the_error_classes_are_the_packages_where_it_is_installed():
    assert issubclass(ours.SafetensorError, safetensors.SafetensorError)
    assert issubclass(ours.CorruptSafetensorsError, pyfastensor.CorruptFileError)
    assert issubclass(ours.UnsupportedSafetensorsError, pyfastensor.UnsupportedError)

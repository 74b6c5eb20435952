"""pyfastensor.open (lazy partial loads) and progress bars."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
from checkpoint_helpers import assert_same

import pyfastensor
from pyfastensor.checkpoint import _native, _progress


def state() -> dict:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
    sd = m.state_dict()
    sd["alias"] = sd["0.weight"]
    sd["view"] = sd["1.weight"][2:4]
    sd["nested"] = {"x": torch.arange(5), "p": torch.nn.Parameter(torch.ones(2))}
    return sd


def test_open_loads_only_chosen_records(tmp_path, monkeypatch):
    sd = state()
    torch.save(sd, tmp_path / "t.pt")  # torch's own file works too
    pyfastensor.save(sd, tmp_path / "o.pt")
    for path in (tmp_path / "t.pt", tmp_path / "o.pt"):
        reads = []
        real = _native.Archive.read

        def spy(self, rd, reads=reads, real=real, **kw):
            reads.append([self.entries[i].name for i, _, _ in rd])
            return real(self, rd, **kw)

        monkeypatch.setattr(_native.Archive, "read", spy)
        with pyfastensor.open(path) as ck:
            assert ck.keys() == list(sd.keys())
            assert ck.skeleton["0.bias"].shape == (16,) and ck.skeleton["0.bias"].is_meta
            reads.clear()
            w = ck["0.weight"]
            assert reads == [["archive/data/0"]] or len(reads[0]) == 1
            assert_same(w, sd["0.weight"])
            got = ck.load(["alias", "view", "nested"])
            assert got["alias"].data_ptr() == w.data_ptr()  # shared across calls
            assert got["view"].storage_offset() == sd["view"].storage_offset()
            assert_same(got["nested"], sd["nested"])
            assert_same(ck.load(), torch.load(path))
        monkeypatch.undo()


def test_open_keeps_reading_the_file_it_opened(tmp_path):
    path = tmp_path / "x.pt"
    old = {"a": torch.arange(5000.0), "b": torch.ones(3)}
    pyfastensor.save(old, path)
    with pyfastensor.open(path) as ck:
        pyfastensor.save({"b": torch.zeros(9), "a": torch.full((100,), 2.0)}, path)  # replaced
        assert_same(ck.load(), old)
    assert_same(pyfastensor.open(path).load()["a"], torch.full((100,), 2.0))


def test_open_rejects_missing_keys(tmp_path):
    pyfastensor.save({"a": torch.ones(1)}, tmp_path / "x.pt")
    with pyfastensor.open(tmp_path / "x.pt") as ck:
        assert "a" in ck and "b" not in ck
        with pytest.raises(KeyError):
            ck.load(["b"])


class _Pair(typing.NamedTuple):
    w: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class _Layer:
    w: torch.Tensor
    scale: float


class _PicklesOnce:
    """Loads from a pickle, but refuses to be pickled again (nor deep-copied)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.loaded = t, False

    def __getstate__(self) -> dict:
        if self.loaded:
            raise TypeError("pickled once only")
        return {"t": self.t}

    def __setstate__(self, state: dict) -> None:
        self.t, self.loaded = state["t"], True


def _no_meta(obj: typing.Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for v in obj.values():
        found.extend(x for x in (getattr(v, "w", None), getattr(v, "b", None), getattr(v, "weight", None))
                     if isinstance(x, torch.Tensor) and x.is_meta)
    return found


def test_open_loads_tensors_in_named_tuples_dataclasses_and_objects(tmp_path):
    torch.manual_seed(0)
    base = torch.randn(6)
    obj = {"pair": _Pair(torch.randn(2), torch.arange(3)), "layer": _Layer(base[2:5], 0.5),
           "lin": torch.nn.Linear(2, 3), "base": base, "bytes": torch.arange(4, dtype=torch.int16).untyped_storage(),
           "size": torch.Size([2, 3]), "tail": [_Pair(base[:1], base[1:2])]}
    path = tmp_path / "objects.pt"
    torch.save(obj, path)
    want = torch.load(path, weights_only=False)
    with pyfastensor.open(path, weights_only=False) as ck:
        one = {k: ck[k] for k in ck.keys()}
        every = ck.load()
        assert ck.skeleton["pair"].w.is_meta  # the skeleton stays as it was
    for got in (one, every):
        assert _no_meta(got) == []
        assert type(got["pair"]) is _Pair and type(got["layer"]) is _Layer and type(got["size"]) is torch.Size
        assert torch.equal(got["pair"].w, want["pair"].w) and torch.equal(got["pair"].b, want["pair"].b)
        assert torch.equal(got["layer"].w, want["layer"].w) and got["layer"].scale == 0.5
        assert got["layer"].w.storage_offset() == 2
        assert type(got["lin"].weight) is torch.nn.Parameter
        assert torch.equal(got["lin"].weight, want["lin"].weight) and torch.equal(got["lin"].bias, want["lin"].bias)
        assert got["bytes"]._untyped_storage.device.type == "cpu"
        assert torch.equal(torch.tensor([], dtype=torch.uint8).set_(got["bytes"]._untyped_storage),
                           torch.tensor([], dtype=torch.uint8).set_(want["bytes"]._untyped_storage))
        assert torch.equal(got["tail"][0].w, base[:1]) and torch.equal(got["tail"][0].b, base[1:2])
    # views in an object share the storage of the tensors loaded with them, across calls too
    assert every["layer"].w.data_ptr() == every["base"].data_ptr() + 2 * 4
    assert one["layer"].w.data_ptr() == one["base"].data_ptr() + 2 * 4


def test_open_refuses_objects_it_cannot_find_tensors_in(tmp_path):
    path = tmp_path / "once.pt"
    torch.save({"once": _PicklesOnce(torch.ones(2)), "ok": torch.ones(3)}, path)
    with pyfastensor.open(path, weights_only=False) as ck:
        assert torch.equal(ck["ok"], torch.ones(3))
        with pytest.raises(TypeError, match=r"cannot load key 'once' of .*_PicklesOnce.*pyfastensor\.load"):
            ck["once"]
        with pytest.raises(TypeError, match=r"cannot load the checkpoint of .*pickled once only"):
            ck.load()


def test_save_and_open_a_checkpoint_whose_name_is_255_bytes(tmp_path):
    path = tmp_path / ("é" * 126 + ".pt")  # 255 bytes: the longest name the filesystem allows
    sd = state()
    pyfastensor.save(sd, path)
    pyfastensor.async_save(sd, path).result()
    with pyfastensor.open(path) as ck:
        assert_same(ck.load(), torch.load(path))
        assert torch.equal(ck["0.weight"], sd["0.weight"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("env,arg,shown", [("1", None, True), ("0", None, False), ("0", True, True),
                                           ("1", False, False)])
def test_progress_bar_setting(tmp_path, monkeypatch, capsys, env, arg, shown):
    monkeypatch.setenv("PYFASTENSOR_PROGRESS", env)
    monkeypatch.setattr(_progress, "DELAY", 0)  # a bar from the start, however short the call
    monkeypatch.setattr(_progress, "MIN_BYTES", 0)
    obj = {"w": torch.randn(4_000_000)}
    pyfastensor.save(obj, tmp_path / "x.pt", progress=arg)
    got = pyfastensor.load(tmp_path / "x.pt", progress=arg)
    assert torch.equal(got["w"], obj["w"])
    err = capsys.readouterr().err
    assert ("save x.pt" in err and "load x.pt" in err) == shown


def test_progress_bar_surfaces_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.setattr(_progress, "MIN_BYTES", 0)
    with pytest.raises(FileNotFoundError):
        pyfastensor.save({"w": torch.ones(10)}, tmp_path / "missing" / "x.pt", progress=True)


def test_cli_verify_and_ls(tmp_path, capsys):
    import argparse

    from pyfastensor.checkpoint_cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())

    def main(argv):
        args = parser.parse_args(argv)
        return args.func(args)

    path = tmp_path / "x.pt"
    pyfastensor.save({"w": torch.ones(1000)}, path)
    assert main(["ckpt", "verify", str(path)]) == 0
    assert main(["ckpt", "ls", "--keys", str(path)]) == 0
    out = capsys.readouterr().out
    assert "archive/data/0" in out and "w: (1000,) torch.float32" in out
    data = path.read_bytes()
    at = data.index(torch.ones(1000).numpy().tobytes()[:64]) + 100
    path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    assert main(["ckpt", "verify", str(path)]) == 1
    assert "archive/data/0" in capsys.readouterr().out

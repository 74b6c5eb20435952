"""pyfastensor.route(): a whole program's torch.save / torch.load and safetensors calls through
pyfastensor, and back on close; nothing recurses, whatever the caller has rebound."""

from __future__ import annotations

import gzip
import io
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import types

import pytest
import safetensors
import safetensors.torch
import torch
import torch.serialization
import torch.utils.data._utils.worker as dl_worker
from checkpoint_helpers import assert_same

import pyfastensor
import pyfastensor.safetensors as ours
from pyfastensor import _torch
from pyfastensor.checkpoint import load as pf_load
from pyfastensor.checkpoint import save as pf_save

ST_NAMES = ("save", "save_file", "load", "load_file", "save_model", "load_model")


def originals() -> dict[str, object]:
    out = {"torch.save": torch.save, "torch.load": torch.load,
           "torch.serialization.save": torch.serialization.save,
           "torch.serialization.load": torch.serialization.load,
           "safetensors.safe_open": safetensors.safe_open, "worker_loop": dl_worker._worker_loop}
    out.update({f"safetensors.torch.{n}": getattr(safetensors.torch, n) for n in ST_NAMES})
    return out


@pytest.fixture
def aliasing_module():
    """A module that imported the functions under its own names before routing, as transformers
    and accelerate do (``from safetensors.torch import load_file as safe_load_file``)."""
    m = types.ModuleType("pft_test_aliases")
    exec(textwrap.dedent("""
        from safetensors import safe_open
        from safetensors.torch import load_file as safe_load_file, load_model
        from torch import save as torch_save
        from torch.serialization import load
    """), m.__dict__)
    sys.modules[m.__name__] = m
    yield m
    del sys.modules[m.__name__]


def test_route_replaces_every_name_and_close_binds_torchs_back(aliasing_module):
    before = originals()
    assert not pyfastensor.routed()
    with pyfastensor.route():
        assert pyfastensor.routed()
        assert torch.save is pf_save and torch.serialization.save is pf_save
        assert torch.load is pf_load and torch.serialization.load is pf_load
        for n in ST_NAMES:
            assert getattr(safetensors.torch, n) is getattr(ours, n), n
        assert safetensors.safe_open is ours.safe_open
        assert dl_worker._worker_loop.__module__ == "pyfastensor.routing"
        m = aliasing_module
        assert (m.safe_open, m.safe_load_file, m.load_model, m.torch_save, m.load) == (
            ours.safe_open, ours.load_file, ours.load_model, pf_save, pf_load)
        # A module imported while routed copies pyfastensor's functions, and is bound back too.
        late = types.ModuleType("pft_test_late")
        exec("from safetensors.torch import save_file\nfrom torch import load", late.__dict__)
        sys.modules[late.__name__] = late
        assert late.save_file is ours.save_file
    try:
        assert originals() == before
        assert (m.safe_open, m.safe_load_file, m.torch_save) == (
            before["safetensors.safe_open"], before["safetensors.torch.load_file"], before["torch.save"])
        assert late.save_file is before["safetensors.torch.save_file"] and late.load is before["torch.load"]
    finally:
        del sys.modules["pft_test_late"]
    assert not pyfastensor.routed()


def test_routes_nest_and_close_once():
    before = originals()
    outer = pyfastensor.route()
    with pyfastensor.route():
        pass
    assert torch.save is pf_save, "the inner close left the outer routing on"
    outer.close()
    outer.close()  # a second close does nothing (and does not end another routing)
    assert originals() == before and not pyfastensor.routed()


def test_other_threads_see_the_routing(tmp_path):
    seen = []
    with pyfastensor.route():
        t = threading.Thread(target=lambda: seen.append(torch.load is pf_load))
        t.start()
        t.join()
    assert seen == [True]


def test_nothing_recurses_where_pyfastensor_hands_back_to_torch(tmp_path):
    """The legacy format, a legacy file's load, a gzip file-like, dill, skip_data, fake tensors:
    pyfastensor hands these to torch, which must be torch's own function, not the routed name."""
    import dill

    state = {"w": torch.randn(4, 3), "n": 3}
    with pyfastensor.route():
        torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
        assert_same(torch.load(tmp_path / "legacy.pt", weights_only=False), state)
        torch.save(state, tmp_path / "dill.pt", pickle_module=dill)
        assert_same(torch.load(tmp_path / "dill.pt", pickle_module=dill, weights_only=False), state)
        torch.save(state, tmp_path / "zip.pt")
        with open(tmp_path / "zip.pt", "rb") as f_in, gzip.open(tmp_path / "zip.pt.gz", "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
        with gzip.open(tmp_path / "zip.pt.gz", "rb") as f:
            assert_same(torch.load(f), state)
        sparse = torch.eye(3).to_sparse()
        torch.save({"s": sparse}, tmp_path / "sparse.pt")
        got = torch.load(tmp_path / "sparse.pt")["s"]
        assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), torch.eye(3))
        with torch._subclasses.FakeTensorMode():
            fake = torch.load(tmp_path / "zip.pt")
        assert fake["w"].shape == (4, 3)
        if hasattr(torch.serialization, "skip_data"):  # torch 2.5 and later
            with torch.serialization.skip_data():
                torch.save(state, tmp_path / "skipped.pt")
            assert _torch.torch_load(tmp_path / "skipped.pt")["w"].shape == (4, 3)


def test_a_program_that_assigns_torch_save_itself_does_not_recurse(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", pyfastensor.save)
    monkeypatch.setattr(torch, "load", pyfastensor.load)
    monkeypatch.setattr(torch.serialization, "save", pyfastensor.save)
    monkeypatch.setattr(torch.serialization, "load", pyfastensor.load)
    torch.save([torch.ones(2)], tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert torch.equal(torch.load(tmp_path / "old.pt")[0], torch.ones(2))


def test_safetensors_callers_go_through_pyfastensor(tmp_path, monkeypatch):
    """safetensors' own load_model calls load_file by its module's name: routed, that is ours,
    which takes the backend= keyword safetensors 0.8 passes."""
    calls = []
    real = ours._files.read_raw
    monkeypatch.setattr(ours._files, "read_raw", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = torch.nn.Linear(4, 3)
    with pyfastensor.route():
        safetensors.torch.save_model(model, tmp_path / "m.safetensors")
        other = torch.nn.Linear(4, 3)
        assert safetensors.torch.load_model(other, tmp_path / "m.safetensors", backend="pread") == ([], [])
    assert calls, "load_model did not read through pyfastensor"
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)


def test_dataloader_workers_see_the_routing_forked_and_spawned(tmp_path):
    """A DataLoader's workers, forked or spawned, load through pyfastensor while the program is
    routed: the spawned worker routes itself before its first sample."""
    path = tmp_path / "sample.pt"
    _torch.torch_save({"x": torch.arange(3)}, path)
    script = textwrap.dedent(f"""
        import torch, pyfastensor
        class Loads(torch.utils.data.Dataset):
            def __len__(self): return 2
            def __getitem__(self, i):
                return torch.load({str(path)!r})["x"] + i, torch.load.__module__
        if __name__ == "__main__":
            with pyfastensor.route():
                for ctx in ("fork", "spawn"):
                    dl = torch.utils.data.DataLoader(Loads(), batch_size=None, num_workers=2,
                                                     multiprocessing_context=ctx)
                    for x, module in dl:
                        print(ctx, module, x.tolist())
    """)
    (tmp_path / "workers.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "workers.py")], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.split("\n")[:-1])
    assert lines == ["fork pyfastensor.checkpoint.load [0, 1, 2]", "fork pyfastensor.checkpoint.load [1, 2, 3]",
                     "spawn pyfastensor.checkpoint.load [0, 1, 2]", "spawn pyfastensor.checkpoint.load [1, 2, 3]"]


def test_route_is_lazy_and_documented_on_the_package():
    assert callable(pyfastensor.route) and "route" in pyfastensor.__all__
    assert pyfastensor.route.__doc__ and "Example" in pyfastensor.route.__doc__


def test_pickled_originals_stay_torchs():
    """A pickle of torch.save made while routed names pyfastensor's function, as it is then; the
    originals pickle by their own names afterwards."""
    with pyfastensor.route():
        assert pickle.loads(pickle.dumps(torch.save)) is pf_save
    assert pickle.loads(pickle.dumps(torch.save)) is torch.serialization.save


def test_a_buffer_round_trip_routed():
    buf = io.BytesIO()
    with pyfastensor.route():
        torch.save({"a": torch.arange(5)}, buf)
        buf.seek(0)
        assert torch.equal(torch.load(buf)["a"], torch.arange(5))

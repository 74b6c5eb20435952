"""Files across torch versions: what torch.save and pyfastensor.save wrote under torch 2.4.1 (the
floor), 2.11.0 and 2.15.0 (kept in tests/data/torch_versions/, written by its make.py) loads with
pyfastensor under the running torch, and pyfastensor's files load with the running torch's own
torch.load. Run on every torch of the matrix (make test-compat), this covers each direction:
the newest pyfastensor's files under the floor's torch.load, the floor's torch.save files under
the newest pyfastensor, and so on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_same

import pyfastensor

HERE = Path(__file__).resolve().parent / "data" / "torch_versions"
FILES = sorted(HERE.glob("*.pt"))


def _state() -> dict:
    spec = importlib.util.spec_from_file_location("torch_versions_make", HERE / "make.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.state()


def test_the_fixtures_cover_the_floor_the_gpu_images_and_the_newest():
    names = {f.name for f in FILES}
    for version in ("2.4.1", "2.11.0", "2.15.0"):
        assert {f"torch-{version}.pt", f"pyfastensor-{version}.pt"} <= names


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_pyfastensor_loads_each_versions_files(path):
    got = pyfastensor.load(path)
    assert_same(got, _state())
    assert got["row"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()


@pytest.mark.parametrize("path", [f for f in FILES if f.name.startswith("pyfastensor-")],
                         ids=[f.name for f in FILES if f.name.startswith("pyfastensor-")])
def test_this_torchs_load_reads_pyfastensors_files(path):
    assert_same(torch.load(path, weights_only=True), _state())

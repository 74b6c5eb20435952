"""Checkpoint saves and loads with engines chosen by the adaptive dictionaries."""

from __future__ import annotations

import pytest
import torch

import pyfastensor
from pyfastensor.dictionary import Dictionaries


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    # Records of several size buckets: 4 KiB, 256 KiB, 4 MiB.
    return {"a": torch.randn(1024), "b": torch.randn(64, 1024), "c": torch.randn(1024, 1024)}


def test_aware_dictionaries_explore_then_learn(tmp_path):
    state = _state()
    path = tmp_path / "ckpt.pt"
    with Dictionaries(directory=tmp_path, path=tmp_path / "dict.json", mode="aware") as d:
        for _ in range(6):
            pyfastensor.save(state, path, engine=d)
            back = pyfastensor.load(path, engine=d)
            assert all(torch.equal(state[k], back[k]) for k in state)
        desc = d.describe()
    assert torch.load(path).keys() == state.keys()  # stock torch reads it too
    # Every candidate engine was tried on the 4 MiB record's bucket while
    # exploring, and then the best one was used.
    (bucket,) = [b for b in desc["dictionaries"]["write"] if b["size"] == 4 << 20]
    assert set(bucket["engines"]) == set(desc["write"])
    assert sum(e["samples"] for e in bucket["engines"].values()) == 6
    assert bucket["best"] in desc["write"]
    (rbucket,) = [b for b in desc["dictionaries"]["read"] if b["size"] == 4 << 20]
    assert set(rbucket["engines"]) == set(desc["read"])
    assert (tmp_path / "dict.json").exists()


def test_specific_tool_through_dictionaries(tmp_path):
    state = _state()
    with Dictionaries(directory=tmp_path, path="", mode="tool", tool="posix") as d:
        pyfastensor.save(state, tmp_path / "x.pt", engine=d)
        back = pyfastensor.load(tmp_path / "x.pt", engine=d)
    assert all(torch.equal(state[k], back[k]) for k in state)


def test_closed_dictionaries_are_refused(tmp_path):
    d = Dictionaries(directory=tmp_path, path="")
    d.close()
    with pytest.raises(ValueError, match="closed"):
        pyfastensor.save(_state(), tmp_path / "x.pt", engine=d)


def test_bad_engine_object(tmp_path):
    with pytest.raises(TypeError, match="engine=42"):
        pyfastensor.save(_state(), tmp_path / "x.pt", engine=42)

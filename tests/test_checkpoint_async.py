"""pyfastensor.async_save: snapshot semantics, errors on result(), one save per target."""

from __future__ import annotations

import pytest
import torch
from checkpoint_helpers import assert_same, sharing

import pyfastensor


def test_snapshot_then_mutate(tmp_path):
    model = torch.nn.Linear(64, 64)
    sd = model.state_dict()
    sd["tied"] = sd["weight"]
    sd["view"] = sd["weight"][3:5]
    before = {k: v.clone() for k, v in sd.items()}
    fut = pyfastensor.async_save(sd, tmp_path / "x.pt")
    with torch.no_grad():
        model.weight.add_(1.0)  # the caller goes on training
        model.bias.zero_()
    assert fut.result(timeout=60) is None
    got = pyfastensor.load(tmp_path / "x.pt")
    for k in ("weight", "bias"):
        assert torch.equal(got[k], before[k])
    assert sharing(got) == sharing(sd)
    assert got["view"].storage_offset() == sd["view"].storage_offset()
    assert_same(torch.load(tmp_path / "x.pt"), got)


def test_errors_surface_on_result(tmp_path):
    fut = pyfastensor.async_save({"w": torch.ones(3)}, tmp_path / "missing" / "x.pt")
    with pytest.raises(FileNotFoundError):
        fut.result(timeout=60)


def test_one_save_in_flight_per_target(tmp_path):
    futs = [pyfastensor.async_save({"i": i, "w": torch.full((200_000,), float(i))}, tmp_path / "x.pt")
            for i in range(5)]
    for f in futs:
        f.result(timeout=60)
    got = pyfastensor.load(tmp_path / "x.pt")
    assert got["i"] == 4 and torch.equal(got["w"], torch.full((200_000,), 4.0))


def test_async_save_needs_a_path():
    import io

    with pytest.raises(TypeError, match="path"):
        pyfastensor.async_save({"w": torch.ones(1)}, io.BytesIO())

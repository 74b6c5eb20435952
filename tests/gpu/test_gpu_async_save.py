"""async_save of CUDA tensors on a real GPU: the file holds the values as of the call, in both modes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pyfastensor
from pyfastensor import _device

POOL = 1 << 20


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> _device.CudaBackend:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    monkeypatch.setenv("PYFASTENSOR_SNAPSHOT_POOL", str(POOL))
    b = _device.CudaBackend()
    with _device.using(b):
        yield b


@pytest.mark.parametrize("total", [POOL // 2, 5 * POOL], ids=["fits", "waves"])
def test_async_save_from_cuda_holds_the_values_of_the_call(tmp_path: Path, backend: _device.CudaBackend,
                                                           total: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    n = total // 4 // 8
    state = {f"w{i}": torch.randn(n + i, device="cuda", generator=g) for i in range(8)}
    state["h"] = torch.randn(999, device="cuda", generator=g).half()
    want = {k: v.cpu() for k, v in state.items()}
    fut = pyfastensor.async_save(state, tmp_path / "a.pt")
    for v in state.values():
        v.add_(1)  # on the compute stream, right after the call
    fut.result()
    got = torch.load(tmp_path / "a.pt", map_location="cpu")  # the CPU copies of the call's values
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    slab = _device.slab(backend, "snapshot")
    assert slab.allocations == 1 and not slab.held


def test_save_from_cuda_round_trips(tmp_path: Path, backend: _device.CudaBackend) -> None:
    """pyfastensor.save of a CUDA state (through the pinned ring, in pieces) loads bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(2)
    state = {f"w{i}": torch.randn(70_000 * (i + 1), device="cuda", generator=g) for i in range(6)}
    state["bf16"] = torch.randn(333_333, device="cuda", generator=g).bfloat16()
    state["small"] = torch.arange(7, device="cuda")
    for _ in range(2):
        pyfastensor.save(state, tmp_path / "s.pt")
        got = torch.load(tmp_path / "s.pt", map_location="cuda")
        for k, v in state.items():
            assert torch.equal(got[k], v), k
    ring = _device.slab(backend, "save")
    assert ring.allocations == 1 and not ring.held

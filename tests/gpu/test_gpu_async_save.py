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
    got = torch.load(tmp_path / "a.pt")
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    slab = _device.slab(backend, "save")
    assert slab.allocations == 1 and not slab.held

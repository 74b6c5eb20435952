"""async_save of CUDA tensors on a real GPU: the file holds the values as of the call, in both modes.

The stream order is what is checked: a kernel queued on the compute stream before the call
(behind a ~0.5 s ``torch.cuda._sleep``) changes the tensors, and its change must be in the file;
one queued right after the call must not. The copies of :class:`SlowCopies` each wait on their
(side) stream first, so they are still queued when the kernel after the call could run: without
the side stream waiting for the compute stream, the copies read the values before the first
change; without the compute stream waiting for the copies, the second change lands first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import pyfastensor
from pyfastensor import _device

POOL = 1 << 20
PENDING_S = 0.5  # the compute stream's work queued before the call
COPY_DELAY_S = 0.02  # the wait on the side stream before each copy (fits: 9 copies; waves: ~25)


class SlowCopies(_device.CudaBackend):
    """A :class:`~pyfastensor._device.CudaBackend` whose every copy first spins ``cycles`` on
    the stream it is issued on (the library's side stream)."""

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch.cuda._sleep(self.cycles)
        super().copy(dst, src)


def _using(monkeypatch: pytest.MonkeyPatch, b: _device.CudaBackend) -> Any:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    monkeypatch.setenv("PYFASTENSOR_SNAPSHOT_POOL", str(POOL))
    return _device.using(b)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> _device.CudaBackend:
    with _using(monkeypatch, _device.CudaBackend()) as b:
        yield b


@pytest.fixture
def slow_backend(monkeypatch: pytest.MonkeyPatch, gpu_sleep: Any) -> _device.CudaBackend:
    with _using(monkeypatch, SlowCopies(gpu_sleep.cycles(COPY_DELAY_S))) as b:
        yield b


@pytest.mark.parametrize("total", [POOL // 2, 5 * POOL], ids=["fits", "waves"])
def test_async_save_from_cuda_holds_the_values_of_the_call(tmp_path: Path, slow_backend: _device.CudaBackend,
                                                           gpu_sleep: Any, total: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    n = total // 4 // 8
    state = {f"w{i}": torch.randn(n + i, device="cuda", generator=g) for i in range(8)}
    state["h"] = torch.randn(999, device="cuda", generator=g).half()
    want = {k: (v * 2).cpu() for k, v in state.items()}  # the values of the call (x2 is exact)
    torch.cuda.synchronize()
    gpu_sleep(PENDING_S)
    for v in state.values():
        v.mul_(2)  # queued before the call, still pending when it returns: in the file
    fut = pyfastensor.async_save(state, tmp_path / "a.pt")
    for v in state.values():
        v.add_(1)  # on the compute stream, right after the call: not in the file
    fut.result()
    got = torch.load(tmp_path / "a.pt", map_location="cpu")  # the CPU copies of the call's values
    for k, v in want.items():
        assert torch.equal(got[k], v), (
            f"{k}: the file holds " + ("the values before the call's pending kernel (the copies did not wait "
                                       "for the compute stream)" if torch.equal(got[k], v / 2) else
                                       "the values after the call's next kernel (it did not wait for the "
                                       "copies)" if torch.equal(got[k], v + 1) else "other bytes"))
    slab = _device.slab(slow_backend, "snapshot")
    assert slab.allocations == 1 and not slab.held


def test_save_from_cuda_round_trips(tmp_path: Path, backend: _device.CudaBackend, gpu_sleep: Any) -> None:
    """pyfastensor.save of a CUDA state (through the pinned ring, in pieces) loads bit for bit,
    with the change of a kernel queued before the call (still pending then) in the file."""
    g = torch.Generator(device="cuda").manual_seed(2)
    state = {f"w{i}": torch.randn(70_000 * (i + 1), device="cuda", generator=g) for i in range(6)}
    state["bf16"] = torch.randn(333_333, device="cuda", generator=g).bfloat16()
    state["small"] = torch.arange(7, device="cuda")
    for _ in range(2):
        torch.cuda.synchronize()
        gpu_sleep(PENDING_S)
        for v in state.values():
            v.mul_(2)  # pending when save issues its copies: they must wait for it
        pyfastensor.save(state, tmp_path / "s.pt")
        got = torch.load(tmp_path / "s.pt", map_location="cuda")
        for k, v in state.items():
            assert torch.equal(got[k], v), f"{k}: the file misses the change queued before the call"
    ring = _device.slab(backend, "save")
    assert ring.allocations == 1 and not ring.held

"""pyfastensor.safetensors to and from CUDA on a real GPU, through the pinned rings: the same
tensors as safetensors' own functions give and read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import pyfastensor
from pyfastensor import _device

POOL = 1 << 20  # 4 slots of 256 KiB: tensors in pieces, slots reused


def tensors(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(13)
    out = {
        "big": torch.randn(700, 700, generator=g), "half": torch.randn(4097, generator=g).half(),
        "bf16": torch.randn(300_001, generator=g).bfloat16(), "bool": torch.rand(77, generator=g) > 0.5,
        "ints": torch.randint(-(2**40), 2**40, (513,), generator=g), "empty": torch.empty(0, 3),
        **{f"s{i}": torch.randn(i * 31 + 1, generator=g) for i in range(50)},
    }
    return {k: v.to(device) for k, v in out.items()}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0:
        return a.shape == b.shape and a.dtype == b.dtype
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> _device.CudaBackend:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    b = _device.CudaBackend()
    with _device.using(b):  # fresh pinned slabs, of POOL bytes
        yield b


def test_load_to_cuda_is_safetensors_own(tmp_path: Path, backend: _device.CudaBackend) -> None:
    save_file(tensors("cpu"), tmp_path / "s.safetensors")
    got = pyfastensor.safetensors.load_file(tmp_path / "s.safetensors", device="cuda")
    want = load_file(tmp_path / "s.safetensors", device="cuda")
    assert list(got) == list(want)
    for k, w in want.items():
        assert got[k].device == w.device and same_bytes(got[k], w), k


def test_save_from_cuda_holds_the_tensors(tmp_path: Path, backend: _device.CudaBackend) -> None:
    t = tensors("cuda")
    pyfastensor.safetensors.save_file(t, tmp_path / "s.safetensors", metadata={"format": "pt"})
    got = load_file(tmp_path / "s.safetensors")  # safetensors' own reader, to the host
    assert sorted(got) == sorted(t)
    for k, v in t.items():
        assert same_bytes(got[k], v.cpu()), k

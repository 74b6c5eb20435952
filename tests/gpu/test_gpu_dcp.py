"""pyfastensor.dcp with CUDA tensors on a real GPU: saved in waves through pinned memory, loaded
back to the device bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from pyfastensor.dcp import Reader, Writer


def test_dcp_round_trips_cuda_tensors_through_waves_of_pinned_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYFASTENSOR_DCP_STAGING", "1M")
    g = torch.Generator(device="cuda").manual_seed(2)
    sd = {f"w{i}": torch.randn(100_000, device="cuda", generator=g) for i in range(6)}  # 400 KB each
    sd["h"] = torch.randn(300, 7, device="cuda", generator=g).half().t()  # a view, not contiguous
    sd["cpu"] = torch.arange(1000)
    dcp.save(sd, storage_writer=Writer(tmp_path))
    assert len(list(tmp_path.glob("__0_*.pfd"))) == 3, "two 400 KB tensors a wave of 1 MiB"
    got = {k: torch.zeros_like(v.contiguous()) for k, v in sd.items()}
    dcp.load(got, storage_reader=Reader(tmp_path))
    for k, v in sd.items():
        assert got[k].device == v.device, k
        assert torch.equal(got[k].cpu(), v.cpu()), k

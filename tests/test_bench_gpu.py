"""``python -m benchmarks gpu`` where there is no GPU: a clear message and status 2; its help
and its targets' arithmetic."""

from __future__ import annotations

import pytest
import torch

import benchmarks
from benchmarks import gpu


def test_without_cuda_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert benchmarks.main(["gpu", "--quick"]) == gpu.NO_CUDA == 2
    err = capsys.readouterr().err
    assert "no CUDA device here" in err and "GPU machine" in err


def test_help_says_what_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        benchmarks.main(["gpu", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for what in ("device-to-host", "O_DIRECT", "cold load to CUDA", "async_save", "--quick", "offload"):
        assert what in out, what


def test_targets_use_paired_rounds_and_the_limits() -> None:
    # 1 GB saved in 1 s by pyfastensor and 2 s by torch, disk at 1.1 GB/s; async blocks 0.05 s.
    secs = {"save": {"pyfastensor": [1.0, 1.0], "torch": [2.0, 1.2]},
            "cold": {"pyfastensor": [1.0, 1.0], "safetensors": [1.0, 1.0]},
            "warm": {"pyfastensor": [0.5, 0.5], "safetensors": [0.5, 0.25]},
            "async": {"blocking": [0.05, 0.2], "total": [1.0, 1.0]}}
    result = {"seconds": secs, "state_bytes": 10**9, "limit": {"write_gbps": 1.1, "read_gbps": 1.0}}
    got = {t["target"]: (t["median"], t["met"]) for t in gpu.evaluate(result)}
    assert got["save from CUDA >= 85% of the disk's write limit"] == (pytest.approx(1 / 1.1), True)
    assert got["save from CUDA >= 1.5x torch.save + fsync"] == (pytest.approx(1.6), True)
    assert got["cold load to CUDA >= 1.2x safetensors"] == (1.0, False)
    assert got["warm load to CUDA >= safetensors"] == (pytest.approx(0.75), False)
    assert got["async_save blocks <= 10% of the save"] == (pytest.approx(0.125), False)
    del secs["cold"]["safetensors"], secs["warm"]["safetensors"]
    assert all(t["met"] is None for t in gpu.evaluate(result) if "safetensors" in t["target"])

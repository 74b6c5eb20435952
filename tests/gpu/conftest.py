"""The GPU suite: every test here needs a CUDA device, and is skipped, with the reason, without one.

Run on a GPU machine with ``tests/gpu/run.sh`` (the suite, then the GPU
benchmarks). CI has no GPU: ``python -m pytest tests`` reports these tests
as skipped (``-rs`` prints why).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Bit-exact gradients need deterministic kernels (cuBLAS's workspace config must be set
# before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = Path(__file__).resolve().parent
NO_GPU = "no CUDA device (torch.cuda.is_available() is False): tests/gpu runs on a GPU machine, see tests/gpu/run.sh"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)

"""The GPU suite: every test here needs a CUDA device, and is skipped, with the reason, without one.

Run on a GPU machine with ``tests/gpu/run.sh`` (the suite, then the GPU
benchmarks). CI has no GPU: ``python -m pytest tests`` reports these tests
as skipped (``-rs`` prints why).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType

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


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}: tests/gpu/run.sh's timeout stopped the suite")


if torch.cuda.is_available():
    # run.sh's timeout sends SIGTERM: pytest stops as on Ctrl-C, with the traceback of where the
    # main thread was and the summary of what ran, not silently (its SIGKILL follows 10 s later
    # if the main thread is stuck in a native call; run.sh's faulthandler_timeout has dumped
    # every thread's traceback by then).
    signal.signal(signal.SIGTERM, _stop_on_sigterm)


class GpuSleep:
    """Queues ``torch.cuda._sleep`` kernels of about a given time on the current stream: work
    still pending on a stream when the code under test issues its copies. ``_sleep`` spins for a
    number of GPU clock cycles, calibrated here once (the clock varies by GPU and boost)."""

    def __init__(self) -> None:
        torch.cuda._sleep(1000)  # the kernel's first launch loads it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 50_000_000  # ~25-50 ms
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.per_second = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)

    def cycles(self, seconds: float) -> int:
        return max(1, int(self.per_second * seconds))

    def __call__(self, seconds: float) -> None:
        torch.cuda._sleep(self.cycles(seconds))


@pytest.fixture(scope="session")
def gpu_sleep() -> GpuSleep:
    """Queue ``gpu_sleep(seconds)`` on the current stream; ``gpu_sleep.cycles(seconds)`` for a
    ``torch.cuda._sleep`` of one's own (on another stream)."""
    return GpuSleep()

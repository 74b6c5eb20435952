"""Offload of CUDA activations on a real GPU: gradients bit-for-bit those without offload."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from offload_models import assert_same_grads, inputs, loss_of

import pyfastensor
from pyfastensor import _device
from pyfastensor.offload import _staging


@pytest.fixture(autouse=True)
def deterministic() -> Any:
    """Kernels that give the same bits run after run (a difference must be offload's)."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


def train_cuda(model: torch.nn.Module, batch_of: Any, steps: int, ctx: Any = None,
               prepare: Any = None) -> list[list[torch.Tensor]]:
    """Train a copy of ``model`` on the GPU (``prepare`` called on it first); every step's gradients."""
    model = copy.deepcopy(model).cuda()
    if prepare is not None:
        prepare(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = []
    for i in range(steps):
        x, y = (t.cuda() for t in batch_of(i))
        opt.zero_grad()
        if ctx is None:
            loss_of(model, x, y).backward()
        else:
            with ctx():
                loss_of(model, x, y).backward()
        out.append([p.grad.detach().cpu() for p in model.parameters()])
        opt.step()
    return out


@pytest.mark.parametrize("tier", ["ssd", "host"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "transformer"])
def test_gradients_bit_identical_with_cuda_activations_offloaded(tmp_path: Path, model_name: str, tier: str) -> None:
    model, batch_of = inputs(model_name)
    want = train_cuda(model, batch_of, 4)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=16 << 10, module=model, tier=tier)
    allocations: list[int] = []

    def ctx() -> pyfastensor.Offload:
        if off.step:
            allocations.append(off.summary().pinned_allocations)
        return off

    got = train_cuda(model, batch_of, 4, ctx=ctx)
    allocations.append(off.summary().pinned_allocations)
    for step, (a, b) in enumerate(zip(want, got, strict=True)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert torch.equal(x, y), f"step {step}, tensor {i}"
    assert off.summary().offloaded_tensors > 0
    assert allocations[0] > 0 and allocations[1:] == [0, 0, 0], allocations
    if tier == "host":
        assert off.summary().engines == {}, "the pinned copies are the host tier's: nothing in the native store"
    off.close()


@pytest.mark.parametrize("tier", ["ssd", "host"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])  # bf16 attention's backward may not be deterministic
def test_autocast_weight_casts_recast_bit_identical(tmp_path: Path, model_name: str, tier: str) -> None:
    model, batch_of = inputs(model_name)

    def autocast() -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16)

    want = train_cuda(model, batch_of, 3, ctx=autocast)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=16 << 10, module=model, tier=tier)

    def both() -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(off)
        stack.enter_context(autocast())
        return stack

    assert_same_grads(want, train_cuda(model, batch_of, 3, ctx=both))
    s = off.summary()
    assert s.recast_tensors > 0 and s.offloaded_tensors > 0, str(s)
    off.close()


class _SpyEvent:
    def __init__(self, log: list[str]) -> None:
        self.e, self.log = torch.cuda.Event(), log

    def record(self, stream: Any) -> None:
        self.e.record(stream)

    def query(self) -> bool:
        return bool(self.e.query())

    def synchronize(self) -> None:
        self.log.append(threading.current_thread().name)
        self.e.synchronize()

    def wait(self, stream: Any) -> None:  # torch.cuda.Stream.wait_event(spy)
        self.e.wait(stream)


class _Spy(_device.CudaBackend):
    def __init__(self) -> None:
        self.log: list[str] = []

    def event(self) -> Any:
        return _SpyEvent(self.log)


@contextlib.contextmanager
def no_device_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Inside: any synchronizing CUDA call torch checks (``.item()``, ``.cpu()`` and other copies
    to the host that are not ``non_blocking``, a stream's ``synchronize()``, ``nonzero``...)
    raises, by ``torch.cuda.set_sync_debug_mode("error")``. The CPU waits that mode does not see
    (``torch.cuda.synchronize()``, ``torch.cuda.Event.synchronize()``) are logged in the list
    yielded, by name, when the caller's thread makes them (other threads may wait)."""
    waits: list[str] = []

    def logged(f: Any, name: str) -> Any:
        def wait(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                waits.append(name)
            return f(*args, **kwargs)
        return wait

    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "synchronize", logged(torch.cuda.synchronize, "torch.cuda.synchronize"))
        m.setattr(torch.cuda.Event, "synchronize", logged(torch.cuda.Event.synchronize, "Event.synchronize"))
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield waits
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_pack_does_not_wait_for_the_copy(tmp_path: Path, tier: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch_of = inputs("mlp")
    model = model.cuda()
    spy = _Spy()
    # compression=None (the default): every payload "raw". The sparse codec syncs by design (it
    # counts the nonzero elements on the host), so it is not asked for here.
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=16 << 10, module=model, tier=tier,
                              compression=None)
    off._device_staging = _staging.Staging(spy)
    x, y = (t.cuda() for t in batch_of(0))
    with off:
        with no_device_sync(monkeypatch) as waits:  # the forward: every pack
            loss = loss_of(model, x, y)
        assert off.summary().offloaded_tensors > 0, "nothing was packed: nothing was checked"
        assert waits == [], f"the forward waited for the device on the caller's thread: {waits}"
        main = [n for n in spy.log if n == threading.main_thread().name]
        assert main == [], "pack waited for a device-to-host copy on the caller's thread"
        loss.backward()
    if tier == "ssd":
        assert spy.log, "the store's thread waited for the copies' events"
    else:
        assert spy.log == [], "the host tier never waits for a copy on the CPU"
    off.close()


def _compile_blocks(model: torch.nn.Module) -> None:
    for block in model:
        block.compile(backend="aot_eager", fullgraph=True)


@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_blocks_compiled_one_by_one_offload_bit_identical(tmp_path: Path, tier: str) -> None:
    """torch.compile per block (aot_eager: AOTAutograd's graphs, no kernel compile time), CUDA
    activations offloaded at each block's end: the gradients of the same compiled model."""
    model, batch_of = inputs("transformer")
    torch._dynamo.reset()
    want = train_cuda(model, batch_of, 3, prepare=_compile_blocks)
    torch._dynamo.reset()
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=16 << 10, module=model, tier=tier)
    got = train_cuda(model, batch_of, 3, ctx=lambda: off, prepare=_compile_blocks)
    for step, (a, b) in enumerate(zip(want, got, strict=True)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert torch.equal(x, y), f"step {step}, tensor {i}"
    assert off.summary().offloaded_tensors > 0
    off.close()

"""pyfastensor.offload around a model compiled with torch.compile: no graph break, same gradients.

The ``aot_eager`` backend runs what inductor would be given (Dynamo's graph, AOTAutograd's
forward and backward, which save their tensors through the hooks) without compiling kernels, so
the gradients are comparable bit for bit and no C++ toolchain is needed.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import warnings

import pytest
import torch
from offload_models import inputs, loss_of
from torch import nn

import pyfastensor
from benchmarks.workloads import deep_mlp
from pyfastensor import _torch
from pyfastensor.offload._store import SpillStore

pytestmark = pytest.mark.filterwarnings(
    # torch's own notice that global module hooks (the offload's parameter watch) also fire
    # for the compiled wrapper: harmless here, and what this file tests around.
    "ignore:Using `torch.compile\\(module\\)` when there are global hooks:UserWarning"
)


class Scaled(nn.Module):
    """Two linear layers and a buffer that autograd saves (``h * scale`` keeps ``scale``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(128, 256)
        self.b = nn.Linear(256, 128)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x)) * self.scale)


def _grads(model: nn.Module, step, x: torch.Tensor, ctx=None) -> list[torch.Tensor]:
    model.zero_grad()
    with ctx or contextlib.nullcontext():
        loss = step(x).square().sum()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kw", [dict(tier="ssd"), dict(tier="host"),
                                dict(policy="scheduled", budget=64 << 10)],
                         ids=["ssd", "host", "scheduled"])
def test_compiled_model_has_no_graph_break_and_the_same_gradients(tmp_path, monkeypatch, kw):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Scaled()
    x = torch.randn(64, 128)
    puts: list[int] = []
    real = SpillStore.put

    def spy(self, addr, n, account=0):
        puts.append(addr)
        return real(self, addr, n, account)

    monkeypatch.setattr(SpillStore, "put", spy)
    # fullgraph=True: a graph break anywhere, the offload's hooks included, is an error.
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=1 << 10, **kw)
    got = [_grads(model, compiled, x, off)]  # the first call compiles inside it
    stats = torch._dynamo.utils.counters["stats"]
    graphs = stats["unique_graphs"]
    got += [_grads(model, compiled, x, off) for _ in range(2)]
    assert stats["unique_graphs"] == graphs > 0, "a later step compiled again"
    s = off.summary()
    off.close()

    torch._dynamo.reset()
    plain = torch.compile(model, backend="aot_eager", fullgraph=True)
    want = _grads(model, plain, x)
    for g in got:
        assert all(torch.equal(a, b) for a, b in zip(g, want, strict=True))
    assert s.offloaded_tensors > 0  # the compiled graph's saved tensors went through the hooks
    assert model.scale.data_ptr() not in puts  # the buffer was known through the compiled wrapper


def _fullgraph_compiles_builtin_layers() -> bool:
    """Whether this torch runs a builtin layer compiled in place with ``fullgraph=True``: torch
    2.13 raises "found no compiled frames" there (the layer's forward is in Dynamo's skipfiles),
    offload or not. Where it does not, a graph break is still counted, and checked, below."""
    torch._dynamo.reset()
    layer = nn.Linear(2, 2)
    layer.compile(backend="aot_eager", fullgraph=True)
    try:
        layer(torch.zeros(1, 2))
    except RuntimeError as e:
        if "found no compiled frames" not in str(e):
            raise
        return False
    return True


def test_modules_compiled_one_by_one_keep_the_saved_tensors_within_the_budget(tmp_path):
    """Each compiled module saves its tensors at the end of its forward and takes them all back
    at the start of its backward: compiled module by module, the offload holds the budget as in
    eager mode (a whole model in one graph would take everything back at once)."""
    fullgraph = _fullgraph_compiles_builtin_layers()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = deep_mlp(256, 8), torch.randn(256, 256)
    y = torch.randint(0, 10, (256,))

    def step(ctx) -> None:
        with ctx:
            nn.functional.cross_entropy(model(x), y).backward()

    none = pyfastensor.offload(policy="none", min_size=64 << 10, module=model)
    step(none)
    base = none.summary().resident_peak_bytes
    none.close()
    for layer in model:
        layer.compile(backend="aot_eager", fullgraph=fullgraph)
    breaks = torch._dynamo.utils.counters["graph_break"]
    breaks.clear()
    off = pyfastensor.offload(policy="all", budget=base // 5, min_size=64 << 10, module=model,
                              spill_dir=str(tmp_path))
    for _ in range(3):
        step(off)
        s = off.summary()
        assert s.offloaded_tensors > 0
        assert s.resident_peak_bytes <= base // 4, (s.resident_peak_bytes, base)
    off.close()
    # Where torch leaves a layer compiled in place to eager mode (2.11 does, builtin layers),
    # the hooks run there, and must not be compiled as frames of their own.
    assert not breaks, dict(breaks)


INDUCTOR = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                              reason="inductor's CPU backend compiles C++: no C++ compiler here")


def _grads_of(model: nn.Module, step, batch_of):
    """A function of a context: the gradients of ``model``'s parameters after one step of ``step``
    (``model`` itself or a compiled form of it) on batch 0 inside that context."""

    def grads(ctx):
        model.zero_grad()
        x, y = batch_of(0)
        with ctx:
            loss_of(step, x, y).backward()
        return [p.grad.clone() for p in model.parameters()]

    return grads


def _auto_frontier(model: nn.Module, run, tmp_path) -> tuple[int, int]:
    """policy="auto"'s smallest feasible budget and its saved tensors' peak without offload, for the
    step ``run(ctx)`` (a plan for a budget no mix needs)."""
    probe = pyfastensor.offload(policy="auto", budget=1 << 40, spill_dir=str(tmp_path), min_size=4 << 10,
                                module=model)
    for _ in range(3):
        run(probe)
    details = probe.plan_details
    probe.close()
    return details["min_budget"], details["frontier"][0]["peak_bytes"]


def _auto_steps(model: nn.Module, run, budget: int, tmp_path, steps: int = 5):
    """``steps`` steps ``run(ctx)`` under policy="auto" at ``budget`` on the SSD, a step that is not
    the profiled one an error: what each returned, and the summary of the last."""
    off = pyfastensor.offload(policy="auto", budget=budget, tier="ssd", spill_dir=str(tmp_path),
                              min_size=4 << 10, module=model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not the profiled one")
        got = [run(off) for _ in range(steps)]
    s = off.summary()
    off.close()
    return got, s


@INDUCTOR
def test_auto_plans_the_step_inductor_compiled_block_by_block(tmp_path):
    """policy="auto" over blocks compiled by inductor: the profiling step runs the compiled
    blocks (torch 2.10 and later run them under the recorder; older ones compile them once more
    there), so the plan is the one later steps follow; no step warns that it is not the profiled
    one, and the gradients are bit-identical to the same compiled blocks without offload."""
    torch._dynamo.reset()
    model, batch_of = inputs("blocks")
    plain = copy.deepcopy(model)
    for m in (model, plain):
        for block in m:
            block.compile()

    want = _grads_of(plain, plain, batch_of)(contextlib.nullcontext())
    run = _grads_of(model, model, batch_of)
    low, top = _auto_frontier(model, run, tmp_path)
    assert low < top, "the compiled blocks' saved tensors can be moved"
    # Near the top: the smallest feasible budget moves with the disk's measured speed between
    # runs (a moved tensor's bytes stay until its write lands), the top does not.
    budget = top - (top - low) // 8
    got, s = _auto_steps(model, run, budget, tmp_path)
    for g in got:
        assert all(torch.equal(a, b) for a, b in zip(g, want, strict=True))
    assert s.offloaded_tensors > 0 and s.resident_peak_bytes <= budget, str(s)


@INDUCTOR
@pytest.mark.skipif(_torch.VERSION < (2, 5), reason=f"torch {torch.__version__}'s inductor, under a memory budget of "
                    "0.5, writes C++ for this model that does not compile (a kernel declares weight_recps twice)")
def test_auto_over_a_model_compiled_under_torchs_memory_budget(tmp_path, monkeypatch):
    """The composition docs/offload.md shows: the whole model compiled by inductor under
    ``activation_memory_budget`` (its partitioner recomputes inside the graph), then ``auto``.
    A budget that holds what the graph saves keeps it all and installs no hooks; one below it is
    kept, with what is moved read back; the gradients are bit-identical to the same compiled
    model without offload in both."""
    import torch._functorch.config as fconfig

    torch._dynamo.reset()
    monkeypatch.setattr(fconfig, "activation_memory_budget", 0.5)
    model, batch_of = inputs("blocks")
    plain = copy.deepcopy(model)
    want = _grads_of(plain, torch.compile(plain), batch_of)(contextlib.nullcontext())
    run = _grads_of(model, torch.compile(model), batch_of)
    low, top = _auto_frontier(model, run, tmp_path)
    assert low < top, "what the step saves around and before the graph's end can be moved"
    for budget, moved in ((top, False), (top - (top - low) // 2, True)):
        got, s = _auto_steps(model, run, budget, tmp_path)
        for g in got:
            assert all(torch.equal(a, b) for a, b in zip(g, want, strict=True))
        assert (s.offloaded_tensors > 0) == moved and s.resident_peak_bytes <= budget, (budget, str(s))

"""Recording a trace on a real GPU: op times from CUDA events, and a trace the planner takes."""

from __future__ import annotations

import torch
from torch import nn

from pyfastensor import plan


def test_record_trace_on_cuda_times_ops_by_cuda_events():
    torch.manual_seed(0)
    dev = torch.device("cuda", torch.cuda.current_device())
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    # A batch whose activations dominate the step's memory: the trace holds the optimizer's step
    # too (Adam's foreach ops touch every parameter, gradient and moment at once, ~4 MB here),
    # so a third less than the peak is still room for the largest op, and the planner's job.
    batch = 2048
    x, y = torch.randn(batch, 256, device=dev), torch.randint(0, 10, (batch,), device=dev)
    t = plan.record_trace(model, (x, y), lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    assert t.meta["op_time"] == "cuda_events"
    assert t.meta["device"] == str(dev) and t.meta["device_name"] == torch.cuda.get_device_name(dev)
    assert all(o.time_ns >= 0 for o in t.ops) and t.total_ns > 0
    mm = [o.time_ns for o in t.ops if o.name in ("fwd.addmm", "fwd.mm")]
    assert mm and max(mm) < 50_000_000  # a GPU's matmul of this size: well under 50 ms
    peak = plan.simulate(t, plan.Hardware.g10_default(), "ideal").peak_device_bytes
    r = plan.simulate(t, plan.Hardware.g10_default().replace(device_bytes=peak * 2 // 3), "g10")
    assert r.feasible and r.peak_device_bytes <= peak * 2 // 3, (peak, r)

"""Recording a trace on a real GPU: op times from CUDA events, and a trace the planner takes."""

from __future__ import annotations

import torch
from torch import nn

from pyfastensor import plan


def test_record_trace_on_cuda_times_ops_by_cuda_events():
    torch.manual_seed(0)
    dev = torch.device("cuda", torch.cuda.current_device())
    # Narrow and deep, with a large batch: the activations saved for backward (8 layers of
    # 16 MB inputs and ReLU outputs) dominate the step's memory, while the largest single op
    # (a 16 MB ReLU backward: its input, gradient and output; or Adam's foreach step over every
    # parameter, gradient and moment, ~2 MB here) needs well under two thirds of the peak. So a
    # device of two thirds of the peak leaves the planner something to do, and room to do it.
    # (With one wide hidden layer, one op's 25 MB on a 30 MB peak left no such room.)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)],
                          nn.Linear(256, 10)).to(dev)
    batch = 16384
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

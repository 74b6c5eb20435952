"""G10's smart tensor migration over traces: ``pyfastensor.plan``.

Record what one training iteration does (:func:`record_trace`), then simulate it on a
memory system (:class:`Hardware`) under a policy (:func:`simulate`: ideal,
on_demand, flashneuron, g10) or get G10's migration plan (:func:`make_plan`) and a lower bound on any
policy's time (:func:`bound_ns`).
The analysis, planner and simulator are the Go core's (``offload/``);
importing this package imports no torch (only the recorder needs it).

Example::

    >>> from pyfastensor import plan
    >>> trace = plan.Trace.load("bert-b8.json")
    >>> hw = plan.Hardware.g10_default().replace(device_bytes=64 << 20)
    >>> plan.simulate(trace, hw, "g10").throughput  # doctest: +SKIP
"""

from typing import Any

from .hardware import Hardware
from .simulate import (
    Migration,
    MigrationPlan,
    SimulationResult,
    bound_ns,
    make_plan,
    policies,
    simulate,
)
from .trace import GLOBAL_KINDS, Trace, TraceOp, TraceTensor

__all__ = [
    "GLOBAL_KINDS",
    "Hardware",
    "Migration",
    "MigrationPlan",
    "SimulationResult",
    "Trace",
    "TraceOp",
    "TraceTensor",
    "bound_ns",
    "make_plan",
    "policies",
    "record_trace",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name == "record_trace":  # imports torch: on first use only
        from .record import record_trace

        return record_trace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

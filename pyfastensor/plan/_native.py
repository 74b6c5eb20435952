"""The G10 calls into the Go core (``gofastensor/plan.go`` over ``offload/``).

Traces and hardware cross as JSON strings and results come back as JSON;
Go keeps nothing between calls. Nothing here imports torch.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _lib

_defaults: dict[str, Any] | None = None


def defaults() -> dict[str, Any]:
    """Trace version, kinds, policies, tiers, Table 2 and G10 artifact hardware, as Go defines them (cached)."""
    global _defaults
    if _defaults is None:
        _defaults = _lib.call_json("pft_plan_defaults")
    return _defaults


def parse_trace(doc: str) -> dict[str, Any]:
    """Validate a trace's JSON text; return it normalized (every list present)."""
    return _lib.call_json("pft_plan_parse_trace", doc.encode())


def read_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the trace file at ``path``; return it normalized."""
    return _lib.call_json("pft_plan_read_trace", _lib.cstr(path))


def simulate(trace: str, hardware: str, policy: str) -> dict[str, Any]:
    """``offload.SimulatePolicy`` over JSON; return ``offload.Result`` as a dict."""
    return _lib.call_json("pft_plan_simulate", trace.encode(), hardware.encode(), policy.encode())


def make_plan(trace: str, hardware: str) -> dict[str, Any]:
    """``offload.MakePlan`` over JSON; return the plan (with ``table``) as a dict."""
    return _lib.call_json("pft_plan_make", trace.encode(), hardware.encode())


def bound(trace: str, hardware: str) -> int:
    """``offload.BoundNs`` over JSON: a lower bound on any policy's simulated time, in ns."""
    return int(_lib.call_json("pft_plan_bound", trace.encode(), hardware.encode())["bound_ns"])

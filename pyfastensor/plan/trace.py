"""G10 traces: one training iteration, op by op, with the bytes of every tensor it touches.

A trace is JSON, schema version 1 (``offload/trace.go`` holds the rules)::

    {"version": 1,
     "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}],
     "ops": [{"name": "layer1.fwd", "time_ns": 12000, "reads": [0, 3], "writes": [4]}],
     "meta": {"op_time": "cuda_events"}}

``meta`` is optional, free-form notes on how the trace was made. Ops are in execution order. Weights, optimizer state and inputs are alive
from the start of the iteration; any other tensor from the op that first
writes it to its last use. Validation is the Go parser's (``ParseTrace``),
reached through :mod:`._native`, so the rules are written down once.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from . import _native

#: Tensor kinds alive from the start of the iteration.
GLOBAL_KINDS = ("weight", "optimizer", "input")


@dataclass(frozen=True)
class TraceTensor:
    """One tensor of a trace: its id, size in bytes and kind (see :data:`Trace.kinds`)."""

    id: int
    bytes: int
    kind: str


@dataclass(frozen=True)
class TraceOp:
    """One op (kernel) of a trace: its name, time and the tensor ids it reads and writes."""

    name: str
    time_ns: int
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    """One training iteration: tensors and ops in execution order (schema version 1).

    Build one with :meth:`from_dict`, :meth:`load` or the recorder
    (:func:`pyfastensor.plan.record_trace`): each validates through the Go
    parser. Two traces are equal when their tensors and ops are.

    Example::

        >>> t = Trace.from_dict({"version": 1,
        ...     "tensors": [{"id": 0, "bytes": 4096, "kind": "weight"}],
        ...     "ops": [{"name": "fwd", "time_ns": 1000, "reads": [0], "writes": []}]})
        >>> t.total_ns
        1000
    """

    tensors: tuple[TraceTensor, ...]
    ops: tuple[TraceOp, ...]
    version: int = 1
    #: Free-form notes on how the trace was made (the recorder's ``op_time`` says how it timed
    #: the ops); not compared.
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @staticmethod
    def kinds() -> tuple[str, ...]:
        """The tensor kinds a trace may use, as the Go core lists them."""
        return tuple(_native.defaults()["kinds"])

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        """Validate and build a trace from its JSON form.

        Args:
            d: ``{"version": 1, "tensors": [...], "ops": [...]}``; unknown
                fields are ignored, missing ``reads``/``writes`` are empty.

        Returns:
            The trace.

        Raises:
            InvalidArgumentError: the trace breaks a rule of schema version 1;
                the message names the op or tensor at fault.
        """
        try:
            doc = json.dumps(d)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"trace is not JSON data: {e}") from e
        return cls._from_normal(_native.parse_trace(doc))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read and validate the trace file at ``path``: JSON, or gzip-compressed JSON (``.json.gz``).

        Raises:
            CorruptFileError: the file holds no valid trace; the message names
                the path and what is wrong.
            NotFoundError: there is no such file.
        """
        return cls._from_normal(_native.read_trace(path))

    @classmethod
    def _from_normal(cls, d: dict[str, Any]) -> Trace:
        return cls(
            version=d["version"], meta=d.get("meta") or {},
            tensors=tuple(TraceTensor(t["id"], t["bytes"], t["kind"]) for t in d["tensors"]),
            ops=tuple(TraceOp(o["name"], o["time_ns"], tuple(o["reads"]), tuple(o["writes"]))
                      for o in d["ops"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """The trace's JSON form (what :meth:`from_dict` takes); ``meta`` only when there is some."""
        d: dict[str, Any] = {
            "version": self.version,
            "tensors": [{"id": t.id, "bytes": t.bytes, "kind": t.kind} for t in self.tensors],
            "ops": [{"name": o.name, "time_ns": o.time_ns, "reads": list(o.reads), "writes": list(o.writes)}
                    for o in self.ops],
        }
        if self.meta:
            d["meta"] = dict(self.meta)
        return d

    def to_json(self) -> str:
        """The trace as JSON text (computed once)."""
        return self._text

    @cached_property
    def _text(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trace to ``path`` as JSON, replacing the file whole (a temporary file renamed)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def scale_time(self, factor: float) -> Trace:
        """A copy with every op time multiplied by ``factor`` (rounded), e.g. ``1 / 20`` to stand
        CPU-measured times in for a device that computes 20 times faster. ``meta["time_scale"]``
        says by how much the times were scaled, all scalings together.

        Raises:
            InvalidArgumentError: ``factor`` is not positive.
        """
        if not factor > 0:
            raise InvalidArgumentError(f"time scale factor must be positive, got {factor}")
        meta = {**self.meta, "time_scale": self.meta.get("time_scale", 1) * factor}
        return Trace(version=self.version, tensors=self.tensors, meta=meta,
                     ops=tuple(TraceOp(o.name, round(o.time_ns * factor), o.reads, o.writes) for o in self.ops))

    @property
    def total_ns(self) -> int:
        """The sum of the op times: the iteration with no stalls."""
        return sum(o.time_ns for o in self.ops)

    @property
    def total_bytes(self) -> int:
        """The bytes of every tensor of the trace together."""
        return sum(t.bytes for t in self.tensors)

    def __str__(self) -> str:
        kinds: dict[str, int] = {}
        for t in self.tensors:
            kinds[t.kind] = kinds.get(t.kind, 0) + t.bytes
        per = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        return (f"trace v{self.version}: {len(self.ops)} ops, {self.total_ns} ns; "
                f"{len(self.tensors)} tensors, {self.total_bytes} bytes ({per})")

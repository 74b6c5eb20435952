"""The ``policy=`` modes of :class:`~pyfastensor.offload.Offload`, one object each.

A policy decides, per saved tensor (by pack index), whether it is stored
and with which codec, whether it goes to the host tier, and when its
prefetch starts. The object is chosen once, when the offload object is
made (:func:`for_mode`); the offload object asks it, never the mode's name.

- ``"all"`` (:class:`OffloadAll`): every eligible tensor, with the codec
  ``compression=`` picks; prefetched along the profiling step's unpack
  order.
- ``"none"`` (:class:`OffloadNone`): nothing is stored; no store is opened.
- ``"scheduled"`` (:class:`Scheduled`): the profiling step offloads as
  ``"all"`` does and records; FlashNeuron's scheduler then picks each
  tensor's codec, or keeps it resident.
- ``"planned"`` (:class:`Planned`): the profiling step offloads as
  ``"all"`` does and records; G10's plan then places each tensor (stay,
  SSD, host) and sets the point at which its prefetch starts.
- ``"auto"`` (:class:`~._auto.Auto`, a module of its own): keep, move or
  recompute each saved tensor within a budget.

:func:`~._options.policy_for` makes the object of a ``policy=`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ..info import available_memory
from . import _planned
from ._order import PlannedPrefetcher, Prefetcher
from ._profile import Recorder, schedule
from ._saved import Entry


class Policy:
    """What one ``policy=`` mode decides; the defaults are ``"all"``'s.

    Attributes:
        uses_store: whether the mode stores anything (a spill store is
            opened for it).
        result: the plan made after the profiling step, as
            :meth:`Offload.plan_details <pyfastensor.offload.Offload.plan_details>`
            returns it; None before (and for modes without a plan).
        stashes: whether CUDA tensors kept in pinned buffers (``tier="host"``)
            also go through the forward stash (:mod:`._stash`); the modes
            that place tensors by plan do not.
    """

    uses_store = True
    stashes = False
    result: dict[str, Any] | None = None

    def __init__(self, compression: frozenset[str] = frozenset()) -> None:
        self.compression = compression  # the codecs compression= allows

    def begin_step(self) -> None:
        """A step begins (the context is entered), after the last one's plan was learnt."""

    def profiles(self) -> bool:
        """Whether the step about to start is the profiling step (recorded to make the plan)."""
        return False

    def op_recorder(self, registered: set[int]) -> Any:
        """The op recorder (:class:`~._graph.GraphRecorder`) to run through the step about to
        start, or None: only ``"auto"``'s profiling step has one."""
        return None

    def recipe(self, entry: Entry, t: torch.Tensor) -> Any:
        """The recipe (:class:`~._graph.Recipe`) to make ``entry`` again in backward instead of
        keeping or storing it, or None."""
        return None

    def source_entry(self, index: int) -> int:
        """How many reads of entry ``index`` the recipes bound later in the step make (0: it is
        no recipe's source)."""
        return 0

    def source_kept(self, seq: int) -> int:
        """How many reads of the small saved tensor of pack call ``seq`` the recipes make."""
        return 0

    def stepped(self, summary: Any) -> None:
        """A step ended without an error; ``summary`` is its :class:`~.summary.OffloadSummary`."""

    def needs_hooks(self) -> bool:
        """Whether the step about to start needs the saved-tensor hooks at all (``"auto"``'s plan
        that keeps every saved tensor does not: the step then runs as without offload)."""
        return True

    def predicted(self) -> tuple[float, int]:
        """The plan's predicted step (seconds) and resident peak (bytes); zeros without one."""
        return 0.0, 0

    def check(self) -> None:
        """Raise what keeps the mode from running another step (an infeasible plan)."""

    def learn(self, rec: Recorder, *, tier: str, device: torch.device | None) -> None:
        """After the profiling step: make the plan from what ``rec`` recorded.

        Args:
            rec: the profiling step's record.
            tier: the store's tier in the profiling step.
            device: the stored saved tensors' device (None: none stored).
        """

    def codec(self, entry: Entry, t: torch.Tensor) -> str | None:
        """The codec to store ``entry`` (saved tensor ``t``'s storage) with, or None to keep it resident."""
        return self.compressed(entry, t)

    def compressed(self, entry: Entry, t: torch.Tensor) -> str:
        """The codec ``compression=`` picks for ``entry``: fp16 for float32, sparse for ReLU outputs."""
        whole = entry.nbytes % t.element_size() == 0 and t.dtype.is_floating_point
        fp16 = "fp16" in self.compression and whole and t.dtype == torch.float32
        sparse = "sparse" in self.compression and whole and entry.relu
        if fp16 and sparse:
            return "fp16+sparse"
        return "fp16" if fp16 else "sparse" if sparse else "raw"

    def to_host(self, index: int) -> bool:
        """Whether pack index ``index`` goes to the host tier (a staged copy)."""
        return False

    def prefetchers(self, order: list[int] | None, window: int,
                    resident: Callable[[], int]) -> tuple[Prefetcher | None, PlannedPrefetcher | None]:
        """A step's prefetchers: one along the profiling step's unpack order, one at the plan's points.

        Args:
            order: the profiling step's unpack order (None before it ended).
            window: the budget in bytes, 0 without one.
            resident: the bytes of saved tensors in memory now.
        """
        return (Prefetcher(order, window, resident) if order is not None else None), None

    def at_pack(self, index: int) -> int | None:
        """The plan's point reached when pack index ``index`` is packed, if any."""
        return None

    def at_unpack(self, index: int) -> int | None:
        """The plan's point reached when pack index ``index`` is first unpacked, if any."""
        return None

    def at_backward(self) -> int | None:
        """The plan's point reached when forward is done (the context exits), if any."""
        return None


class OffloadAll(Policy):
    """``policy="all"``: every eligible tensor is stored (under ``tier="host"``, CUDA tensors'
    last ones also kept in the forward stash)."""

    stashes = True


class OffloadNone(Policy):
    """``policy="none"``: nothing is stored, only measured; no store is opened."""

    uses_store = False

    def codec(self, entry: Entry, t: torch.Tensor) -> str | None:
        return None


class Scheduled(Policy):
    """``policy="scheduled"``: FlashNeuron's scheduler decides after the profiling step.

    Args:
        compression: the codecs the scheduler may choose.
        budget: bytes of saved tensors the scheduler keeps resident at most.
        verbose: print the plan when it is made.
    """

    def __init__(self, compression: frozenset[str], budget: int, verbose: bool) -> None:
        super().__init__(compression)
        self.budget, self.verbose = budget, verbose
        self.decisions: dict[int, str | None] | None = None  # pack index -> codec, None: resident

    def profiles(self) -> bool:
        return self.decisions is None

    def learn(self, rec: Recorder, *, tier: str, device: torch.device | None) -> None:
        prof = rec.profile(self.budget, tier)
        result = schedule(prof)
        result["profile"] = prof
        self.result = result
        self.decisions = {d["index"]: (d["codec"] if d["offload"] else None) for d in result["decisions"]}
        if self.verbose:
            print(result["text"], end="")

    def codec(self, entry: Entry, t: torch.Tensor) -> str | None:
        allowed = self.compressed(entry, t)
        if self.decisions is None:
            return allowed
        planned = self.decisions.get(entry.index, "raw")  # indices past the profiled graph: offload as is
        if planned is None:
            return None
        # The plan is by pack index; a later step may save another tensor there (an int64 where
        # the profiled step had a float32): only the codecs this tensor allows apply.
        return "+".join(c for c in planned.split("+") if c in allowed.split("+")) or "raw"


class Planned(Policy):
    """``policy="planned"``: G10's migration plan, made after the profiling step.

    Args:
        budget: the device memory G10 plans for (bytes of saved tensors).
        host_bytes: the host tier's memory; None: the available host memory
            for accelerator tensors with ``tier="auto"``, else 0.
        tier: the offload object's ``tier=`` (``"ssd"`` or ``"auto"``).
        verbose: print the plan when it is made.
    """

    def __init__(self, budget: int, host_bytes: int | None, tier: str, verbose: bool) -> None:
        super().__init__()  # no compression: tensors migrate as they are
        self.budget, self.host_bytes, self.tier, self.verbose = budget, host_bytes, tier, verbose
        self.placement: _planned.Placement | None = None  # the plan by pack index
        # An infeasible budget: every later entry raises it anew. A message, not the exception: one
        # raised again would keep every frame it passed through (a step's autograd graph among
        # them, whose C++ nodes hold the offload's hooks: a cycle the garbage collector cannot see).
        self.error: str | None = None

    def profiles(self) -> bool:
        return self.placement is None

    def check(self) -> None:
        if self.error is not None:
            raise InvalidArgumentError(self.error)

    def learn(self, rec: Recorder, *, tier: str, device: torch.device | None) -> None:
        device = device or torch.device("cpu")
        host = self.host_bytes
        if host is None:
            host = available_memory() if self.tier == "auto" and device.type != "cpu" else 0
        prof = rec.profile(self.budget, "ssd")
        try:
            result = _planned.make(prof, rec.unpacks, self.budget, host, device)
        except InvalidArgumentError as e:
            self.error = str(e)
            raise
        result["profile"] = prof
        self.result = result
        self.placement = result["placement"]
        if self.verbose:
            print(result["text"], end="")

    def codec(self, entry: Entry, t: torch.Tensor) -> str | None:
        if self.placement is None:
            return self.compressed(entry, t)
        # Indices past the profiled graph: to the store as they are.
        return None if self.placement.tier.get(entry.index) == "stay" else "raw"

    def to_host(self, index: int) -> bool:
        return self.placement is not None and self.placement.tier.get(index) == "host"

    def prefetchers(self, order: list[int] | None, window: int,
                    resident: Callable[[], int]) -> tuple[Prefetcher | None, PlannedPrefetcher | None]:
        if self.placement is None:
            return None, None
        due = sorted((at, i) for i, at in self.placement.prefetch.items())
        return None, PlannedPrefetcher(due, self.budget, resident)

    def at_pack(self, index: int) -> int | None:
        return None if self.placement is None else self.placement.fwd_pos.get(index)

    def at_unpack(self, index: int) -> int | None:
        return None if self.placement is None else self.placement.bwd_pos.get(index)

    def at_backward(self) -> int | None:
        return None if self.placement is None else self.placement.start_pos

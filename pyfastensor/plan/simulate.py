"""Simulating a trace under a policy, and G10's migration plan (``offload/simulate.go``, ``plan.go``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _native
from .hardware import Hardware
from .trace import Trace


def policies() -> tuple[str, ...]:
    """The policies :func:`simulate` knows, as the Go core lists them.

    ``ideal`` (unlimited device memory), ``on_demand`` (evict the least
    recently used tensor, read back when needed, synchronously),
    ``flashneuron`` (FlashNeuron's linear selection over the activations) and
    ``g10`` (:func:`make_plan`'s plan).
    """
    return tuple(_native.defaults()["policies"])


@dataclass(frozen=True)
class SimulationResult:
    """What one simulated iteration cost under a policy (``offload.Result``).

    Attributes:
        policy: the policy simulated.
        time_ns: when the last op ends.
        ideal_ns: the sum of the op times.
        stall_ns: ``time_ns - ideal_ns``, the time ops waited for memory or data.
        peak_device_bytes: the most device memory in use at once (never more
            than the capacity).
        feasible: whether the trace could run; when not, ``error`` says why
            (naming the op and the capacity) and the figures stop there.
        ssd_write_bytes, ssd_read_bytes, host_write_bytes, host_read_bytes:
            the traffic of evictions and fetches per tier.
        op_stall_ns: how long each op waited before it could start.
        op_slowdown: each op's (time + stall) / time.
    """

    policy: str
    time_ns: int
    ideal_ns: int
    stall_ns: int
    peak_device_bytes: int
    feasible: bool
    ssd_write_bytes: int
    ssd_read_bytes: int
    host_write_bytes: int
    host_read_bytes: int
    op_stall_ns: tuple[int, ...] = field(repr=False)
    op_slowdown: tuple[float, ...] = field(repr=False)
    error: str = ""

    @classmethod
    def _from_go(cls, d: dict[str, Any]) -> SimulationResult:
        return cls(
            policy=d["policy"], time_ns=d["time_ns"], ideal_ns=d["ideal_ns"], stall_ns=d["stall_ns"],
            peak_device_bytes=d["peak_device_bytes"], feasible=d["feasible"],
            ssd_write_bytes=d["ssd_write_bytes"], ssd_read_bytes=d["ssd_read_bytes"],
            host_write_bytes=d["host_write_bytes"], host_read_bytes=d["host_read_bytes"],
            op_stall_ns=tuple(d.get("op_stall_ns") or ()), op_slowdown=tuple(d.get("op_slowdown") or ()),
            error=d.get("error", ""),
        )

    @property
    def throughput(self) -> float:
        """Throughput normalized to ideal: ``ideal_ns / time_ns`` (0 when infeasible)."""
        if not self.feasible:
            return 0.0
        return self.ideal_ns / self.time_ns if self.time_ns else 1.0


def simulate(trace: Trace, hardware: Hardware, policy: str = "g10") -> SimulationResult:
    """Replay ``trace`` on ``hardware`` under ``policy`` (the Go simulator).

    Device memory never exceeds ``hardware.device_bytes``: a policy's
    planned transfers wait for room, and an op whose tensors do not fit evicts
    on demand. Each link direction serves one transfer at a time at its
    full bandwidth: a read link the one whose tensor is needed soonest, a
    write link the first issued (those the running op waits for first).

    Args:
        trace: the iteration to replay.
        hardware: the memory system.
        policy: one of :func:`policies` (default ``"g10"``).

    Returns:
        The result; a trace the policy cannot fit gives ``feasible=False``
        with the reason in ``error`` rather than an exception.

    Raises:
        InvalidArgumentError: an unknown policy, invalid hardware or trace.

    Example::

        >>> r = simulate(trace, Hardware.g10_default(), "ideal")
        >>> r.time_ns == trace.total_ns
        True
    """
    return SimulationResult._from_go(_native.simulate(trace.to_json(), hardware.to_json(), policy))


def bound_ns(trace: Trace, hardware: Hardware) -> int:
    """A lower bound on the simulated time of ``trace`` on ``hardware`` under any policy (``offload.BoundNs``).

    For ops ``a < b``: at the start of op ``a`` all but ``device_bytes`` of
    the bytes alive then that ops ``a..b`` use are off the device and must be
    read back before op ``b`` starts; at the start of op ``b`` all but
    ``device_bytes`` of the bytes alive then that ops ``a..b`` used are off
    the device, written out since op ``a`` started. So that stretch takes at
    least its op times, those reads over the read bandwidth and those writes
    over the write bandwidth (the SSD's and the host link's together, host
    memory permitting; latencies left out), and those of them beyond
    ``host_bytes`` over the SSD's bandwidth alone (host memory holds no
    more). The bound is the best sum over
    a partition of the iteration into such stretches. ``ideal_ns / bound``
    is the most throughput any plan can reach: a policy short of it leaves
    bandwidth unused; one at it is bound by the links.

    Args:
        trace: the iteration.
        hardware: the memory system.

    Returns:
        The bound in ns: at least ``trace.total_ns``, equal to it with memory
        to spare; 0 when one op alone needs more than ``device_bytes``.

    Raises:
        InvalidArgumentError: invalid hardware or trace.

    Example::

        >>> bound_ns(trace, Hardware.g10_default()) == trace.total_ns  # fits in 40 GiB
        True
    """
    return _native.bound(trace.to_json(), hardware.to_json())


@dataclass(frozen=True)
class Migration:
    """One planned inactive period off the device (``offload.Migration``).

    Pre-evict ``tensor`` to ``tier`` (``"ssd"`` or ``"host"``) after op
    ``evict_after``; prefetch it when op ``prefetch_at`` starts, for op
    ``need``. A wrapping period (``wraps``: a global tensor) is evicted after
    its last use and prefetched for its first use of the next iteration;
    ``prefetch_at <= need`` then means at the start of the iteration. The
    three ops are -1 for a global tensor no op uses, which stays in ``tier``.
    ``sync``: no window hides the transfers; op ``need`` waits for them.
    """

    tensor: int
    bytes: int
    tier: str
    evict_after: int
    prefetch_at: int
    need: int
    wraps: bool = False
    sync: bool = False


@dataclass(frozen=True)
class MigrationPlan:
    """G10's migration plan for one iteration (``offload.MigrationPlan``).

    Attributes:
        migrations: the planned migrations, by eviction op.
        capacity: the device bytes the plan runs within (at most the hardware's: a
            plan made for less memory may win, and takes the same time on more).
        demand_bytes: the peak with nothing migrated.
        peak_bytes: the planned peak, at most ``capacity``.
        host_capacity: the host memory bytes the plan runs within (at most the
            hardware's; ``None``: the hardware's).

    ``str(plan)`` (or :meth:`table`) prints it as a table, as the Go core
    formats it.
    """

    migrations: tuple[Migration, ...]
    capacity: int
    demand_bytes: int
    peak_bytes: int
    host_capacity: int | None = None
    _table: str = field(default="", repr=False, compare=False)

    def table(self) -> str:
        """The plan as a table: a summary line, then one row per migration."""
        return self._table

    def __str__(self) -> str:
        return self._table


def make_plan(trace: Trace, hardware: Hardware) -> MigrationPlan:
    """Plan G10's migrations for ``trace`` on ``hardware`` (``offload.MakePlan``).

    The fastest, as :func:`simulate` replays them on ``hardware``, of the
    candidate plans: G10's planner (smart eviction, the G10 paper's Algorithm 1:
    inactive periods by benefit over cost; then eager prefetch) with the SSD
    first as the paper does, or with each migration on whichever link (SSD or,
    while host memory holds the tensor, the host link) its planned traffic
    leaves the wider window; with the paper's windows (uncontended transfers)
    or the windows the planned traffic leaves; each made for every point of a
    fixed grid of hardware, the same for any ``hardware``: device memory in
    steps of 2^(1/8) and host memory in steps of 2^(1/4) from
    :meth:`Hardware.g10_artifact`'s, at or below ``hardware``'s, and the links in
    the artifact's proportions in steps of 2^(1/2), up to twice ``hardware``'s.
    A plan runs within the memory it was made for (``capacity``,
    ``host_capacity``). So more device or host memory or faster links never
    give a slower plan: they only add candidates (none in 1,000 random pairs
    of small traces nor in 125 on G10's traces; the replay of one plan on
    faster links was slower in 8 of 40,000). Most of the grid is never
    planned: memory whose :func:`bound_ns` is no better than the best plan
    so far is skipped. With memory to spare the plan is empty; otherwise the
    planned peak never exceeds ``capacity``, at most ``hardware.device_bytes``.
    Planning G10's traces of 900 to 2,300 ops takes up to about 6 s and
    260 MiB on two cores.

    Raises:
        InvalidArgumentError: one op alone needs more than the device holds
            (the message names the op and the capacity), or the trace or
            hardware is invalid.

    Example::

        >>> plan = make_plan(trace, Hardware.g10_default().replace(device_bytes=1 << 20))
        >>> print(plan)  # doctest: +SKIP
    """
    d = _native.make_plan(trace.to_json(), hardware.to_json())
    return MigrationPlan(
        migrations=tuple(Migration(**m) for m in d["migrations"]),
        capacity=d["capacity"], demand_bytes=d["demand_bytes"], peak_bytes=d["peak_bytes"],
        host_capacity=d.get("host_capacity"), _table=d["table"],
    )

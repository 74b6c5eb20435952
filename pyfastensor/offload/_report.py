"""An offload step's summary, from its counts and its store's account."""

from __future__ import annotations

from typing import Any

from .._device import PinnedPool
from ._pool import BufferPool
from ._saved import Meter
from ._step import Step
from ._store import SpillStore
from .summary import OffloadSummary


def summarize(*, step_number: int, step: Step, full_disk_events: int, store: SpillStore | None, account: int,
              base: dict[str, Any], dictionary: str, meter: Meter, pool: BufferPool,
              pinned: PinnedPool | None = None, pinned_base: int = 0) -> OffloadSummary:
    """The summary of a step: its counts, and its account's transfers since ``base``.

    Args:
        step_number: the step's number.
        step: the step's state.
        full_disk_events: full disks the step met.
        store: the store the step used (None: none).
        account: the offload object's account in ``store``.
        base: the account's totals when the step began.
        dictionary: the ``dictionary=`` option.
        meter: the bytes of saved tensors in memory (its peak is the step's).
        pool: the read-back buffers.
        pinned: the staging's pinned pool (accelerator tensors), if any.
        pinned_base: its allocations and overflows when the step began.
    """
    st = since(store.stats(account), base) if store is not None else {}
    desc = store.description if store is not None else {}
    tier = desc.get("tier", "")
    written = int(st.get("bytes_written", 0))
    offloaded = {tier: written} if written else {}
    if step.staged_bytes:
        offloaded["host"] = offloaded.get("host", 0) + step.staged_bytes
    return OffloadSummary(
        step=step_number,
        tier=tier,
        engines=dict(st.get("engine_bytes") or {}),
        dictionary=dictionary,
        saved_tensors=step.counts["saved"],
        offloaded_tensors=step.counts["offloaded"],
        resident_tensors=step.counts["resident"],
        skipped_tensors=step.counts["skipped"],
        deduplicated=step.counts["dedup"],
        recast_tensors=step.counts["recast"],
        recast_bytes=step.recast_bytes,
        recomputed_tensors=step.counts["recomputed"],
        recompute_bytes=step.recompute_bytes,
        recompute_seconds=step.recompute_seconds,
        staged_tensors=step.counts["staged"],
        bytes_offloaded=offloaded,
        raw_bytes_offloaded=step.raw_bytes,
        bytes_read=int(st.get("bytes_read", 0)),
        resident_peak_bytes=meter.peak,
        read_buffer_bytes=pool.reserved,
        pinned_bytes=pinned.reserved if pinned is not None else 0,
        pinned_allocations=pinned.allocations + pinned.overflows - pinned_base if pinned is not None else 0,
        stall_seconds=st.get("stall_ns", 0) / 1e9,
        pack_seconds=step.pack_seconds,
        unpack_seconds=step.unpack_seconds,
        compression={c: raw / max(stored, 1) for c, (raw, stored) in step.codec_bytes.items()},
        prefetch_hits=int(st.get("prefetch_hits", 0)),
        stash_hits=step.stash_hits,
        stash_bytes=step.stash_bytes,
        full_disk_events=full_disk_events,
        fallback=desc.get("fallback", ""),
    )


def since(now: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The store's counters since ``base`` (the totals when the step began)."""
    out: dict[str, Any] = {}
    for k, v in now.items():
        b = base.get(k)
        if isinstance(v, dict):
            out[k] = {e: n - (b or {}).get(e, 0) for e, n in v.items() if n != (b or {}).get(e, 0)}
        elif isinstance(v, int | float) and isinstance(b, int | float):
            out[k] = v - b
        else:
            out[k] = v
    return out

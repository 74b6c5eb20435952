"""What one step under :func:`pyfastensor.offload` did."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OffloadSummary:
    """Totals of one step (one entry of an offload context).

    The transfers counted are this offload object's own, also when other
    offload objects of the process share its store (the store keeps an
    account per object); the spill file's size is the store's.

    Attributes:
        step: the step number (0 is the profiling step).
        tier: the tier that served the step (``"ssd"`` or ``"host"``).
        engines: bytes written per I/O engine (``"memory"`` for the host tier).
        dictionary: the dictionary mode asked for (``"wr"``, ``"w"``, ``"r"``).
        saved_tensors: tensors autograd saved while the context was active.
        offloaded_tensors: storages written to the store.
        resident_tensors: storages of at least ``min_size`` kept in memory.
        staged_tensors: storages copied to the host tier of
            ``policy="planned"`` (pinned host buffers, not the store).
            (Under ``tier="host"``, accelerator tensors are kept in pinned
            host buffers too, and counted as offloaded.)
        skipped_tensors: parameters, buffers, small and unsupported tensors,
            left to autograd untouched.
        deduplicated: saves that reused the storage of an earlier save.
        recast_tensors: saved casts of parameters (``torch.autocast``'s
            copies of the weights) not stored but cast again in backward
            (``recast=True``).
        recast_bytes: their bytes: neither copied out nor back.
        recomputed_tensors: storages ``policy="auto"`` kept as their recipe and made again in
            backward (neither kept nor stored).
        recompute_bytes: their bytes.
        recompute_seconds: the time backward spent making them again.
        step_seconds: the step's wall time, from entering the context to leaving it.
        predicted_step_seconds: ``policy="auto"``: the plan's predicted step time (0 before the plan).
        predicted_peak_bytes: ``policy="auto"``: the plan's predicted resident peak.
        bytes_offloaded: bytes written per tier (after compression); under
            ``"host"`` also the bytes kept in pinned host buffers.
        raw_bytes_offloaded: the same tensors' bytes before compression.
        bytes_read: bytes read back (by get and prefetch).
        resident_peak_bytes: peak bytes of saved tensors (of at least
            ``min_size``) held in the tensors' device memory: resident
            ones, prefetched and restored copies, and for CPU tensors the
            payloads waiting for their write (a CUDA tensor's pinned host
            copies are host memory: not counted).
        read_buffer_bytes: host memory the offload object keeps for
            reading tensors back, reused from step to step (not counted in
            the resident peak: between steps nothing is in it).
        pinned_bytes: pinned host memory the offload object's staging holds
            (accelerator tensors: the host tier's stored copies, writes in
            flight, read-backs), kept from step to step.
        pinned_allocations: pinned buffers allocated in this step (0 once
            the pool has grown to what a step needs).
        stall_seconds: time unpack waited for the store.
        pack_seconds: time spent in the pack hook (codecs included).
        unpack_seconds: time spent in the unpack hook (stalls included).
        compression: ratio of raw to stored bytes, per codec used.
        prefetch_hits: unpacks served by a prefetch.
        stash_hits: unpacks served from the forward stash (``tier="host"``, CUDA tensors: the
            GPU source kept since pack, no host-to-device copy).
        stash_bytes: the bytes of those unpacks (not copied back to the device).
        full_disk_events: writes that failed because the spill filesystem
            was full (their tensors stayed in memory).
        fallback: why an engine other than the one asked for serves the
            spill file, or "".
    """

    step: int = 0
    tier: str = ""
    engines: dict[str, int] = field(default_factory=dict)
    dictionary: str = "wr"
    saved_tensors: int = 0
    offloaded_tensors: int = 0
    resident_tensors: int = 0
    staged_tensors: int = 0
    skipped_tensors: int = 0
    deduplicated: int = 0
    recast_tensors: int = 0
    recast_bytes: int = 0
    recomputed_tensors: int = 0
    recompute_bytes: int = 0
    recompute_seconds: float = 0.0
    step_seconds: float = 0.0
    predicted_step_seconds: float = 0.0
    predicted_peak_bytes: int = 0
    bytes_offloaded: dict[str, int] = field(default_factory=dict)
    raw_bytes_offloaded: int = 0
    bytes_read: int = 0
    resident_peak_bytes: int = 0
    read_buffer_bytes: int = 0
    pinned_bytes: int = 0
    pinned_allocations: int = 0
    stall_seconds: float = 0.0
    pack_seconds: float = 0.0
    unpack_seconds: float = 0.0
    compression: dict[str, float] = field(default_factory=dict)
    prefetch_hits: int = 0
    stash_hits: int = 0
    stash_bytes: int = 0
    full_disk_events: int = 0
    fallback: str = ""

    def __str__(self) -> str:
        mib = 1 << 20
        written = ", ".join(f"{t} {b / mib:.1f} MiB" for t, b in self.bytes_offloaded.items()) or "nothing"
        lines = [
            f"offload step {self.step} ({self.tier}, engines {self.engines or '-'}, dictionary {self.dictionary})",
            f"  saved {self.saved_tensors}: offloaded {self.offloaded_tensors}, "
            + (f"staged {self.staged_tensors}, " if self.staged_tensors else "")
            + f"resident {self.resident_tensors}, "
            f"skipped {self.skipped_tensors}, deduplicated {self.deduplicated}"
            + (f", recast {self.recast_tensors} ({self.recast_bytes / mib:.1f} MiB)" if self.recast_tensors else "")
            + (f", recomputed {self.recomputed_tensors} ({self.recompute_bytes / mib:.1f} MiB, "
               f"{self.recompute_seconds * 1e3:.1f} ms)" if self.recomputed_tensors else ""),
            f"  written {written} (raw {self.raw_bytes_offloaded / mib:.1f} MiB), read {self.bytes_read / mib:.1f} MiB",
            f"  resident peak {self.resident_peak_bytes / mib:.1f} MiB (read buffers kept: "
            f"{self.read_buffer_bytes / mib:.1f} MiB, pinned {self.pinned_bytes / mib:.1f} MiB), stall {self.stall_seconds * 1e3:.1f} ms, "
            f"pack {self.pack_seconds * 1e3:.1f} ms, unpack {self.unpack_seconds * 1e3:.1f} ms, "
            f"prefetch hits {self.prefetch_hits}, stash hits {self.stash_hits} "
            f"({self.stash_bytes / mib:.1f} MiB)",
        ]
        if self.predicted_step_seconds:
            lines.append(f"  step {self.step_seconds * 1e3:.1f} ms (predicted {self.predicted_step_seconds * 1e3:.1f} ms), "
                         f"resident peak {self.resident_peak_bytes / mib:.1f} MiB (predicted "
                         f"{self.predicted_peak_bytes / mib:.1f} MiB)")
        if self.compression:
            lines.append("  compression " + ", ".join(f"{c} {r:.2f}x" for c, r in self.compression.items()))
        if self.full_disk_events:
            lines.append(f"  full disk: {self.full_disk_events} tensors kept in memory")
        if self.fallback:
            lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)

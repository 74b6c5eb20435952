"""The profiling step's record, and the scheduler's plan made from it.

During the first step under ``policy="scheduled"`` everything eligible is
offloaded (as FlashNeuron's profiling iteration does) while this records,
for every stored tensor: its size, write and read times (measured by the
store, scaled to the uncompressed size when the profiling step wrote it
compressed), its compression ratio under each codec (``fp16`` for float32,
``sparse`` and ``fp16+sparse`` for ReLU outputs, whether allowed or not:
``measured_ratios``), whether it is a ReLU output, the forward compute
time since the previous save, the backward compute time before its
first unpack since the previous unpack (``bwd_gap_ns``), and the encode
plus decode time of the codec it was stored with (``codec_ns``). The Go
scheduler (``offload.Schedule``) turns that into a plan, choosing among the
codecs the user allowed (``ratios``), and compressing only where a codec
costs less than the write time it saves.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from .. import _lib, _torch
from . import codecs


class Recorder:
    """Measures one profiling step."""

    def __init__(self, compression: frozenset[str]) -> None:
        self.compression = compression
        self.tensors: dict[int, dict[str, Any]] = {}
        self.slots: dict[int, int] = {}  # slot -> pack index
        self.start = time.perf_counter()
        self.last_pack_end = self.start
        self.forward_pack_time = 0.0
        self.first_unpack: float | None = None
        self.last_unpack_end: float | None = None
        self.unpack_time = 0.0
        self.end: float | None = None
        # Every unpack in order: (pack index, node number, compute since the
        # previous unpack ended in ns), consecutive unpacks by one backward
        # node sharing a number (policy="planned" models each node as one op).
        self.unpacks: list[tuple[int, int, int]] = []
        self._node: Any = None  # the last node seen (kept so its id is not reused)

    def packed(self, index: int, slot: int, t: torch.Tensor, nbytes: int, relu: bool,
               started: float) -> None:
        """Record a stored tensor; ``started`` is when its pack hook began."""
        measured: dict[str, float] = {}
        whole = t.dtype.is_floating_point and nbytes % t.element_size() == 0
        if whole:
            flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                t.untyped_storage(), 0, (nbytes // t.element_size(),), (1,))
            fp16 = t.dtype == torch.float32
            if fp16:
                measured["fp16"] = 2.0  # float32 to float16: exactly half the bytes
            if relu:
                measured["sparse"] = nbytes / codecs.sparse_size(flat)
                if fp16:
                    measured["fp16+sparse"] = nbytes / codecs.sparse_size(flat.to(torch.float16))
        allowed = {c: r for c, r in measured.items() if set(c.split("+")) <= self.compression}
        self.tensors[index] = {
            "index": index, "size": nbytes, "relu": relu, "ratios": allowed, "measured_ratios": measured,
            "gap_ns": int(max(started - self.last_pack_end, 0) * 1e9), "bwd_gap_ns": -1, "codec_ns": {},
            "write_ns": 0, "read_ns": 0,
        }
        self.slots[slot] = index

    def coded(self, index: int, codec: str, seconds: float) -> None:
        """Add encode or decode time of ``codec`` for pack ``index``."""
        rec = self.tensors.get(index)
        if rec is not None:
            rec["codec_ns"][codec] = rec["codec_ns"].get(codec, 0) + int(seconds * 1e9)

    def pack_done(self, seconds: float) -> None:
        self.last_pack_end = time.perf_counter()
        if self.first_unpack is None:
            self.forward_pack_time += seconds

    def unpacking(self, index: int) -> None:
        """An unpack of pack ``index`` begins: the backward compute since the
        previous unpack ended is that tensor's backward gap (its first unpack)."""
        now = time.perf_counter()
        if self.first_unpack is None:
            self.first_unpack = now
        rec = self.tensors.get(index)
        gap = int(max(now - (self.last_unpack_end or now), 0) * 1e9)
        if rec is not None and rec["bwd_gap_ns"] < 0:
            rec["bwd_gap_ns"] = gap
        if rec is not None:
            node = _torch.current_autograd_node()
            group = self.unpacks[-1][1] if self.unpacks else -1
            if node is None or node is not self._node:
                group += 1
            self._node = node
            self.unpacks.append((index, group, gap))

    def unpack_done(self, seconds: float) -> None:
        self.unpack_time += seconds
        self.last_unpack_end = time.perf_counter()

    def measured(self, slot: int, info: dict[str, Any]) -> None:
        """Store-measured times of a slot (from ``slot_info``)."""
        rec = self.tensors.get(self.slots.get(slot, -1))
        if rec is not None:
            # The scheduler takes uncompressed times: scale a compressed slot's.
            scale = rec["size"] / max(int(info.get("size", 0)), 1) if info.get("size") else 1.0
            rec["write_ns"] = max(rec["write_ns"], int(info.get("write_ns", 0) * scale))
            rec["read_ns"] = max(rec["read_ns"], int(info.get("read_ns", 0) * scale))

    def profile(self, budget: int, tier: str = "ssd") -> dict[str, Any]:
        """The profile as the scheduler takes it (``offload.Profile``)."""
        end = self.end or time.perf_counter()
        fwd_end = self.first_unpack or end
        recs = list(self.tensors.values())
        # A slot freed before its write was observed has no time: estimate
        # it from the bandwidth of those that do.
        timed = [r for r in recs if r["write_ns"] > 0]
        bw = sum(r["size"] for r in timed) / max(sum(r["write_ns"] for r in timed), 1) if timed else 1.0
        for r in recs:
            if r["write_ns"] == 0:
                r["write_ns"] = int(r["size"] / bw)
            # Only the codec tried in the profiling step was timed: the
            # others are taken to cost as much.
            tried = max(r["codec_ns"].values(), default=0)
            for c in r["ratios"]:
                r["codec_ns"].setdefault(c, tried)
        return {
            "tensors": recs,
            "forward_ns": int(max(fwd_end - self.start - self.forward_pack_time, 0) * 1e9),
            "backward_ns": int(max(end - fwd_end - self.unpack_time, 0) * 1e9),
            "budget": budget,
            "tier": tier,
        }


def schedule(profile: dict[str, Any]) -> dict[str, Any]:
    """Run the Go scheduler over a profile; return the plan (with its ``text``)."""
    return _lib.call_json("pft_offload_plan", json.dumps(profile).encode())

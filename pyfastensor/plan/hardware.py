"""The memory system a trace is planned and simulated for (``offload.Hardware``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from . import _native


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """Device memory, host memory, an SSD and the host link, as the G10 simulator models them.

    Bandwidths are bytes per second; each direction of a link is a channel of
    its own. The Go core validates the values on every use (device bytes and
    bandwidths positive, host bytes and latency non-negative).

    Args:
        device_bytes: device (GPU) memory capacity.
        host_bytes: host memory that evicted tensors may use.
        ssd_read_bps: SSD read bandwidth.
        ssd_write_bps: SSD write bandwidth.
        ssd_latency_ns: latency added to every SSD transfer.
        host_link_bps: device to host bandwidth (and back, each way).

    Example::

        >>> hw = Hardware.g10_default().replace(device_bytes=8 << 30)
        >>> hw.device_bytes
        8589934592
    """

    device_bytes: int
    host_bytes: int
    ssd_read_bps: float
    ssd_write_bps: float
    ssd_latency_ns: int
    host_link_bps: float

    @classmethod
    def g10_default(cls) -> Hardware:
        """The seed paper's Table 2 (A100 40 GB, 128 GB DRAM, Z-NAND SSD, PCIe Gen3 x16).

        The values come from the Go core (``offload.G10Default``), where they
        are written down once.
        """
        return cls(**_native.defaults()["hardware"])

    @classmethod
    def g10_artifact(cls) -> Hardware:
        """The G10 artifact simulator's settings, behind G10's published figures (``offload.G10Artifact``).

        As :meth:`g10_default` except the SSD: 3.2 GB/s for writes as well
        as reads (the artifact has one SSD bandwidth), and a 16 us latency
        (the artifact's write latency; its reads take 12 us, and one latency
        is modelled, the larger). Not modelled: the artifact's 5 us PCIe
        latency per transfer and 45 us per page fault.
        """
        return cls(**_native.defaults()["hardware_artifact"])

    def replace(self, **changes: Any) -> Hardware:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The hardware's JSON form (``offload.Hardware``)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

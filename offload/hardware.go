package offload

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
)

// ErrHardware is wrapped by Hardware.Validate's error: a kind of
// gds.ErrInvalid.
var ErrHardware = gds.Named(gds.ErrInvalid, "offload: invalid hardware")

// Hardware is the memory system a trace is planned and simulated for.
// Bandwidths are bytes per second; each direction of a link is a channel of
// its own, shared over time by the transfers on it.
type Hardware struct {
	DeviceBytes  int64   `json:"device_bytes"`
	HostBytes    int64   `json:"host_bytes"`
	SSDReadBps   float64 `json:"ssd_read_bps"`
	SSDWriteBps  float64 `json:"ssd_write_bps"`
	SSDLatencyNs int64   `json:"ssd_latency_ns"` // added to every SSD transfer
	HostLinkBps  float64 `json:"host_link_bps"`  // device to host and back, each way
}

// G10Default is the G10 paper's Table 2: an A100 with 40 GB, 128 GB of
// host DRAM, a Z-NAND SSD at 3.2 GB/s read and 3.0 GB/s write with 20 µs
// read latency (16 µs write; one latency is modelled, the larger), and
// PCIe Gen3 x16 at 15.754 GB/s. GB of memory read as GiB, of bandwidth
// as 1e9 bytes.
func G10Default() Hardware {
	return Hardware{
		DeviceBytes:  40 << 30,
		HostBytes:    128 << 30,
		SSDReadBps:   3.2e9,
		SSDWriteBps:  3.0e9,
		SSDLatencyNs: 20_000,
		HostLinkBps:  15.754e9,
	}
}

// G10Artifact is the hardware of the G10 artifact's simulator
// (github.com/platformxlab/G10, src/configs/example.config and
// resources/genconfigs.py), the settings behind its published figures: as
// G10Default but with the SSD at 3.2 GB/s both ways (the artifact has one
// SSD bandwidth) and a 16 µs SSD latency (its write latency; its reads take
// 12 µs, one latency is modelled, the larger). GB of bandwidth are 1e9
// bytes, as the artifact's event simulator reads them. Not modelled: its
// 5 µs PCIe latency per transfer and 45 µs system latency per page fault
// (the traces carry no page faults).
func G10Artifact() Hardware {
	hw := G10Default()
	hw.SSDWriteBps = 3.2e9
	hw.SSDLatencyNs = 16_000
	return hw
}

// Validate rejects hardware the models cannot use.
func (h Hardware) Validate() error {
	if h.DeviceBytes <= 0 || h.HostBytes < 0 || h.SSDLatencyNs < 0 ||
		!(h.SSDReadBps > 0) || !(h.SSDWriteBps > 0) || !(h.HostLinkBps > 0) {
		return fmt.Errorf("%w %+v: device bytes and bandwidths must be positive, host bytes and latency non-negative", ErrHardware, h)
	}
	return nil
}

// Tiers a tensor can be evicted to.
const (
	TierSSD  = "ssd"
	TierHost = "host"
)

// evictNs and fetchNs are the uncontended transfer times of bytes to and
// from tier.
func (h Hardware) evictNs(tier string, bytes int64) float64 {
	if tier == TierHost {
		return float64(bytes) / h.HostLinkBps * 1e9
	}
	return float64(h.SSDLatencyNs) + float64(bytes)/h.SSDWriteBps*1e9
}

func (h Hardware) fetchNs(tier string, bytes int64) float64 {
	if tier == TierHost {
		return float64(bytes) / h.HostLinkBps * 1e9
	}
	return float64(h.SSDLatencyNs) + float64(bytes)/h.SSDReadBps*1e9
}

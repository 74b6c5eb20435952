package transfer

import (
	"fmt"
	"runtime"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Every threshold of the data path, in one place, with its measured reason.
// Python reads them through the C ABI (pft_settings): it never writes one
// down again. Measurements are from the two-core development VM (virtio
// disk; fio limits about 0.6-0.9 GB/s write and 2.1-4.3 GB/s read).

const (
	// Alignment is the file offset alignment of every record that O_DIRECT
	// or GDS may move in place: storage records of our zip files, tensors
	// of our safetensors files, DCP items, data chunks, spill-file slots.
	// It is the direct-I/O block and memory alignment (gds.DirectAlign, the
	// page size), so aligned records can also be handed to tensors as
	// whole pages.
	Alignment = gds.DirectAlign

	// DirectThreshold is the extent size from which the default chooser
	// uses O_DIRECT. Below it the page cache's copy costs less than a
	// direct transfer's fixed latency and its read-modify-write of edge
	// blocks. A durable GPT-2-sized save reached 0.47 GB/s direct against
	// 0.35 through the page cache (which pays for writeback at fsync); a
	// cold load's reads 1.9 GB/s direct into page-aligned memory against
	// 0.7 through the page cache.
	DirectThreshold = 1 << 20

	// ResidentShare is the share of an extent in the page cache from which
	// a read goes through the cache whatever its size: it is a memory copy
	// away, where O_DIRECT would go to the device for it.
	ResidentShare = 0.5

	// ResidencySamples windows of ResidencySampleBytes, spread evenly over
	// a file, estimate its share in the page cache when a load is planned
	// (within about 1/64, enough for ResidentShare and for telling a
	// wholly cached or wholly cold file). cachestat counts a range's pages
	// folio by folio: the whole of GPT-2's 498 MB took 4.5 ms (8 ms with
	// the other core busy) in 4 KiB folios, 2-8% of a warm load; 64
	// windows of 64 KiB take tens of µs. Files up to ResidencySampleGap
	// times the windows' bytes (16 MiB, 0.1 ms at most) are measured whole.
	ResidencySamples     = 64
	ResidencySampleBytes = 64 << 10
	ResidencySampleGap   = 4

	// AlignedMin is the least record a load reads straight into
	// page-aligned memory of its own, advised for huge pages: O_DIRECT
	// fills it without a bounce copy, and a copy out of the page cache
	// faults it in 2 MiB at a time (a warm GPT-2 load here: 42-50 ms
	// against 101-115 ms into the allocator's 4 KiB pages, every CRC
	// unchecked; 52-68 against 123-145 checked). Smaller ones go to the
	// allocator's memory. It is the direct threshold: below it the read is
	// through the page cache anyway.
	AlignedMin = DirectThreshold

	// CarveMin is the least page-aligned record that keeps its own pages
	// of a file read whole (freed with its tensor); smaller ones are
	// copied out into the allocator's memory, where a mapping per record
	// would cost more than the copy.
	CarveMin = 64 << 10

	// WholeRequest is the size of one request of a whole-file read: the
	// device needs large requests queued to reach its bandwidth (1 MiB
	// reads measured 1.5 GB/s where 8 MiB ones reached the disk's 2.1).
	WholeRequest = 8 << 20

	// WriteWorkers is the number of transfers in flight in a write.
	// Several requests queued at the device keep it busy even on a
	// two-core machine, since the goroutines mostly wait on direct I/O.
	WriteWorkers = 8

	// DirectReadWorkers is the number of reads in flight when any read of
	// a transfer is direct: the goroutines mostly wait for the device,
	// which needs many requests queued to reach its bandwidth.
	DirectReadWorkers = 16

	// ExtentMin is the smallest record a zip save writes straight from its
	// memory through its own engine. Smaller records are copied into the
	// runs of bytes between extents (with the headers around them), each
	// run one write through the engine the chooser gives its size.
	ExtentMin = DirectThreshold

	// RunMax bounds such a run: the memory one task composes.
	RunMax = 8 << 20

	// SumChunk is the size of the sub-transfers of a written piece whose
	// CRC-32 is computed alongside: small enough that the bytes just
	// moved are still in the CPU cache when they are summed.
	SumChunk = 1 << 20

	// ReadSumChunk is the size of the steps of a read piece that the CPU
	// copies out of the page cache, each summed just after it lands, while
	// it is in the core's cache (1 MiB of L2 on the development VM's
	// EPYC) rather than after the whole piece. Measured on a warm GPT-2
	// load into reused memory, 16 rounds x 3, the CRC-32s cost the same
	// 15-25 ms of CPU with 64 KiB, 256 KiB, 1 MiB steps or after each
	// 8 MiB piece: this VM's 32 MiB L3 holds both workers' pieces, and
	// the cost is the arithmetic (33 GB/s per core). Steps keep it so on
	// CPUs with less L3, at no cost here.
	ReadSumChunk = 256 << 10
)

// The whole-file thresholds are variables so that tests can make small
// files take the path large ones take (Override); nothing else sets them.
var (
	// WholeMin is the least file a cold load reads whole, in large
	// O_DIRECT requests, instead of record by record: below it the
	// per-record path's few requests cost no more.
	WholeMin int64 = 16 << 20

	// WholeAverageMin is the least average record size (bytes per record)
	// of a file read whole. Records under CarveMin are copied out of the
	// whole-file memory, in parallel while the load unpickles: a cold load
	// of 6,000 records of 4-64 KiB (209 MB) took 0.20-0.27 s whole against
	// 0.23-0.39 s record by record (paired rounds), whose parse reads the
	// file through the page cache and copies every record again.
	WholeAverageMin int64 = 16 << 10
)

// overridable are the settings Override may change.
var overridable = map[string]*int64{"whole_min": &WholeMin, "whole_average_min": &WholeAverageMin}

// Override sets the named settings (for tests) and returns their previous
// values. An unknown or fixed name is an error naming the ones it takes.
func Override(values map[string]int64) (map[string]int64, error) {
	for name := range values {
		if overridable[name] == nil {
			return nil, fmt.Errorf("%w: setting %q cannot be overridden (only whole_min, whole_average_min)", gds.ErrInvalid, name)
		}
	}
	old := map[string]int64{}
	for name, v := range values {
		old[name] = *overridable[name]
		*overridable[name] = v
	}
	return old, nil
}

// CachedReadWorkers is the number of reads in flight when every read of a
// transfer goes through the page cache: the work is the kernel's copy and
// our CRC-32, bound by CPUs, and more goroutines only contend (600 MB
// cold: 0.24 s with 2 workers, 0.30 s with 8, 0.35 s with 16).
func CachedReadWorkers() int { return max(2, runtime.NumCPU()) }

// Settings lists the thresholds above by name, for pft_settings.
func Settings() map[string]any {
	return map[string]any{
		"alignment":         Alignment,
		"memory_alignment":  gds.DirectAlign,
		"direct_threshold":  DirectThreshold,
		"resident_share":    ResidentShare,
		"aligned_min":       AlignedMin,
		"whole_min":         WholeMin,
		"whole_average_min": WholeAverageMin,
		"carve_min":         CarveMin,
		"whole_request":     WholeRequest,
	}
}

package checkpoint

import (
	"fmt"
	"os"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// The load planner: every decision of a load is taken here, once, and the
// Python side carries it out. Load (load.go) decides, from the end records
// it reads once:
//
//   - "read whole": a cold file of ours goes into one page-aligned area in
//     transfer.WholeRequest-byte O_DIRECT requests (ReadWhole), its pages'
//     CRC-32s summed as they land; then each entry's Memory says whether
//     the record keeps its pages of that area ("pages") or is copied out
//     ("allocator");
//   - otherwise the archive is opened (OpenArchive) and each entry's Memory
//     says where the record is read to: "aligned" (page-aligned memory of
//     its own, in huge pages where the kernel allows, which a direct read
//     fills in place and a page-cache copy faults in 2 MiB at a time) for
//     large records, "allocator" for the rest; the engine of each record
//     follows from the file's residency, measured once.
//
// Residency is measured once per load: for the whole file by Load, and
// per record only when the file is partly cached.

// Where a record's bytes go (Entry.Memory).
const (
	MemoryAllocator = "allocator" // torch's allocator: copied in
	MemoryAligned   = "aligned"   // page-aligned memory of its own, read into in place
	MemoryPages     = "pages"     // its own pages of the whole-file area
)

// fileResidency returns the share of the open file f, of size bytes, in
// the page cache: measured whole for a small file, else estimated from
// transfer.ResidencySamples windows of transfer.ResidencySampleBytes
// spread evenly over it (cachestat's cost grows with the pages it counts;
// see the settings). Every decision taken from it only chooses a path
// (whole or per record, which memory, which engine): a wrong estimate
// costs speed, never correctness.
func fileResidency(f *os.File, size int64) (float64, error) {
	n, w := int64(transfer.ResidencySamples), int64(transfer.ResidencySampleBytes)
	if size <= n*w*transfer.ResidencySampleGap {
		res, err := gds.ResidentFile(f, []int64{0}, []int64{size})
		if err != nil {
			return -1, err
		}
		return res[0], nil
	}
	stride := size / n &^ (transfer.Page - 1) // windows start on pages: no page counted twice
	offs, sizes := make([]int64, n), make([]int64, n)
	for i := range offs {
		offs[i], sizes[i] = int64(i)*stride, w
	}
	res, err := gds.ResidentFile(f, offs, sizes)
	if err != nil {
		return -1, err
	}
	var sum float64
	for _, r := range res {
		sum += r
	}
	return sum / float64(n), nil
}

// planMemory sets each entry's Memory and keeps each entry's residency for
// the reads that follow (their engines): records of transfer.AlignedMin
// and up get page-aligned memory of their own, cached or not, the rest the
// allocator's. A direct read fills aligned memory in place; a copy out of
// the page cache lands in it with a fault per 2 MiB huge page instead of
// one per 4 KiB page of the allocator's memory (a warm GPT-2 load, 148
// records, 498 MB: 42-50 ms against 101-115 ms, see transfer.AlignedMin).
// fileResident is the whole file's share, when known (else -1): a file
// wholly cached or wholly cold needs no measure per record.
func (a *Archive) planMemory(fileResident float64) error {
	res := make([]float64, len(a.Entries))
	big := false
	for _, e := range a.Entries {
		big = big || e.Size >= transfer.AlignedMin
	}
	switch {
	case !big: // every record goes through the page cache anyway
	case fileResident == 0 || fileResident == 1:
		for i := range res {
			res[i] = fileResident
		}
	default:
		measured, err := a.Resident()
		if err != nil {
			return err
		}
		res = measured
	}
	for i := range a.Entries {
		e := &a.Entries[i]
		e.Memory = MemoryAllocator
		if e.Size >= transfer.AlignedMin {
			e.Memory = MemoryAligned
		}
	}
	a.resident = res
	return nil
}

// carve is the memory of a record of a file read whole: its own pages of
// the area when it starts on a page and has transfer.CarveMin bytes or
// more, else the allocator's (copied out).
func carve(e *Entry) string {
	if e.DataOff%transfer.Page == 0 && e.Size >= transfer.CarveMin {
		return MemoryPages
	}
	return MemoryAllocator
}

// residentOf returns the residency planMemory kept for the requests'
// records, or nil when it kept none.
func (a *Archive) residentOf(reqs []ReadRequest) []float64 {
	if a.resident == nil {
		return nil
	}
	out := make([]float64, len(reqs))
	for i, r := range reqs {
		out[i] = a.resident[r.Index]
	}
	return out
}

// human writes a power-of-two size the way the docs do ("16 MiB").
func human(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

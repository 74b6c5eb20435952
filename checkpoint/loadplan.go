package checkpoint

import (
	"fmt"
	"os"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// The load planner: every decision of a load is taken here, once, and the
// Python side carries it out. A load asks PlanLoad first:
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
// Residency is measured once per load: for the whole file by PlanLoad,
// and per record only when the file is partly cached.

// Where a record's bytes go (Entry.Memory).
const (
	MemoryAllocator = "allocator" // torch's allocator: copied in
	MemoryAligned   = "aligned"   // page-aligned memory of its own, read into in place
	MemoryPages     = "pages"     // its own pages of the whole-file area
)

// LoadPlan is how to load a file.
type LoadPlan struct {
	// Whole says to read the file whole (ReadWhole) into Size bytes of
	// page-aligned memory, in Request-byte requests through Engine.
	Whole   bool   `json:"whole"`
	Size    int64  `json:"size"`
	Request int64  `json:"request,omitempty"`
	Engine  string `json:"engine,omitempty"`
	// Resident is the file's share in the page cache (0 to 1).
	Resident float64 `json:"resident"`
	// Reason says, in words, why the file is or is not read whole.
	Reason string `json:"reason"`
}

// PlanLoad decides how to load the file at path: whole (a cold file of
// ours, transfer.WholeMin and up, whose records average
// transfer.WholeAverageMin and up, where O_DIRECT works), or record by
// record. A mapped load (mapped) or one with an engine chosen by the
// caller (chosen) is always record by record.
func PlanLoad(path string, mapped, chosen bool) (LoadPlan, error) {
	st, err := os.Stat(path)
	if err != nil {
		return LoadPlan{}, gds.Classify(err)
	}
	plan := LoadPlan{Size: st.Size(), Resident: -1}
	if mapped || chosen {
		plan.Reason = "mapped, or an engine chosen by the caller: record by record"
		return plan, nil
	}
	if res, err := fileResidency(path, st.Size()); err == nil {
		plan.Resident = res
	}
	dir, err := transfer.DirOf(path)
	if err != nil {
		return LoadPlan{}, err
	}
	ours, records := endRecordCount(path, st.Size())
	average := st.Size() / max(records, 1)
	switch {
	case !ours:
		plan.Reason = "not written by pyfastensor (records not page-aligned): record by record"
	case st.Size() < transfer.WholeMin:
		plan.Reason = fmt.Sprintf("smaller than %s: record by record", human(transfer.WholeMin))
	case plan.Resident < 0 || plan.Resident >= transfer.ResidentShare:
		plan.Reason = "mostly in the page cache (or its residency unknown): record by record"
	case average < transfer.WholeAverageMin:
		plan.Reason = fmt.Sprintf("records average under %s: record by record", human(transfer.WholeAverageMin))
	case !transfer.Probe(dir).Direct:
		plan.Reason = "no O_DIRECT in its directory: record by record"
	default:
		plan.Whole, plan.Request, plan.Engine = true, transfer.WholeRequest, "direct"
		plan.Reason = fmt.Sprintf("cold file of ours: read whole in %s O_DIRECT requests", human(transfer.WholeRequest))
	}
	return plan, nil
}

// fileResidency returns the share of the file at path, of size bytes, in
// the page cache: measured whole for a small file, else estimated from
// transfer.ResidencySamples windows of transfer.ResidencySampleBytes
// spread evenly over it (cachestat's cost grows with the pages it counts;
// see the settings). Every decision taken from it only chooses a path
// (whole or per record, which memory, which engine): a wrong estimate
// costs speed, never correctness.
func fileResidency(path string, size int64) (float64, error) {
	n, w := int64(transfer.ResidencySamples), int64(transfer.ResidencySampleBytes)
	if size <= n*w*transfer.ResidencySampleGap {
		res, err := gds.Resident(path, []int64{0}, []int64{size})
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
	res, err := gds.Resident(path, offs, sizes)
	if err != nil {
		return -1, err
	}
	var sum float64
	for _, r := range res {
		sum += r
	}
	return sum / float64(n), nil
}

// endRecordCount reports whether the file ends with our writer's comment
// (its storage records then start on page boundaries) and the record
// count its zip64 end record announces (0 when not ours or damaged;
// opening the file says how).
func endRecordCount(path string, size int64) (ours bool, records int64) {
	n := int64(endTotalLen + cdCommentLen)
	if size < n {
		return false, 0
	}
	f, err := os.Open(path)
	if err != nil {
		return false, 0
	}
	defer f.Close()
	tail := make([]byte, n)
	if _, err := f.ReadAt(tail, size-n); err != nil {
		return false, 0
	}
	ours = oursComment(tail[endTotalLen:])
	if ours && le.Uint32(tail) == sigEnd64 {
		records = int64(min(le.Uint64(tail[32:]), uint64(size)))
	}
	return ours, records
}

// OpenForLoad opens the archive at path for a record-by-record load and
// plans each record's memory (planMemory) from the file's residency as
// PlanLoad measured it (-1: unknown).
func OpenForLoad(path string, resident float64) (*Archive, error) {
	a, err := OpenArchive(path)
	if err != nil {
		return nil, err
	}
	if err := a.planMemory(resident); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
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

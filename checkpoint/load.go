package checkpoint

import (
	"bytes"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// A load asks one call, Load: it opens the file once, reads its end
// records once, decides whether torch.load must take the file instead
// (Archive.Fallback, with the reason), plans the load (LoadPlan) and, for
// a cold file of ours, reads it whole into memory of its own mapping
// before parsing the central directory from there; otherwise it parses
// the file in place and plans each record's memory. Everything after
// (copying records out, reading them, verifying them) goes through the
// Archive it returns, which holds the file open.

// zipMagic starts every zip archive: a local header's signature.
const zipMagic = "PK\x03\x04"

// openFile is the open of the file a load makes (tests count them).
var openFile = os.Open

// LoadOptions tune Load.
type LoadOptions struct {
	// ParseOnly: the caller reads the records its own way (a mapped load,
	// one to a device): the file is parsed in place, no memory planned.
	ParseOnly bool
	// Read: verification, engine choice (a Chooser set is the caller's
	// choice of engine, which rules out a whole read), tuning and progress
	// of the reads; a whole read counts the file's bytes into Progress.
	Read ReadOptions
	// whole forces the whole read's decision (tests): 1 whole, -1 not.
	whole int
}

// LoadPlan is how a file is loaded.
type LoadPlan struct {
	// Whole says the file was read whole (Archive.ReadWhole), in
	// Request-byte requests through Engine, into Archive.Arena.
	Whole   bool   `json:"whole"`
	Request int64  `json:"request,omitempty"`
	Engine  string `json:"engine,omitempty"`
	// Resident is the file's share in the page cache (0 to 1; -1 unknown),
	// measured before the load's first read.
	Resident float64 `json:"resident"`
	// Warm says that share is transfer.ResidentShare or more: reads from
	// the cache are a memory copy away (a load to CUDA then takes the
	// pinned ring, not cuFile, which would read the disk again).
	Warm bool `json:"warm"`
	// Reason says, in words, why the file is or is not read whole.
	Reason string `json:"reason"`
}

// Load opens the file at path for a load, with one open and one read of
// its end records, and returns its Archive: Fallback set (and nothing
// read past the end records) when torch.load must take the file, else
// its entries with each one's Memory planned, and Plan. A cold file of
// ours (transfer.WholeMin and up, records averaging
// transfer.WholeAverageMin and up, where O_DIRECT works) is read whole
// into a fresh anonymous mapping (Archive.Arena, which the caller then
// owns and unmaps) and parsed from there; other files are parsed in
// place. A load that only parses (ParseOnly) or one with an engine of
// the caller's choosing is never read whole. Errors: a missing file wraps os.ErrNotExist; a
// damaged or truncated one wraps ErrCorrupt naming the file and the
// record.
func Load(path string, o LoadOptions) (*Archive, error) {
	f, err := openFile(path)
	if err != nil {
		return nil, gds.Classify(err)
	}
	a, err := load(f, path, o)
	if err != nil || a.pin == nil {
		f.Close()
	}
	return a, err
}

func load(f *os.File, path string, o LoadOptions) (*Archive, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: stat %s: %w", path, err)
	}
	size := st.Size()
	if !st.Mode().IsRegular() { // a directory, a pipe: torch.load says what it makes of it
		return &Archive{Path: path, Size: size, Fd: -1, Fallback: "not a regular file"}, nil
	}
	resident := -1.0 // before the first read: its readahead would count
	if res, err := fileResidency(f, size); err == nil {
		resident = res
	}
	p := &parser{f: f, file: f, path: path, size: size}
	if reason, err := p.notZip(); err != nil || reason != "" {
		return &Archive{Path: path, Size: size, Fd: -1, Fallback: reason}, err
	}
	e, err := p.findEnds()
	if err != nil {
		return nil, err
	}
	src := pinnedName(f, path)
	plan := decide(src, size, resident, e, o)
	if plan.Whole {
		mem, err := mapPages(size)
		if err != nil {
			plan.Whole = false
			plan.Reason = fmt.Sprintf("no memory to read it whole (%v): record by record", err)
		} else {
			ro := o.Read
			ro.Chooser = transfer.Fixed(plan.Engine)
			a, err := readWhole(f, path, src, mem, e, ro)
			if err != nil {
				unmapPages(mem)
				return nil, err
			}
			a.Plan, a.Arena = plan, uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
			return a, nil
		}
	}
	a, err := p.parseFrom(e)
	if err != nil {
		return nil, err
	}
	a.pin, a.Fd, a.Plan = f, int(f.Fd()), plan
	if !o.ParseOnly && a.Fallback == "" {
		if err := a.planMemory(plan.Resident); err != nil {
			a.pin = nil
			return nil, err
		}
	}
	return a, nil
}

// notZip returns why the file is not a zip archive torch.save writes
// (then torch.load takes it: a legacy file, or not a checkpoint at all),
// "" when it starts with a local header.
func (p *parser) notZip() (string, error) {
	if p.size < int64(len(zipMagic)) {
		return "not a zip archive (shorter than a zip header)", nil
	}
	var b []byte
	var err error
	if p.size <= endLen+max16 { // the tail is the whole file: one read
		if err = p.readTail(); err == nil {
			b = p.tail[:len(zipMagic)]
		}
	} else {
		b, err = p.read(0, int64(len(zipMagic)), "", "zip header")
	}
	if err != nil {
		return "", err
	}
	if string(b) != zipMagic {
		return "not a zip archive (torch's legacy format, or another file)", nil
	}
	return "", nil
}

// decide plans the load of a file (src names it, size bytes, resident its
// share in the page cache as it was opened, -1 unknown) whose end records
// are e.
func decide(src string, size int64, resident float64, e *ends, o LoadOptions) LoadPlan {
	plan := LoadPlan{Resident: resident, Warm: resident >= transfer.ResidentShare}
	if o.ParseOnly || o.Read.Chooser != nil {
		plan.Reason = "mapped, to a device, or an engine chosen by the caller: record by record"
		return plan
	}
	average := size / max(e.n, 1)
	switch {
	case o.whole > 0:
		plan.Reason = "read whole (forced)"
	case o.whole < 0:
		plan.Reason = "record by record (forced)"
		return plan
	case !e.ours():
		plan.Reason = "not written by pyfastensor (records not page-aligned): record by record"
		return plan
	case size < transfer.WholeMin:
		plan.Reason = fmt.Sprintf("smaller than %s: record by record", human(transfer.WholeMin))
		return plan
	case plan.Resident < 0 || plan.Resident >= transfer.ResidentShare:
		plan.Reason = "mostly in the page cache (or its residency unknown): record by record"
		return plan
	case average < transfer.WholeAverageMin:
		plan.Reason = fmt.Sprintf("records average under %s: record by record", human(transfer.WholeAverageMin))
		return plan
	default:
		dir, err := transfer.DirOf(src)
		if err != nil || !transfer.Probe(dir).Direct {
			plan.Reason = "no O_DIRECT in its directory: record by record"
			return plan
		}
		plan.Reason = fmt.Sprintf("cold file of ours: read whole in %s O_DIRECT requests", human(transfer.WholeRequest))
	}
	plan.Whole, plan.Request, plan.Engine = true, transfer.WholeRequest, "direct"
	if o.whole > 0 {
		plan.Engine = "posix"
	}
	return plan
}

// mapPages maps size bytes (at least a page) of anonymous memory, advised
// for huge pages from 2 MiB.
func mapPages(size int64) ([]byte, error) {
	n := max((size+transfer.Page-1)&^(transfer.Page-1), transfer.Page)
	ptr, err := unix.MmapPtr(-1, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", n, err)
	}
	if n >= 2<<20 {
		_ = unix.Madvise(unsafe.Slice((*byte)(ptr), n), unix.MADV_HUGEPAGE) // best effort
	}
	return unsafe.Slice((*byte)(ptr), size), nil
}

// unmapPages unmaps memory from mapPages.
func unmapPages(b []byte) {
	n := max((int64(len(b))+transfer.Page-1)&^(transfer.Page-1), transfer.Page)
	_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(n))
}

// inMemoryParser parses the file at path from data, all of it in memory.
func inMemoryParser(path string, data []byte) *parser {
	return &parser{f: bytes.NewReader(data), path: path, size: int64(len(data))}
}

// DropArena unmaps the mapping Load read the file whole into, for a
// caller that will not take it (Arena is 0 after); call it after Close.
func (a *Archive) DropArena() {
	if a.Arena != 0 {
		unmapPages(a.mem)
		a.Arena, a.mem = 0, nil
	}
}

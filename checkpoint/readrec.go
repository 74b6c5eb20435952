package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// ReadRequest asks for one record's bytes in Dst, whose length must be the
// record's size.
type ReadRequest struct {
	Index int // into Archive.Entries
	Dst   []byte
}

// ReadOptions tune Archive.Read. The zero value verifies CRC-32s and uses
// the default chooser.
type ReadOptions struct {
	// NoVerify skips the CRC-32 check.
	NoVerify bool
	// Chooser picks each record's engine; nil means transfer.Default of
	// the file's directory.
	Chooser transfer.Chooser
	// Resident is each request's share in the page cache, when a load plan
	// measured it already (Load); nil measures it here.
	Resident []float64
	Engine   gds.Options
	Workers  int
	Progress func(n int64)
}

// transferOptions are the transfer's options for these read options.
func (o ReadOptions) transferOptions() transfer.Options {
	return transfer.Options{Chooser: o.Chooser, Resident: o.Resident, Engine: o.Engine, Workers: o.Workers, Progress: o.Progress}
}

// Read fills each request's Dst with its record's bytes, in parallel, and
// checks each record's CRC-32 against the central directory's (unless the
// file carries none, see Archive.NoCRC). Dst is used
// only during the call. A mismatch gives an error wrapping ErrCorrupt that
// names the file and the record.
func (a *Archive) Read(reqs []ReadRequest, o ReadOptions) (st Stats, err error) {
	start := time.Now()
	o.NoVerify = o.NoVerify || a.NoCRC
	if err := a.check(reqs, "destination"); err != nil {
		return st, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	src, err := a.source()
	if err != nil {
		return st, err
	}
	if a.mem != nil {
		return a.readMemory(reqs, o, start)
	}
	if o.Chooser == nil {
		if o.Chooser, err = transfer.DefaultFor(src); err != nil {
			return st, err
		}
	}
	if o.Resident == nil {
		o.Resident = a.residentOf(reqs)
	}
	exts := make([]transfer.Extent, len(reqs))
	for i, r := range reqs {
		e := &a.Entries[r.Index]
		exts[i] = transfer.Extent{Off: e.DataOff, Data: r.Dst, Sum: !o.NoVerify}
		st.DataBytes += e.Size
	}
	res, tst, err := transfer.Read(src, exts, o.transferOptions())
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) {
			e := &a.Entries[reqs[ee.Ext].Index]
			if errors.Is(err, gds.ErrEOF) {
				return st, corrupt(a.Path, e.Name, ee.Off, "file ends inside the record's data (%v)", ee.Err)
			}
			return st, fmt.Errorf("checkpoint: read %s record %q: %w", a.Path, e.Name, ee.Err)
		}
		return st, fmt.Errorf("checkpoint: read %s: %w", a.Path, err)
	}
	if !o.NoVerify {
		for i, r := range reqs {
			if err := a.checkCRC(r.Index, res[i].CRC); err != nil {
				return st, err
			}
		}
	}
	st.FileBytes, st.Engines, st.Seconds = a.Size, tst.Engines, time.Since(start).Seconds()
	return st, nil
}

// check checks each request against its record: an index in range, a
// memory of the record's size (called what in errors), stored
// uncompressed.
func (a *Archive) check(reqs []ReadRequest, what string) error {
	for _, r := range reqs {
		if r.Index < 0 || r.Index >= len(a.Entries) {
			return fmt.Errorf("%w: record index %d out of range (%d records)", gds.ErrInvalid, r.Index, len(a.Entries))
		}
		e := &a.Entries[r.Index]
		if int64(len(r.Dst)) != e.Size {
			return fmt.Errorf("%w: record %q has %d bytes, %s %d", gds.ErrInvalid, e.Name, e.Size, what, len(r.Dst))
		}
		if e.Method != 0 {
			return fmt.Errorf("%w: record %q is compressed (method %d)", gds.ErrUnsupported, e.Name, e.Method)
		}
	}
	return nil
}

// checkCRC compares a record's summed CRC-32 with the central directory's;
// a mismatch is ErrCorrupt naming the file and the record. A record whose
// CRC-32 field is 0 carries none (Entry.Unchecked) and is not checked.
func (a *Archive) checkCRC(index int, got uint32) error {
	e := &a.Entries[index]
	if got != e.CRC && !e.Unchecked() {
		return corrupt(a.Path, e.Name, e.DataOff, "CRC-32 of the data is %08x, the central directory says %08x "+
			"(the bytes changed since they were written: damaged, or edited in place, through a shared mapping say; "+
			"a load that does not verify takes them as they are)", got, e.CRC)
	}
	return nil
}

// Index returns the position of the record called name, or -1.
func (a *Archive) Index(name string) int {
	for i := range a.Entries {
		if a.Entries[i].Name == name {
			return i
		}
	}
	return -1
}

// Resident returns, for each entry, the share of its data's pages in the
// page cache now (0 to 1; gds.Resident: cachestat per record). A load
// asks it to decide where to put each record: memory the page cache path
// copies into, or page-aligned memory a direct read fills in place.
func (a *Archive) Resident() ([]float64, error) {
	offs, sizes := make([]int64, len(a.Entries)), make([]int64, len(a.Entries))
	for i, e := range a.Entries {
		offs[i], sizes[i] = e.DataOff, e.Size
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.pin != nil { // the file parsed, whatever is at its path now
		return gds.ResidentFile(a.pin, offs, sizes)
	}
	src, err := a.source()
	if err != nil {
		return nil, err
	}
	return gds.Resident(src, offs, sizes)
}

// readMemory is Read for an archive ReadWhole read into memory: each
// record is copied out of that memory, in parallel (a load of many small
// records copies them into its tensors while it unpickles), and checked
// from the page sums taken as the file landed (or summed as copied when
// there are none). Callers hold a.mu for reading.
func (a *Archive) readMemory(reqs []ReadRequest, o ReadOptions, start time.Time) (st Stats, err error) {
	workers := o.Workers
	if workers <= 0 {
		workers = transfer.CachedReadWorkers()
	}
	err = transfer.Run(len(reqs), workers, func(i int) error {
		r := reqs[i]
		e := &a.Entries[r.Index]
		copy(r.Dst, a.mem[e.DataOff:e.DataOff+e.Size])
		if !o.NoVerify {
			var got uint32
			if a.whole != nil {
				got = a.whole.CRC(e.DataOff, e.Size)
			} else {
				got = transfer.Checksum(r.Dst)
			}
			if err := a.checkCRC(r.Index, got); err != nil {
				return err
			}
		}
		if o.Progress != nil {
			o.Progress(e.Size)
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	for _, r := range reqs {
		st.DataBytes += a.Entries[r.Index].Size
	}
	st.FileBytes, st.Engines, st.Seconds = a.Size, map[string]int64{"memory": st.DataBytes}, time.Since(start).Seconds()
	return st, nil
}

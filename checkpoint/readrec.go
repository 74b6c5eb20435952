package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
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
	// Chooser picks each record's engine; nil means DefaultChooser of the
	// file's directory.
	Chooser  Chooser
	Engine   gds.Options
	Workers  int
	Progress func(n int64)
}

// Read fills each request's Dst with its record's bytes, in parallel, and
// checks each record's CRC-32 against the central directory's (unless the
// file carries none, see Archive.NoCRC). Dst is used
// only during the call. A mismatch gives an error wrapping ErrCorrupt that
// names the file and the record.
func (a *Archive) Read(reqs []ReadRequest, o ReadOptions) (st Stats, err error) {
	start := time.Now()
	o.NoVerify = o.NoVerify || a.NoCRC
	if o.Chooser == nil {
		dir, derr := dirOf(a.Path)
		if derr != nil {
			return st, derr
		}
		o.Chooser = DefaultChooser(dir)
	}
	tasks, crcs, err := a.split(reqs, pieceSize(o.Engine), "destination")
	if err != nil {
		return st, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	src, err := a.source()
	if err != nil {
		return st, err
	}
	offs, sizes := make([]int64, len(reqs)), make([]int64, len(reqs))
	for i, r := range reqs {
		e := &a.Entries[r.Index]
		offs[i], sizes[i] = e.DataOff, e.Size
		st.DataBytes += e.Size
	}
	engines := readEngines(src, o.Chooser, offs, sizes)
	if o.Workers <= 0 {
		o.Workers = readWorkers(engines)
	}
	// Per record: pieces left and the start of its first piece, so the
	// chooser learns the record's time when its last piece lands.
	left := make([]atomic.Int64, len(reqs))
	started := make([]atomic.Int64, len(reqs))
	for _, t := range tasks {
		left[t.rec].Add(1)
	}
	rd := newEngineFiles(src, os.O_RDONLY, o.Engine, o.Progress)
	defer func() {
		if cerr := rd.close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	err = runTasks(len(tasks), o.Workers, func(t int) error {
		pc := tasks[t]
		e := &a.Entries[reqs[pc.rec].Index]
		p := reqs[pc.rec].Dst[pc.lo:pc.hi]
		started[pc.rec].CompareAndSwap(0, time.Now().UnixNano())
		f, err := rd.file(engines[pc.rec])
		if err != nil {
			return fmt.Errorf("checkpoint: read %s record %q: %w", a.Path, e.Name, err)
		}
		crc, _, err := moveSummed(f, false, p, e.DataOff+pc.lo, !o.NoVerify)
		if err != nil {
			if errors.Is(err, gds.ErrEOF) {
				return corrupt(a.Path, e.Name, e.DataOff+pc.lo, "file ends inside the record's data (%v)", err)
			}
			return fmt.Errorf("checkpoint: read %s record %q: %w", a.Path, e.Name, err)
		}
		if !o.NoVerify {
			crcs[pc.rec].set(pc.index, crc, int64(len(p)))
		}
		rd.count(f.Engine(), int64(len(p)))
		if left[pc.rec].Add(-1) == 0 {
			d := time.Duration(time.Now().UnixNano() - started[pc.rec].Load())
			o.Chooser.Observe(OpRead, e.Size, engines[pc.rec], d)
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	if !o.NoVerify {
		if err := a.checkCRCs(reqs, crcs); err != nil {
			return st, err
		}
	}
	st.FileBytes, st.Engines, st.Seconds = a.Size, rd.engines, time.Since(start).Seconds()
	return st, nil
}

// split checks each request against its record (an index in range, a
// memory of the record's size, called what in errors; stored uncompressed)
// and splits the records into pieces of at most ps bytes, with one
// pieceCRCs per request to sum them into.
func (a *Archive) split(reqs []ReadRequest, ps int64, what string) ([]piece, []*pieceCRCs, error) {
	var tasks []piece
	crcs := make([]*pieceCRCs, len(reqs))
	for i, r := range reqs {
		if r.Index < 0 || r.Index >= len(a.Entries) {
			return nil, nil, fmt.Errorf("%w: record index %d out of range (%d records)", gds.ErrInvalid, r.Index, len(a.Entries))
		}
		e := &a.Entries[r.Index]
		if int64(len(r.Dst)) != e.Size {
			return nil, nil, fmt.Errorf("%w: record %q has %d bytes, %s %d", gds.ErrInvalid, e.Name, e.Size, what, len(r.Dst))
		}
		if e.Method != 0 {
			return nil, nil, fmt.Errorf("%w: record %q is compressed (method %d)", gds.ErrUnsupported, e.Name, e.Method)
		}
		p := splitPieces(i, e.Size, ps)
		crcs[i] = newPieceCRCs(len(p))
		tasks = append(tasks, p...)
	}
	return tasks, crcs, nil
}

// checkCRCs compares each request's summed CRC-32 with its record's in the
// central directory; a mismatch is ErrCorrupt naming the file and the record.
func (a *Archive) checkCRCs(reqs []ReadRequest, crcs []*pieceCRCs) error {
	for i, r := range reqs {
		e := &a.Entries[r.Index]
		if got := crcs[i].total(); got != e.CRC {
			return corrupt(a.Path, e.Name, e.DataOff, "CRC-32 of the data is %08x, the central directory says %08x", got, e.CRC)
		}
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
	src, err := a.source()
	if err != nil {
		return nil, err
	}
	return gds.Resident(src, offs, sizes)
}

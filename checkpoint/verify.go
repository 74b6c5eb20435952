package checkpoint

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// verifyPiece is the most one task sums: large records are split so that
// both CPUs sum one record, and a cold mapping faults in several places at
// once.
const verifyPiece = 8 << 20

// Verify checks records whose bytes are already in memory, each request's
// Dst holding its record: typically slices of a mapping of the file, as a
// load with mmap=True makes. It sums them on several goroutines and
// compares each CRC-32 with the central directory's; a mismatch gives an
// error wrapping ErrCorrupt that names the file and the record. A fault on
// the memory (a mapping whose file was truncated under it) is an error
// too, not a crash.
//
// Reading a mapping faults its pages in: on a cold cache, Verify reads the
// records from the disk through the page cache, where the mapping then
// finds them.
func (a *Archive) Verify(reqs []ReadRequest, o ReadOptions) error {
	if a.NoCRC {
		return nil
	}
	reqs, err := a.verifyGranules(reqs, o.Progress)
	if err != nil {
		return err
	}
	if err := a.check(reqs, "memory"); err != nil {
		return err
	}
	var tasks []transfer.Piece
	crcs := make([]*transfer.PieceCRCs, len(reqs))
	for i, r := range reqs {
		p := transfer.Split(i, a.Entries[r.Index].Size, verifyPiece)
		crcs[i] = transfer.NewPieceCRCs(len(p))
		tasks = append(tasks, p...)
	}
	if o.Workers <= 0 {
		o.Workers = max(4, runtime.NumCPU()) // some wait on page faults
	}
	err = transfer.Run(len(tasks), o.Workers, func(t int) (err error) {
		pc := tasks[t]
		e := &a.Entries[reqs[pc.Ext].Index]
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("checkpoint: verify %s record %q at %d: memory fault (was the file truncated while mapped?): %v",
					a.Path, e.Name, e.DataOff+pc.Lo, r)
			}
		}()
		p := reqs[pc.Ext].Dst[pc.Lo:pc.Hi]
		// One madvise maps the piece rather than one fault per 16 pages as
		// the sum reaches them: on a warm 500 MB mapping, 10 ms less of faults.
		gds.Populate(p, false)
		crcs[pc.Ext].Set(pc.Index, transfer.Checksum(p), int64(len(p)))
		if o.Progress != nil {
			o.Progress(int64(len(p)))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, r := range reqs {
		if err := a.checkCRC(r.Index, crcs[i].Total()); err != nil {
			return err
		}
	}
	return nil
}

// verifyGranules checks the requests whose memory is the records' place in
// the memory ReadWhole read the file into, from the granules' sums it took
// then, and returns the others.
func (a *Archive) verifyGranules(reqs []ReadRequest, progress func(int64)) ([]ReadRequest, error) {
	if a.whole == nil {
		return reqs, nil
	}
	var rest []ReadRequest
	for _, r := range reqs {
		if r.Index < 0 || r.Index >= len(a.Entries) {
			rest = append(rest, r) // split says what is wrong
			continue
		}
		e := &a.Entries[r.Index]
		if int64(len(r.Dst)) != e.Size || e.Method != 0 || !a.whole.Holds(r.Dst, e.DataOff) {
			rest = append(rest, r)
			continue
		}
		if err := a.checkCRC(r.Index, a.whole.CRC(e.DataOff, e.Size)); err != nil {
			return nil, err
		}
		if progress != nil {
			progress(e.Size)
		}
	}
	return rest, nil
}

package checkpoint

import (
	"errors"
	"fmt"
	"os"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// A cold load of one of our archives (Load's plan) reads the file whole,
// in large O_DIRECT requests, into one page-aligned memory area, then
// parses it from memory: one sequential stream at the
// disk's bandwidth, instead of a parse that waits for the disk at each run
// of small records and reads the records one by one. Each request sums its
// pages' CRC-32s as it lands, while the next ones wait for the disk, so
// that verifying a record later (Verify) joins sums instead of reading
// its bytes again. The Python side then hands each large record's pages
// to its tensor.

// ReadWhole reads the file at path whole into dst, whose length must be
// the file's, in parallel requests of o.Engine.TaskSize (default
// transfer.WholeRequest) through o.Chooser's engine for a file of that
// size (the load planner's choice: direct), and parses it from there
// (OpenArchiveMemory). Unless o.NoVerify, each request sums the CRC-32s of
// its pages as it lands, while later requests still wait for the disk;
// Verify then checks records in dst from those sums, touching only the
// partial pages at their ends. dst must stay as read, and alive, for as
// long as the Archive is open: Read copies records out of it (readMemory),
// Verify checks them there. Each entry's Memory says which records keep
// their pages of dst and which are copied out.
//
// When the file at path no longer has dst's length (a save replaced it
// since its caller measured it), ReadWhole opens the file as OpenArchive
// does instead, leaving dst alone: the Archive's ReadWhole is false.
func ReadWhole(path string, dst []byte, o ReadOptions) (a *Archive, err error) {
	size := int64(len(dst))
	f, err := os.Open(path)
	if err != nil {
		return nil, gds.Classify(err)
	}
	defer func() {
		if a == nil {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != size {
		if a, err = openPinned(f, path, st.Size()); err == nil {
			err = a.planMemory(-1)
		}
		return a, err
	}
	src := pinnedName(f, path)
	if o.Chooser == nil {
		if o.Chooser, err = transfer.DefaultFor(src); err != nil {
			return nil, err
		}
	}
	return readWhole(f, path, src, dst, nil, o)
}

// readWhole reads f (opened from path, reopened as src), whole into dst
// and parses it from there: from the end records e when its caller read
// them already, else from dst's. The Archive it returns holds f.
func readWhole(f *os.File, path, src string, dst []byte, e *ends, o ReadOptions) (*Archive, error) {
	size := int64(len(dst))
	ext := transfer.Extent{Data: dst, Engine: o.Chooser.Engine(transfer.OpRead, size)}
	var sums *transfer.PageSums
	if !o.NoVerify {
		sums = transfer.NewPageSums(dst)
		ext.Pages = sums
	}
	to := o.transferOptions()
	to.Resident = []float64{0} // the load planner measured it: cold
	if _, _, err := transfer.Read(src, []transfer.Extent{ext}, to); err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && errors.Is(err, gds.ErrEOF) {
			return nil, corrupt(path, "", ee.Off, "file ends before the bytes expected here (shrunk while read?)")
		}
		return nil, fmt.Errorf("checkpoint: read %s whole: %w", path, err)
	}
	p := inMemoryParser(path, dst)
	var a *Archive
	var err error
	if e != nil {
		a, err = p.parseFrom(e)
	} else {
		a, err = p.parse()
	}
	if err != nil {
		return nil, err
	}
	a.ReadWhole, a.pin, a.Fd, a.whole, a.mem = true, f, int(f.Fd()), sums, dst
	for i := range a.Entries {
		a.Entries[i].Memory = carve(&a.Entries[i])
	}
	return a, nil
}

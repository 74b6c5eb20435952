package checkpoint

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Staged is a save whose storage records arrive in parts: the archive is
// laid out and its temporary file created first (BeginStaged), the staged
// records' data written part after part (WritePart), from a staging
// buffer reused between parts, and the headers, the other records and the
// central directory written last (Commit), which then commits as Save
// does. It serves a state larger than the memory it is staged through (a
// CUDA state copied to the host through a bounded pinned buffer, in waves).
//
// Not safe for concurrent use. The file holds the same bytes Save would
// write for the same records.
type Staged struct {
	path    string
	l       layout
	w       *transfer.Writer
	staged  []bool   // the record's data comes through WritePart
	written []int64  // bytes of each staged record written so far
	crc     []uint32 // CRC-32 of those bytes
	holes   []byte   // PROT_NONE reservation the staged records' Data lie over (sized, never read)
	start   time.Time
	done    bool
}

// BeginStaged lays out recs, in order, for a staged save at path and
// creates its temporary file. A record with staged[i] set has sizes[i]
// bytes, written later by WritePart (its Data must be nil); every other
// record's Data is read at Commit, so the caller keeps it alive and
// unchanged until Commit or Abort returns.
func BeginStaged(path string, recs []Record, staged []bool, sizes []int64, o WriteOptions) (*Staged, error) {
	if len(staged) != len(recs) || len(sizes) != len(recs) {
		return nil, fmt.Errorf("%w: %d records, %d staged flags, %d sizes", gds.ErrInvalid, len(recs), len(staged), len(sizes))
	}
	// The layout takes a record's size from len(Data): a staged record gets
	// Data over an address range reserved PROT_NONE (no memory behind it),
	// which would fault if anything read it before its parts are written.
	var most int64
	for i := range recs {
		if !staged[i] {
			continue
		}
		if recs[i].Data != nil || sizes[i] < 0 {
			return nil, fmt.Errorf("%w: staged record %q: want no data and a size >= 0, got %d bytes of data and size %d",
				gds.ErrInvalid, recs[i].Name, len(recs[i].Data), sizes[i])
		}
		most = max(most, sizes[i])
	}
	s := &Staged{path: path, staged: staged, written: make([]int64, len(recs)), crc: make([]uint32, len(recs)), start: time.Now()}
	if most > 0 {
		holes, err := unix.Mmap(-1, 0, int(most), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: staged save %s: reserving %d bytes of address space: %w", path, most, err)
		}
		s.holes = holes
	}
	placed := make([]Record, len(recs))
	copy(placed, recs)
	for i := range placed {
		if staged[i] {
			placed[i].Data = s.holes[:sizes[i]:sizes[i]]
		}
	}
	if err := checkNames(placed); err != nil {
		s.unmap()
		return nil, err
	}
	s.l = plan(placed)
	s.l.noCRC = o.NoCRC
	w, err := transfer.Create(path, s.l.total, !o.NotDurable, o.FS, o.transferOptions())
	if err != nil {
		s.unmap()
		return nil, fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	s.w = w
	return s, nil
}

func (s *Staged) unmap() {
	if s.holes != nil {
		_ = unix.Munmap(s.holes)
		s.holes = nil
	}
}

// Part is bytes of a staged record: Data from offset Off of record Rec's data.
type Part struct {
	Rec  int
	Off  int64
	Data []byte
}

// WritePart writes p as the bytes of staged record i from offset off of
// its data (WriteParts with one part).
func (s *Staged) WritePart(i int, off int64, p []byte) error {
	return s.WriteParts([]Part{{Rec: i, Off: off, Data: p}})
}

// WriteParts writes parts of staged records in one transfer (in parallel
// pieces, as Save writes records), each summed as it is written. Parts of
// a record come in order, here and from call to call (a part's Off is what
// was written of its record before it). The memory is read during the call
// only. On error nothing is counted as written: the save is to be aborted.
func (s *Staged) WriteParts(parts []Part) error {
	if s.done {
		return fmt.Errorf("%w: checkpoint: staged save %s: part after commit or abort", gds.ErrInvalid, s.path)
	}
	next := map[int]int64{} // what each record will have written after the parts before
	exts := make([]transfer.Extent, 0, len(parts))
	owner := make([]int, 0, len(parts)) // the record of each extent
	for _, p := range parts {
		i := p.Rec
		if i < 0 || i >= len(s.l.recs) || !s.staged[i] {
			return fmt.Errorf("%w: checkpoint: staged save %s: record %d is not staged", gds.ErrInvalid, s.path, i)
		}
		r := &s.l.recs[i]
		at, seen := next[i]
		if !seen {
			at = s.written[i]
		}
		if p.Off != at || p.Off+int64(len(p.Data)) > r.size() {
			return fmt.Errorf("%w: checkpoint: staged save %s: record %q: part of %d bytes at %d, after %d of its %d bytes",
				gds.ErrInvalid, s.path, r.Name, len(p.Data), p.Off, at, r.size())
		}
		next[i] = at + int64(len(p.Data))
		if len(p.Data) > 0 {
			exts = append(exts, transfer.Extent{Off: r.dataOff + p.Off, Data: p.Data, Sum: !s.l.noCRC})
			owner = append(owner, i)
		}
	}
	if len(exts) == 0 {
		return nil
	}
	res, err := s.w.Write(exts)
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) {
			r := &s.l.recs[owner[ee.Ext]]
			return fmt.Errorf("checkpoint: save %s: record %q at %d: %w", s.path, r.Name, ee.Off-r.dataOff, err)
		}
		return fmt.Errorf("checkpoint: save %s: %w", s.path, err)
	}
	k := 0
	for _, p := range parts {
		if len(p.Data) == 0 {
			continue
		}
		s.crc[p.Rec] = transfer.Combine(s.crc[p.Rec], res[k].CRC, int64(len(p.Data)))
		s.written[p.Rec] += int64(len(p.Data))
		k++
	}
	return nil
}

// Commit writes everything but the staged records' data (written by then,
// in full), then commits the file as Save does. On error nothing new is
// left at path.
func (s *Staged) Commit() (st Stats, err error) {
	if s.done {
		return st, fmt.Errorf("%w: checkpoint: staged save %s: commit after commit or abort", gds.ErrInvalid, s.path)
	}
	defer func() {
		if err != nil {
			s.Abort()
		}
	}()
	recs := s.l.recs
	for i := range recs {
		if s.staged[i] {
			if s.written[i] != recs[i].size() {
				return st, fmt.Errorf("%w: checkpoint: staged save %s: record %q has %d of its %d bytes",
					gds.ErrInvalid, s.path, recs[i].Name, s.written[i], recs[i].size())
			}
			recs[i].crc = s.crc[i]
		}
	}
	if err := write(s.w, &s.l, s.staged); err != nil {
		return st, fmt.Errorf("checkpoint: save %s: %w", s.path, err)
	}
	s.done = true
	tst, err := s.w.Commit()
	s.unmap()
	if err != nil {
		return st, fmt.Errorf("checkpoint: save %s: %w", s.path, err)
	}
	st = Stats{FileBytes: s.l.total, Engines: tst.Engines, Seconds: time.Since(s.start).Seconds()}
	for i := range recs {
		st.DataBytes += recs[i].size()
	}
	return st, nil
}

// Abort drops the save: the temporary file is removed, path is untouched.
// Idempotent; a no-op after Commit.
func (s *Staged) Abort() {
	if s.done {
		return
	}
	s.done = true
	s.w.Abort()
	s.unmap()
}

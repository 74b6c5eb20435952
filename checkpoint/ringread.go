package checkpoint

import (
	"errors"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// RingPart is bytes [Off, Off+Len) of record Rec's data, read into bytes
// [At, At+Len) of the slot of fill Fill.
type RingPart struct {
	Fill int
	Rec  int
	Off  int64
	Len  int64
	At   int64
}

// RingRead reads records of an archive through a ring of buffers reused
// from fill to fill (a CUDA load through its pinned slots): a
// transfer.Ring over the records' bytes whose Next also joins each part's
// CRC-32 to its record's, in fill order, and checks each record at its
// last part. Next and Close are for one goroutine.
type RingRead struct {
	a      *Archive
	ring   *transfer.Ring
	parts  []RingPart
	verify bool
	crc    []uint32 // per record, the CRC-32 of its parts taken so far
}

// StartRing starts reading parts into slots: fill k goes to
// slots[fillSlots[k]]. Parts come in fill order, the parts of a record in
// order of their offsets, and a record touched is read whole. The slots'
// memory is written until Close returns, and the archive's file stays open
// until then; a fill's slot may be read once Next has returned the fill,
// until it is released.
func (a *Archive) StartRing(slots [][]byte, fillSlots []int, parts []RingPart, o ReadOptions) (*RingRead, error) {
	o.NoVerify = o.NoVerify || a.NoCRC
	read := make([]int64, len(a.Entries)) // bytes of each record planned so far
	exts := make([]transfer.RingExtent, len(parts))
	resident := make([]float64, len(parts))
	for j, p := range parts {
		if p.Len <= 0 || p.Len > int64(int(p.Len)) {
			return nil, fmt.Errorf("%w: ring read of %s: part %d of %d bytes", gds.ErrInvalid, a.Path, j, p.Len)
		}
		e, err := a.part(p.Rec, p.Off, int(p.Len))
		if err != nil {
			return nil, err
		}
		if p.Off != read[p.Rec] {
			return nil, fmt.Errorf("%w: ring read of %s: record %q: part at %d after %d of its bytes",
				gds.ErrInvalid, a.Path, e.Name, p.Off, read[p.Rec])
		}
		read[p.Rec] += p.Len
		exts[j] = transfer.RingExtent{Fill: p.Fill, Off: e.DataOff + p.Off, Len: p.Len, At: p.At}
		if a.resident != nil {
			resident[j] = a.resident[p.Rec]
		}
	}
	for i, n := range read {
		if n != 0 && n != a.Entries[i].Size {
			return nil, fmt.Errorf("%w: ring read of %s: record %q: parts of %d of its %d bytes",
				gds.ErrInvalid, a.Path, a.Entries[i].Name, n, a.Entries[i].Size)
		}
	}
	if a.resident != nil {
		o.Resident = resident
	}
	a.mu.RLock() // released when the transfer returns: the file stays open until then
	src, err := a.source()
	if err == nil && o.Chooser == nil {
		o.Chooser, err = transfer.DefaultFor(src)
	}
	var ring *transfer.Ring
	if err == nil {
		ring, err = transfer.StartRing(src, slots, fillSlots, exts, !o.NoVerify, o.transferOptions(), a.mu.RUnlock)
	}
	if err != nil {
		a.mu.RUnlock()
		return nil, err
	}
	return &RingRead{a: a, ring: ring, parts: parts, verify: !o.NoVerify, crc: make([]uint32, len(a.Entries))}, nil
}

// Next releases fill release's slot (-1: none), waits for the next fill in
// order to land, checks the CRC-32 of each record it completes (ErrCorrupt
// naming the record), and returns the fill's index, or -1 once every fill
// has been returned (transfer.Ring.Next).
func (r *RingRead) Next(release int) (int, error) {
	k, first, crcs, err := r.ring.Next(release)
	if err != nil || k < 0 {
		return k, r.wrap(err)
	}
	if r.verify {
		for i, c := range crcs {
			p := r.parts[first+i]
			crc, err := r.a.partSummed(p.Rec, p.Off, int(p.Len), r.crc[p.Rec], c)
			if err != nil {
				return -1, err
			}
			r.crc[p.Rec] = crc
		}
	}
	return k, nil
}

// Close stops the read and returns once no read is in flight; it returns
// the read's error, if one failed (transfer.Ring.Close).
func (r *RingRead) Close() error { return r.wrap(r.ring.Close()) }

// wrap names the record and the offset of a failed part, as Read does.
func (r *RingRead) wrap(err error) error {
	var ee *transfer.ExtentError
	if err == nil || !errors.As(err, &ee) {
		return err
	}
	e := &r.a.Entries[r.parts[ee.Ext].Rec]
	if errors.Is(err, gds.ErrEOF) {
		return corrupt(r.a.Path, e.Name, ee.Off, "file ends inside the record's data (%v)", ee.Err)
	}
	return fmt.Errorf("checkpoint: read %s record %q at %d: %w", r.a.Path, e.Name, ee.Off-e.DataOff, ee.Err)
}

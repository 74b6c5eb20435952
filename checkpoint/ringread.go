package checkpoint

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

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

// RingRead reads records through a ring of buffers reused from fill to
// fill (a CUDA load through its pinned slots). The caller plans the
// fills, each a slot's worth of parts of records, and StartRing reads
// them all as one transfer: its pieces stay in flight across fills, as
// in a read of the whole file, and a piece of a fill starts only once its
// slot is free, that is once the caller has released the fill before it
// in that slot. The caller takes the fills in order (Next), copies each
// out of its slot, and releases it with a later call to Next.
//
// Reading fill after fill, each a call of its own, left the device with
// fewer requests queued at the end of each fill (its last pieces): a cold
// 1.9 GB load through four 64 MiB slots, two fills at once, read at 0.87
// of a bare O_DIRECT pass of the file on the development VM, where one
// read of the whole file reached 0.97-0.99.
//
// Each part's CRC-32 is summed as it lands and joined to its record's in
// fill order by Next, which checks the record at its last part. Next and
// Close are for one goroutine; the reads run on the transfer's.
type RingRead struct {
	a      *Archive
	fills  []ringFill
	verify bool
	next   int           // the fill Next returns next
	crc    []uint32      // per record, the CRC-32 of its parts taken so far
	stop   chan struct{} // closed by Close
	halt   sync.Once
	done   chan struct{} // closed when the transfer has returned
	err    error         // the transfer's, once done is closed
}

// ringFill is one fill's state.
type ringFill struct {
	slot     int
	parts    []RingPart
	crcs     []uint32      // each part's CRC-32, set as it lands
	left     atomic.Int64  // parts still to land
	ready    chan struct{} // closed once the slot is free for this fill
	landed   chan struct{} // closed once every part has landed
	prev     int           // the fill before it in its slot, or -1
	reuse    int           // the fill after it in its slot, or -1
	released bool          // the caller is done with its slot
}

// errRingStopped fails the pieces that were waiting for a slot when the
// read was closed.
var errRingStopped = fmt.Errorf("%w: ring read closed", gds.ErrClosed)

// StartRing starts reading parts into slots: fill k goes to
// slots[fillSlots[k]]. Parts come in fill order, the parts of a record in
// order of their offsets, and a record touched is read whole. The slots'
// memory is written until Close returns; a fill's slot memory may be read
// once Next has returned that fill, and until it is released.
func (a *Archive) StartRing(slots [][]byte, fillSlots []int, parts []RingPart, o ReadOptions) (*RingRead, error) {
	o.NoVerify = o.NoVerify || a.NoCRC
	r := &RingRead{a: a, fills: make([]ringFill, len(fillSlots)), verify: !o.NoVerify, crc: make([]uint32, len(a.Entries)),
		stop: make(chan struct{}), done: make(chan struct{})}
	last := make([]int, len(slots)) // the last fill planned in each slot
	for i := range last {
		last[i] = -1
	}
	for k, s := range fillSlots {
		if s < 0 || s >= len(slots) {
			return nil, fmt.Errorf("%w: ring read of %s: fill %d in slot %d of %d", gds.ErrInvalid, a.Path, k, s, len(slots))
		}
		f := &r.fills[k]
		f.slot, f.prev, f.reuse = s, last[s], -1
		f.ready, f.landed = make(chan struct{}), make(chan struct{})
		if f.prev < 0 {
			close(f.ready)
		} else {
			r.fills[f.prev].reuse = k
		}
		last[s] = k
	}
	read := make([]int64, len(a.Entries)) // bytes of each record planned so far
	exts := make([]transfer.Extent, len(parts))
	resident := make([]float64, len(parts))
	for j, p := range parts {
		if p.Fill < 0 || p.Fill >= len(r.fills) || (j > 0 && p.Fill < parts[j-1].Fill) {
			return nil, fmt.Errorf("%w: ring read of %s: part %d of fill %d, after fill %d (fills 0 to %d, in order)",
				gds.ErrInvalid, a.Path, j, p.Fill, max(0, parts[max(0, j-1)].Fill), len(r.fills)-1)
		}
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
		f := &r.fills[p.Fill]
		slot := slots[f.slot]
		if p.At < 0 || p.At+p.Len > int64(len(slot)) {
			return nil, fmt.Errorf("%w: ring read of %s: part %d at %d of %d bytes in a slot of %d",
				gds.ErrInvalid, a.Path, j, p.At, p.Len, len(slot))
		}
		k := len(f.parts)
		f.parts = append(f.parts, p)
		exts[j] = transfer.Extent{Off: e.DataOff + p.Off, Data: slot[p.At : p.At+p.Len : p.At+p.Len], Sum: r.verify,
			Ready: r.waiter(f), Landed: r.lander(f, k)}
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
	for k := range r.fills {
		f := &r.fills[k]
		f.crcs = make([]uint32, len(f.parts))
		f.left.Store(int64(len(f.parts)))
		if len(f.parts) == 0 {
			close(f.landed)
		}
	}
	if a.resident != nil {
		o.Resident = resident
	}
	a.mu.RLock() // held by the transfer: the file stays open until it returns
	src, err := a.source()
	if err == nil && o.Chooser == nil {
		o.Chooser, err = transfer.DefaultFor(src)
	}
	if err != nil {
		a.mu.RUnlock()
		return nil, err
	}
	go func() {
		defer close(r.done)
		defer a.mu.RUnlock()
		_, _, err := transfer.Read(src, exts, o.transferOptions())
		r.err = r.wrap(parts, err)
	}()
	return r, nil
}

// waiter is the Ready of fill f's parts: its slot is free, or the read is
// closed, or another piece failed.
func (r *RingRead) waiter(f *ringFill) func(<-chan struct{}) error {
	return func(failed <-chan struct{}) error {
		select {
		case <-f.ready:
			return nil
		case <-r.stop:
			return errRingStopped
		case <-failed:
			return errRingStopped
		}
	}
}

// lander is the Landed of part k of fill f.
func (r *RingRead) lander(f *ringFill, k int) func(uint32) {
	return func(crc uint32) {
		f.crcs[k] = crc
		if f.left.Add(-1) == 0 {
			close(f.landed)
		}
	}
}

// wrap names the record and the offset of a failed part, as Read does.
func (r *RingRead) wrap(parts []RingPart, err error) error {
	var ee *transfer.ExtentError
	if err == nil || !errors.As(err, &ee) {
		if err != nil {
			return fmt.Errorf("checkpoint: read %s: %w", r.a.Path, err)
		}
		return nil
	}
	p := parts[ee.Ext]
	e := &r.a.Entries[p.Rec]
	if errors.Is(err, gds.ErrEOF) {
		return corrupt(r.a.Path, e.Name, ee.Off, "file ends inside the record's data (%v)", ee.Err)
	}
	return fmt.Errorf("checkpoint: read %s record %q at %d: %w", r.a.Path, e.Name, ee.Off-e.DataOff, ee.Err)
}

// Next releases fill release's slot (-1: none), a fill Next returned
// before, then waits for the next fill in order to land, checks the CRC-32
// of each record it completes, and returns the fill's index: its slot
// holds its parts. It returns -1 once every fill has been returned.
//
// A fill whose slot the fill before it still holds cannot land: Next
// refuses to wait for it rather than wait forever.
func (r *RingRead) Next(release int) (int, error) {
	select {
	case <-r.stop:
		return -1, errRingStopped
	default:
	}
	if release >= 0 {
		if release >= r.next || r.fills[release].released {
			return -1, fmt.Errorf("%w: ring read of %s: release of fill %d (taken: %d, released already: %v)",
				gds.ErrInvalid, r.a.Path, release, r.next, release < r.next && r.fills[release].released)
		}
		f := &r.fills[release]
		f.released = true
		if f.reuse >= 0 {
			close(r.fills[f.reuse].ready)
		}
	}
	if r.next == len(r.fills) {
		return -1, nil
	}
	f := &r.fills[r.next]
	if f.prev >= 0 && !r.fills[f.prev].released {
		return -1, fmt.Errorf("%w: ring read of %s: fill %d needs slot %d, which fill %d still holds: release it first",
			gds.ErrInvalid, r.a.Path, r.next, f.slot, f.prev)
	}
	select {
	case <-f.landed:
	case <-r.done:
		select {
		case <-f.landed:
		default:
			if r.err == nil { // cannot be: a transfer that returned without error landed every part
				return -1, fmt.Errorf("%w: ring read of %s: fill %d did not land", gds.ErrInternal, r.a.Path, r.next)
			}
			return -1, r.err
		}
	}
	if r.verify {
		for k, p := range f.parts {
			crc, err := r.a.partSummed(p.Rec, p.Off, int(p.Len), r.crc[p.Rec], f.crcs[k])
			if err != nil {
				return -1, err
			}
			r.crc[p.Rec] = crc
		}
	}
	r.next++
	return r.next - 1, nil
}

// Close stops the read: no piece starts after it, and it returns once the
// pieces in flight have landed, so the slots are no longer written. It
// returns the transfer's error, if any, and is idempotent.
func (r *RingRead) Close() error {
	r.halt.Do(func() { close(r.stop) })
	<-r.done
	if errors.Is(r.err, errRingStopped) {
		return nil
	}
	return r.err
}

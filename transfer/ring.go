package transfer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pyfastensor/pyfastensor/gds"
)

// RingExtent is bytes [Off, Off+Len) of a file, read into bytes [At,
// At+Len) of the slot of fill Fill.
type RingExtent struct {
	Fill int
	Off  int64
	Len  int64
	At   int64
}

// Ring is a read of a file through a ring of buffers reused from fill to
// fill (a CUDA load through its pinned slots). The caller plans the fills,
// each a slot's worth of extents, and StartRing reads them all as one
// transfer: its pieces stay in flight across fills, as in a read of the
// whole file, and a piece of a fill starts only once its slot is free,
// that is once the caller has released the fill before it in that slot.
// The caller takes the fills in order (Next), copies each out of its slot,
// and releases it with a later call to Next.
//
// Reading fill after fill, each a transfer of its own, left the device
// with fewer requests queued at the end of each fill (its last pieces): a
// cold 1.9 GB load through four 64 MiB slots, two fills at once, read at
// 0.87 of a bare O_DIRECT pass of the file on the development VM, where
// one read of the whole file reached 0.97-0.99.
//
// Next and Close are for one goroutine; the reads run on the transfer's.
type Ring struct {
	path  string
	fills []ringFill
	next  int           // the fill Next returns next
	stop  chan struct{} // closed by Close
	halt  sync.Once
	done  chan struct{} // closed when the transfer has returned
	err   error         // the transfer's, once done is closed
}

// ringFill is one fill's state.
type ringFill struct {
	slot     int
	first    int           // its first extent (a fill's extents are consecutive)
	crcs     []uint32      // each extent's CRC-32, set as it lands
	left     atomic.Int64  // extents still to land
	ready    chan struct{} // closed once the slot is free for this fill
	landed   chan struct{} // closed once every extent has landed
	prev     int           // the fill before it in its slot, or -1
	reuse    int           // the fill after it in its slot, or -1
	released bool          // the caller is done with its slot
}

// errRingStopped fails the pieces that were waiting for a slot when the
// read was closed (Close does not report it).
var errRingStopped = fmt.Errorf("%w: ring read closed", gds.ErrClosed)

// StartRing starts reading exts of the file at path into slots: fill k
// goes to slots[fillSlots[k]], and exts come in fill order. With sum, each
// extent's CRC-32 is summed as it lands (Next returns them). The slots'
// memory is written until Close returns; a fill's slot may be read once
// Next has returned the fill, until it is released. done, when not nil,
// is called once the transfer has returned (no read in flight).
func StartRing(path string, slots [][]byte, fillSlots []int, exts []RingExtent, sum bool, o Options, done func()) (*Ring, error) {
	r := &Ring{path: ShownName(path), fills: make([]ringFill, len(fillSlots)), stop: make(chan struct{}), done: make(chan struct{})}
	last := make([]int, len(slots)) // the last fill planned in each slot
	for i := range last {
		last[i] = -1
	}
	for k, s := range fillSlots {
		if s < 0 || s >= len(slots) {
			return nil, fmt.Errorf("%w: ring read of %s: fill %d in slot %d of %d", gds.ErrInvalid, r.path, k, s, len(slots))
		}
		f := &r.fills[k]
		f.slot, f.prev, f.reuse, f.first = s, last[s], -1, -1
		f.ready, f.landed = make(chan struct{}), make(chan struct{})
		if f.prev < 0 {
			close(f.ready)
		} else {
			r.fills[f.prev].reuse = k
		}
		last[s] = k
	}
	moves := make([]Extent, len(exts))
	for j, e := range exts {
		if e.Fill < 0 || e.Fill >= len(r.fills) || (j > 0 && e.Fill < exts[j-1].Fill) {
			return nil, fmt.Errorf("%w: ring read of %s: part %d of fill %d, after fill %d (fills 0 to %d, in order)",
				gds.ErrInvalid, r.path, j, e.Fill, exts[max(0, j-1)].Fill, len(r.fills)-1)
		}
		f := &r.fills[e.Fill]
		slot := slots[f.slot]
		if e.Len <= 0 || e.Off < 0 || e.At < 0 || e.At+e.Len > int64(len(slot)) {
			return nil, fmt.Errorf("%w: ring read of %s: part %d of %d bytes at %d in a slot of %d",
				gds.ErrInvalid, r.path, j, e.Len, e.At, len(slot))
		}
		if f.first < 0 {
			f.first = j
		}
		moves[j] = Extent{Off: e.Off, Data: slot[e.At : e.At+e.Len : e.At+e.Len], Sum: sum,
			Ready: r.waiter(f), Landed: r.lander(f, j-f.first)}
		f.crcs = append(f.crcs, 0)
	}
	for k := range r.fills {
		f := &r.fills[k]
		f.left.Store(int64(len(f.crcs)))
		if len(f.crcs) == 0 {
			close(f.landed)
		}
	}
	go func() {
		defer close(r.done)
		if done != nil {
			defer done()
		}
		_, _, r.err = Read(path, moves, o)
	}()
	return r, nil
}

// waiter is the Ready of fill f's extents: its slot is free, or the read
// is closed, or another piece failed.
func (r *Ring) waiter(f *ringFill) func(<-chan struct{}) error {
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

// lander is the Landed of extent k of fill f.
func (r *Ring) lander(f *ringFill, k int) func(uint32) {
	return func(crc uint32) {
		f.crcs[k] = crc
		if f.left.Add(-1) == 0 {
			close(f.landed)
		}
	}
}

// Next releases fill release's slot (-1: none), a fill Next returned
// before, then waits for the next fill in order to land and returns its
// index, the index of its first extent and each of its extents' CRC-32 (0
// without sum); fill -1 once every fill has been returned. A read that
// failed gives the transfer's error (an ExtentError naming the extent).
//
// A fill whose slot the fill before it still holds cannot land: Next
// refuses to wait for it rather than wait forever.
func (r *Ring) Next(release int) (fill, first int, crcs []uint32, err error) {
	select {
	case <-r.stop:
		return -1, 0, nil, errRingStopped
	default:
	}
	if release >= 0 {
		if release >= r.next || r.fills[release].released {
			return -1, 0, nil, fmt.Errorf("%w: ring read of %s: release of fill %d (taken: %d, released already: %v)",
				gds.ErrInvalid, r.path, release, r.next, release < r.next && r.fills[release].released)
		}
		f := &r.fills[release]
		f.released = true
		if f.reuse >= 0 {
			close(r.fills[f.reuse].ready)
		}
	}
	if r.next == len(r.fills) {
		return -1, 0, nil, nil
	}
	f := &r.fills[r.next]
	if f.prev >= 0 && !r.fills[f.prev].released {
		return -1, 0, nil, fmt.Errorf("%w: ring read of %s: fill %d needs slot %d, which fill %d still holds: release it first",
			gds.ErrInvalid, r.path, r.next, f.slot, f.prev)
	}
	select {
	case <-f.landed:
	case <-r.done:
		select {
		case <-f.landed:
		default:
			if r.err == nil { // cannot be: a transfer that returned without error landed every extent
				return -1, 0, nil, fmt.Errorf("%w: ring read of %s: fill %d did not land", gds.ErrInternal, r.path, r.next)
			}
			return -1, 0, nil, r.err
		}
	}
	r.next++
	return r.next - 1, f.first, f.crcs, nil
}

// Close stops the read: no piece starts after it, and it returns once the
// pieces in flight have landed, so the slots are no longer written. It
// returns the transfer's error, if one failed, and is idempotent.
func (r *Ring) Close() error {
	r.halt.Do(func() { close(r.stop) })
	<-r.done
	if errors.Is(r.err, errRingStopped) {
		return nil
	}
	return r.err
}

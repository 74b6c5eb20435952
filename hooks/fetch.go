package hooks

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Prefetch starts reading a slot ahead of Get. dst is the caller's buffer
// of exactly the slot's size, or nil for a Go-owned one. A slot whose write
// has not finished starts its read when the write does. A second Prefetch
// before Get does nothing.
//
// Memory: a non-nil dst is written until Get or Free of the slot returns;
// the caller keeps it valid until then.
func (s *Store) Prefetch(id SlotID, dst []byte) error {
	sl, err := s.lookup(id)
	if err != nil {
		return err
	}
	if dst != nil && int64(len(dst)) != sl.n {
		return fmt.Errorf("%w: prefetch buffer of %d bytes for slot %d of %d bytes", gds.ErrInvalid, len(dst), id, sl.n)
	}
	s.mu.Lock()
	if sl.pf != nil {
		s.mu.Unlock()
		return nil
	}
	pf := &fetch{buf: dst, done: make(chan struct{})}
	if dst == nil {
		pf.buf, pf.owned = make([]byte, sl.n), true
	}
	sl.pf = pf
	s.count(sl, func(c *counters) {
		c.prefetches++
		c.prefetchBytes += sl.n
		c.peakPrefetch = max(c.peakPrefetch, c.prefetchBytes)
	})
	start := false
	select {
	case <-sl.written:
		pf.queued, start = true, true
	default: // runWrite queues it when the write finishes
	}
	s.mu.Unlock()
	if start {
		s.q.push(true, func() { s.runRead(sl, pf) })
	}
	return nil
}

func (s *Store) runRead(sl *slot, pf *fetch) {
	defer close(pf.done)
	if sl.werr != nil {
		pf.err = sl.werr
		return
	}
	t := time.Now()
	eng, err := guard(func() (string, error) { return s.be.read(sl.ext, pf.buf) })
	s.mu.Lock()
	sl.rdur, sl.rengine = time.Since(t), eng
	s.count(sl, func(c *counters) { c.read(sl.n, sl.rdur, eng) })
	s.mu.Unlock()
	pf.err = err
}

// Get fills dst (exactly the slot's size) with the slot's bytes: from its
// prefetch when there is one (waiting for it), else by a synchronous read.
// The time Get waits for I/O counts as stall time. A slot stays readable
// after Get: unpack may run more than once.
//
// Memory: dst is used only during the call.
func (s *Store) Get(id SlotID, dst []byte) error {
	sl, err := s.lookup(id)
	if err != nil {
		return err
	}
	if int64(len(dst)) != sl.n {
		return fmt.Errorf("%w: buffer of %d bytes for slot %d of %d bytes", gds.ErrInvalid, len(dst), id, sl.n)
	}
	t := time.Now()
	defer func() {
		s.mu.Lock()
		stall := time.Since(t)
		s.count(sl, func(c *counters) {
			c.gets++
			c.stall += stall
		})
		s.mu.Unlock()
	}()
	<-sl.written
	if sl.werr != nil {
		return sl.werr
	}
	s.mu.Lock()
	pf := sl.pf
	s.mu.Unlock()
	if pf != nil {
		<-pf.done
		s.mu.Lock()
		if sl.pf == pf {
			sl.pf = nil
			s.count(sl, func(c *counters) { c.prefetchBytes -= sl.n })
		}
		if pf.err == nil {
			s.count(sl, func(c *counters) { c.hits++ })
		}
		s.mu.Unlock()
		if pf.err == nil {
			if !sameMemory(pf.buf, dst) {
				copy(dst, pf.buf)
			}
			return nil
		}
	}
	rt := time.Now()
	eng, err := s.be.read(sl.ext, dst)
	s.mu.Lock()
	sl.rdur, sl.rengine = time.Since(rt), eng
	s.count(sl, func(c *counters) { c.read(sl.n, sl.rdur, eng) })
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("slot %d (%d bytes): %w", id, sl.n, err)
	}
	return nil
}

// sameMemory reports whether a and b start at the same address.
func sameMemory(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

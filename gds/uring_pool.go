package gds

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ringPool is the rings of one open file (directFile.ring). Safe for
// concurrent use.
type ringPool struct {
	depth int // requests in flight per ring (Options.QueueDepth)
	max   int // rings at most (Options.Threads)
	// Limits, lowered by tests: bytes per request (uringMaxIO) and bounce
	// bytes in flight per transfer (uringBounceBytes).
	maxIO, bounceBytes int

	mu      sync.Mutex
	cond    sync.Cond // signalled when a ring is returned or discarded
	free    []*ioRing
	count   int // rings in existence, free or in use
	waiting int // callers of get waiting for a ring
	closed  bool
	open    func(entries uint32) (*ioRing, error) // newIORing; tests make it fail

	// Counters for tests and diagnostics.
	peak    atomic.Int32 // most requests in flight on one ring
	submits atomic.Int64 // io_uring_enter rounds (submit and wait)
}

func newRingPool(o Options) *ringPool {
	p := &ringPool{depth: min(max(o.QueueDepth, 1), uringMaxDepth), max: max(o.Threads, 1),
		maxIO: uringMaxIO, bounceBytes: uringBounceBytes, open: newIORing}
	p.cond.L = &p.mu
	return p
}

// get takes a free ring, creates one while there are fewer than max, or
// waits for one to be returned. A creation that failed while other rings
// existed (EMFILE, say) is tried again only once none is left: a ring
// discarded meanwhile wakes the waiter to create one or fail.
func (p *ringPool) get() (*ioRing, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	createFailed := false
	for {
		if p.closed {
			return nil, ErrClosed
		}
		if n := len(p.free); n > 0 {
			r := p.free[n-1]
			p.free = p.free[:n-1]
			return r, nil
		}
		if p.count < p.max && (!createFailed || p.count == 0) {
			p.count++
			p.mu.Unlock()
			r, err := p.open(uint32(p.depth))
			p.mu.Lock()
			if err == nil {
				return r, nil
			}
			p.count--
			if p.count == 0 {
				return nil, err
			}
			createFailed = true // other rings exist (EMFILE, say): wait for one
		}
		p.waiting++
		p.cond.Wait()
		p.waiting--
	}
}

// put returns a ring after use. A broken ring, or any ring once the pool is
// closed, is closed instead.
func (p *ringPool) put(r *ioRing, broken bool) {
	p.mu.Lock()
	if p.closed || broken {
		p.count--
		p.mu.Unlock()
		r.Close()
		p.cond.Broadcast() // room for a ring: each waiter may try to create one
		return
	}
	p.free = append(p.free, r)
	p.mu.Unlock()
	p.cond.Signal()
}

// Close releases every idle ring; a ring still in use (a transfer racing
// Close, which the File contract forbids) is released when it is returned.
// Later transfers get ErrClosed.
func (p *ringPool) Close() error {
	p.mu.Lock()
	p.closed = true
	free := p.free
	p.free = nil
	p.count -= len(free)
	p.mu.Unlock()
	p.cond.Broadcast()
	var errs []error
	for _, r := range free {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

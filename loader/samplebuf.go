package loader

import (
	"math/bits"
	"sync"
)

// Sample memory, reused. A chunk read copies each sample it keeps out of
// the chunk's buffer into memory of its own (a sample waits in memory
// until its request, long after the buffer went to the next read). Fresh
// Go memory per sample cost, at 100,000 samples of 100 KB (bench data,
// perf), a fifth of the machine's CPU: the kernel's zeroing and faulting
// of the pages the heap took back between collections, the runtime's own
// zeroing, and a collection per few hundred MiB allocated. A sample whose
// bytes its requester copied out (the worker's shared memory, the
// in-process tensors) comes back here through Server.Release, and the next
// read's samples of its size class reuse it.
//
// Idle memory is held up to a limit (the server's: its budget's read
// share): beyond it a released buffer is left to the collector, as
// before. A sample never released (a batch given back, one sent to
// another node) is the collector's too.

// sampleBufMin is the least sample kept for reuse: smaller ones come from
// the runtime's size classes, which recycle them cheaply.
const sampleBufMin = 32 << 10

// sampleClass rounds n up to its size class: a sixteenth of the power of
// two below it, so samples of nearby lengths share buffers and none holds
// more than 1/16 beyond its bytes.
func sampleClass(n int) int {
	if n < sampleBufMin {
		return n
	}
	step := 1 << (bits.Len(uint(n)) - 5)
	return (n + step - 1) / step * step
}

type samplePool struct {
	mu    sync.Mutex
	idle  map[int][][]byte // by capacity, a size class
	bytes int64            // idle bytes
	peak  int64            // the most idle bytes held at once
	limit int64
}

func newSamplePool(limit int64) *samplePool {
	return &samplePool{idle: map[int][][]byte{}, limit: limit}
}

// get returns n bytes: an idle buffer of n's class, else a new one. Their
// contents are what the last sample left.
func (p *samplePool) get(n int) []byte {
	c := sampleClass(n)
	if n >= sampleBufMin {
		p.mu.Lock()
		if free := p.idle[c]; len(free) > 0 {
			b := free[len(free)-1]
			p.idle[c] = free[:len(free)-1]
			p.bytes -= int64(c)
			p.mu.Unlock()
			return b[:n]
		}
		p.mu.Unlock()
	}
	return make([]byte, n, c)
}

// put keeps b for a later get of its class, unless it is small, not of a
// class (not from get), or the idle buffers are at the limit. The caller
// gives up b.
func (p *samplePool) put(b []byte) {
	c := cap(b)
	if c < sampleBufMin || sampleClass(c) != c {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+int64(c) > p.limit {
		return
	}
	p.idle[c] = append(p.idle[c], b[:c])
	p.bytes += int64(c)
	p.peak = max(p.peak, p.bytes)
}

// usage returns the idle bytes held now and at most.
func (p *samplePool) usage() (idle, peak int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes, p.peak
}

package loader

import (
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Chunk read buffers, kept for the next reads. A fresh buffer costs the
// first touch of its pages, each zeroed by the kernel; in huge-page memory
// (THP "madvise", as on the development VM) a 2 MiB page is zeroed for a
// chunk of 128 KiB. Measured on 4 nodes of bench data-nodes (perf, pack in
// the page cache), that zeroing was 8% of the nodes' CPU time. Reused
// buffers skip it.
//
// A pool holds at most its limit in buffers, in use and idle together (the
// server's: its budget's read share, which bounds the reads in flight), so
// keeping them takes no memory the budget does not count.

// hugeChunkMin is the least buffer that is huge-page memory (gds.MapHuge:
// a request of several MiB reaches the device whole); smaller ones are Go
// heap memory aligned for O_DIRECT.
const hugeChunkMin = 2 << 20

// chunkBufStep rounds buffer sizes up, so chunks of nearby lengths share
// buffers.
const chunkBufStep = 64 << 10

type chunkBuf struct {
	b    []byte // the whole buffer
	free func() // gives its memory back (huge-page memory), else nil
}

type bufPool struct {
	mu    sync.Mutex
	idle  []chunkBuf
	total int64 // bytes of the buffers, in use and idle
	limit int64
}

func newBufPool(limit int64) *bufPool { return &bufPool{limit: limit} }

// get returns n bytes of a buffer (the least idle one that holds them, else
// a new one) and the function that puts it back. Their contents are what
// the last reader left.
func (p *bufPool) get(n int) ([]byte, func()) {
	p.mu.Lock()
	best := -1
	for k, c := range p.idle {
		if len(c.b) >= n && (best < 0 || len(c.b) < len(p.idle[best].b)) {
			best = k
		}
	}
	if best >= 0 {
		c := p.idle[best]
		p.idle[best] = p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.mu.Unlock()
		return c.b[:n], func() { p.put(c) }
	}
	size := (n + chunkBufStep - 1) / chunkBufStep * chunkBufStep
	var drop []chunkBuf // idle buffers too small for n: room for the new one
	for p.total+int64(size) > p.limit && len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.total -= int64(len(c.b))
		drop = append(drop, c)
	}
	p.total += int64(size)
	p.mu.Unlock()
	for _, c := range drop {
		c.release()
	}
	c := chunkBuf{}
	if size >= hugeChunkMin {
		c.b, c.free = gds.MapHuge(size)
	} else {
		c.b = gds.AlignedBuf(size, gds.DirectAlign)
	}
	return c.b[:n], func() { p.put(c) }
}

// put keeps c for the next get, or lets it go when the pool holds more than
// its limit (buffers taken while the idle ones were too small).
func (p *bufPool) put(c chunkBuf) {
	p.mu.Lock()
	if p.total > p.limit {
		p.total -= int64(len(c.b))
		p.mu.Unlock()
		c.release()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (c chunkBuf) release() {
	if c.free != nil {
		c.free()
	}
}

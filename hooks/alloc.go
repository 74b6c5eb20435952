package hooks

import (
	"sort"
	"sync"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// Alignment of every slot in the spill file: the records' alignment
// (transfer.Alignment, the direct-I/O block), so a slot's first byte always
// starts a disk block and no two slots share one: a write never has to
// read-modify-write a neighbour's bytes.
const slotAlign = transfer.Alignment

// extent is a byte range of the spill file: [off, off+size), size a multiple
// of slotAlign.
type extent struct {
	off, size int64
	buf       []byte // the host tier's memory; nil in the spill file
}

// allocator hands out aligned extents of a file that grows at its end. Freed
// extents go to a free list kept sorted by offset and coalesced with their
// neighbours; a request takes the first free extent large enough (first fit)
// and only grows the file when none is. A free extent that reaches the end
// shrinks the end instead, so the high-water mark falls back when the last
// slots are freed.
//
// Safe for concurrent use.
type allocator struct {
	mu   sync.Mutex
	free []extent // sorted by off, no two adjacent
	end  int64    // first byte past the highest extent in use or free
	used int64    // bytes in extents handed out
	peak int64    // highest used seen
}

// roundSlot rounds n up to the slot alignment (at least one block, so every
// slot has a distinct offset even for an empty tensor).
func roundSlot(n int64) int64 {
	if n <= 0 {
		return slotAlign
	}
	return (n + slotAlign - 1) &^ (slotAlign - 1)
}

// alloc returns an extent of at least n bytes and the new end of the file
// (callers grow the file to it when it moved).
func (a *allocator) alloc(n int64) (extent, int64) {
	size := roundSlot(n)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used += size
	a.peak = max(a.peak, a.used)
	for i, f := range a.free {
		if f.size < size {
			continue
		}
		e := extent{off: f.off, size: size}
		if f.size == size {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = extent{off: f.off + size, size: f.size - size}
		}
		return e, a.end
	}
	e := extent{off: a.end, size: size}
	a.end += size
	return e, a.end
}

// release returns e to the free list.
func (a *allocator) release(e extent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used -= e.size
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > e.off })
	a.free = append(a.free, extent{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = e
	// Coalesce with the next extent, then with the previous one.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].size == a.free[i+1].off {
		a.free[i].size += a.free[i+1].size
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].size == a.free[i].off {
		a.free[i-1].size += a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
		i--
	}
	// A free extent at the end lowers the high-water mark.
	if last := a.free[len(a.free)-1]; last.off+last.size == a.end {
		a.end = last.off
		a.free = a.free[:len(a.free)-1]
	}
}

// snapshot returns bytes in use, the peak and the high-water mark.
func (a *allocator) snapshot() (used, peak, end int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used, a.peak, a.end
}

package gds

import (
	"sync"
	"unsafe"
)

// Alignment arithmetic for O_DIRECT. A transfer [off, off+n) is cut into
//
//	unaligned prefix | aligned middle | unaligned suffix
//
// where the middle starts and ends on offset-alignment boundaries. The middle
// goes straight between the caller's memory and the disk when the memory
// address is aligned too, and through aligned bounce buffers otherwise. The
// prefix and suffix each touch one disk block that also holds bytes outside
// the transfer: they are read-modify-written under a per-block lock.

// DirectAlign is the memory and block alignment at which O_DIRECT and
// GPUDirect Storage move bytes in place: the page size, and the logical
// block size of every disk we meet. Memory allocated here for direct
// transfers (AlignedBuf's callers, the huge-page buffers' fallback) starts
// on it, and the file layouts' record alignment (transfer.Alignment) is
// it. A file whose filesystem reports its own direct-I/O alignment
// (statx) is moved at that one (dioAlign).
const DirectAlign = 4096

// alignDown rounds x down to a multiple of a (a power of two).
func alignDown(x, a int64) int64 { return x &^ (a - 1) }

// alignUp rounds x up to a multiple of a (a power of two).
func alignUp(x, a int64) int64 { return (x + a - 1) &^ (a - 1) }

// addrAligned reports whether p starts at an address that is a multiple of a.
func addrAligned(p []byte, a int) bool {
	if len(p) == 0 {
		return true
	}
	return addrOf(p)&uintptr(a-1) == 0
}

// alignedBuf returns an n-byte slice whose address is a multiple of a, by
// over-allocating and slicing at the first aligned address.
func alignedBuf(n, a int) []byte {
	raw := make([]byte, n+a)
	shift := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & uintptr(a-1)); r != 0 {
		shift = a - r
	}
	return raw[shift : shift+n : shift+n]
}

// addrOf returns the address of p's first byte.
func addrOf(p []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p))) }

// bouncePool hands out aligned buffers of one size (a task size) from the
// process's huge-page buffers (hugebuf.go), which outlive the file.
type bouncePool struct{ size int }

func newBouncePool(size, align int) *bouncePool {
	if align > hugePage {
		panic("gds: memory alignment above 2 MiB")
	}
	return &bouncePool{size: size}
}

func (b *bouncePool) get() *hugeBuf  { return getHuge(b.size) }
func (b *bouncePool) put(p *hugeBuf) { putHuge(p) }

// blockLocks serialises read-modify-write of partial blocks: two writers
// whose unaligned edges share a block take turns, so neither overwrites the
// other's bytes with stale ones. Striped by block number.
type blockLocks [64]sync.Mutex

func (l *blockLocks) lock(block int64) func() {
	m := &l[uint64(block)%uint64(len(l))]
	m.Lock()
	return m.Unlock
}

// AlignedBuf returns n bytes of Go memory whose start is aligned to a (a
// power of two), for O_DIRECT transfers from Go-owned buffers.
func AlignedBuf(n, a int) []byte { return alignedBuf(n, a) }

package gds

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Bounce buffers for O_DIRECT from or to unaligned memory. They come from
// anonymous mappings outside the Go heap, aligned to 2 MiB and advised
// MADV_HUGEPAGE, and they are kept for reuse across files and transfers:
//
//   - huge pages make a buffer physically contiguous in 2 MiB runs, so a
//     request of several MiB reaches the device as one request (a virtio
//     disk takes at most 254 segments: with scattered 4 KiB pages a request
//     is cut at about 1 MiB, which measured half the disk's bandwidth);
//   - reuse means a save's bounce memory is faulted in once per process,
//     not once per file (first touch of fresh memory cost about 1 GB/s on
//     the development VM, slower than the disk).
//
// The pool keeps at most hugeIdleMax bytes idle; buffers beyond that are
// unmapped when put back.

const (
	hugePage    = 2 << 20
	hugeIdleMax = 256 << 20
)

// hugeBuf is one mapped buffer: b is its usable part, aligned to hugePage.
type hugeBuf struct {
	b   []byte
	raw []byte // the whole mapping, for munmap
}

// hugePool is the process's bounce buffers, by size.
var hugePool = struct {
	mu   sync.Mutex
	idle map[int][]*hugeBuf
	size int // bytes idle
}{idle: map[int][]*hugeBuf{}}

// getHuge returns an n-byte buffer aligned to 2 MiB (a multiple of every
// O_DIRECT alignment), reused when one of that size is idle, else newly
// mapped. When mapping fails (no address space, a seccomp filter), it
// falls back to the Go heap aligned to DirectAlign.
func getHuge(n int) *hugeBuf {
	hugePool.mu.Lock()
	if l := hugePool.idle[n]; len(l) > 0 {
		b := l[len(l)-1]
		hugePool.idle[n] = l[:len(l)-1]
		hugePool.size -= n
		hugePool.mu.Unlock()
		return b
	}
	hugePool.mu.Unlock()
	raw, err := unix.Mmap(-1, 0, n+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return &hugeBuf{b: alignedBuf(n, DirectAlign)}
	}
	lo := int(alignUp(int64(addrOf(raw)), hugePage) - int64(addrOf(raw)))
	b := raw[lo : lo+n : lo+n]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: without THP the buffer still works
	return &hugeBuf{b: b, raw: raw}
}

// putHuge returns b to the pool, or unmaps it when the pool holds enough.
func putHuge(b *hugeBuf) {
	n := len(b.b)
	hugePool.mu.Lock()
	if hugePool.size+n <= hugeIdleMax {
		hugePool.idle[n] = append(hugePool.idle[n], b)
		hugePool.size += n
		hugePool.mu.Unlock()
		return
	}
	hugePool.mu.Unlock()
	if b.raw != nil {
		_ = unix.Munmap(b.raw)
	}
}

// ReleaseIdle lets go of every idle bounce buffer and returns the bytes
// unmapped (a buffer from the Go heap, where mapping failed, is left to
// its garbage collector, uncounted); buffers in use go back to the pool
// when returned, as before.
func ReleaseIdle() int {
	hugePool.mu.Lock()
	idle := hugePool.idle
	hugePool.idle, hugePool.size = map[int][]*hugeBuf{}, 0
	hugePool.mu.Unlock()
	released := 0
	for n, l := range idle {
		for _, b := range l {
			if b.raw != nil && unix.Munmap(b.raw) == nil {
				released += n
			}
		}
	}
	return released
}

// Borrow returns n bytes of pooled memory aligned to 2 MiB (so O_DIRECT
// moves it in place, in large requests), and the function that gives it
// back. Sizes are rounded up to whole huge pages, so buffers of nearby sizes
// (the runs a save composes) reuse one another. The contents are whatever
// the last borrower left.
func Borrow(n int) (b []byte, giveBack func()) {
	h := getHuge(int(alignUp(int64(max(n, 1)), hugePage)))
	return h.b[:n], func() { putHuge(h) }
}

// MapHuge returns n bytes of fresh memory outside the Go heap, aligned to
// 2 MiB and advised MADV_HUGEPAGE (so an O_DIRECT read of several MiB into
// it reaches the device as few large requests, not ~1 MiB ones cut at the
// disk's segment limit), and the function that unmaps it. Not pooled: the
// memory is the caller's only while it holds it (the loader's chunk reads,
// which must stay within their budget). Where mapping fails it is Go heap
// memory aligned to DirectAlign, and free does nothing.
func MapHuge(n int) (b []byte, free func()) {
	if n == 0 {
		return []byte{}, func() {}
	}
	size := int(alignUp(int64(n), hugePage))
	raw, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return alignedBuf(n, DirectAlign), func() {}
	}
	lo := int(alignUp(int64(addrOf(raw)), hugePage) - int64(addrOf(raw)))
	b = raw[lo : lo+n : lo+n]
	_ = unix.Madvise(raw[lo:lo+size], unix.MADV_HUGEPAGE)
	var once sync.Once
	return b, func() { once.Do(func() { _ = unix.Munmap(raw) }) }
}

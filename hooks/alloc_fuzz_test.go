package hooks

import (
	"cmp"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The spill file has no on-disk slot format: a slot is an extent the
// allocator keeps in memory. The allocator is therefore what is fuzzed: the
// input is a program of alloc and release operations, and the allocator's
// invariants are checked after every one.

// allocOp is one operation of a fuzz program. Encoding, one operation at a
// time: a byte whose low bit is 0 for alloc, followed by the size (4
// bytes, little-endian); 1 for release, followed by one byte choosing the
// live extent (modulo their count). A program that ends inside an
// operation ends there.
type allocOp struct {
	release bool
	n       int64 // alloc: the size asked for
	pick    int   // release: which live extent
}

func decodeAllocOps(data []byte) []allocOp {
	var ops []allocOp
	for len(data) > 0 {
		op := data[0]
		data = data[1:]
		if op&1 == 1 {
			if len(data) < 1 {
				break
			}
			ops = append(ops, allocOp{release: true, pick: int(data[0])})
			data = data[1:]
			continue
		}
		if len(data) < 4 {
			break
		}
		ops = append(ops, allocOp{n: int64(binary.LittleEndian.Uint32(data))})
		data = data[4:]
	}
	return ops
}

func encodeAllocOps(ops ...allocOp) []byte {
	var b []byte
	for _, op := range ops {
		if op.release {
			b = append(b, 1, byte(op.pick))
			continue
		}
		b = binary.LittleEndian.AppendUint32(append(b, 0), uint32(op.n))
	}
	return b
}

func opAlloc(n int64) allocOp { return allocOp{n: n} }
func opRelease(i int) allocOp { return allocOp{release: true, pick: i} }
func opAllocs(ns ...int64) []allocOp {
	var ops []allocOp
	for _, n := range ns {
		ops = append(ops, opAlloc(n))
	}
	return ops
}

// checkAllocator checks the allocator's invariants against the extents
// handed out and not yet released (live):
//   - every extent, live or free, is slot-aligned in offset and size;
//   - live and free extents never overlap, and together tile [0, end)
//     exactly: the file holds nothing else and loses nothing;
//   - the free list is sorted, coalesced (no two adjacent) and never
//     reaches the end (a free extent there lowers the end instead);
//   - used is the sum of the live sizes, and peak is at least used.
func checkAllocator(t *testing.T, a *allocator, live []extent) {
	t.Helper()
	used, peak, end := a.snapshot()
	var sum int64
	for _, e := range live {
		sum += e.size
	}
	if used != sum || peak < used {
		t.Fatalf("used %d, peak %d: want used = %d (the sum of the live sizes) <= peak", used, peak, sum)
	}

	a.mu.Lock()
	free := slices.Clone(a.free)
	a.mu.Unlock()
	for i := 1; i < len(free); i++ {
		if prev := free[i-1]; prev.off+prev.size >= free[i].off {
			t.Fatalf("free list not sorted and coalesced: %v then %v", prev, free[i])
		}
	}
	if n := len(free); n > 0 && free[n-1].off+free[n-1].size >= end {
		t.Fatalf("free extent %v reaches the end %d: it should have lowered the end", free[n-1], end)
	}

	// Checks are plain comparisons, not testify calls: they run for every
	// extent after every operation, and fuzzing wants many executions.
	all := append(slices.Clone(live), free...)
	slices.SortFunc(all, func(x, y extent) int { return cmp.Compare(x.off, y.off) })
	var pos int64
	for _, e := range all {
		if e.off%slotAlign != 0 || e.size%slotAlign != 0 || e.size <= 0 {
			t.Fatalf("extent %v: offset and size must be positive multiples of %d", e, slotAlign)
		}
		if e.off != pos {
			t.Fatalf("extents overlap or leave a hole at %d: next is %v (live %v, free %v)", pos, e, live, free)
		}
		pos = e.off + e.size
	}
	if pos != end {
		t.Fatalf("live and free extents end at %d, the file at %d", pos, end)
	}
}

func FuzzAllocator(f *testing.F) {
	// Seeds: the programs of the allocator's unit tests, and a few shapes
	// that exercise reuse, coalescing on both sides and shrinking the end.
	f.Add(encodeAllocOps(opAlloc(1), opAlloc(10000), opAlloc(4096), opRelease(1), opAlloc(5000), opAlloc(4096)))
	f.Add(encodeAllocOps(append(opAllocs(4096, 4096, 4096, 4096, 4096),
		opRelease(1), opRelease(2), opRelease(1), opRelease(1), opRelease(0))...))
	f.Add(encodeAllocOps(opAlloc(0), opAlloc(1<<20+3), opAlloc(4095), opAlloc(4097), opRelease(0), opRelease(0), opRelease(0), opRelease(0)))
	f.Add(encodeAllocOps(append(opAllocs(256<<10, 100, 256<<10, 100, 256<<10),
		opRelease(0), opRelease(1), opAlloc(300<<10), opRelease(2), opAlloc(1), opAlloc(1<<32-1))...))
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0})

	f.Fuzz(func(t *testing.T, data []byte) {
		var a allocator
		var live []extent
		var lastPeak int64
		for _, op := range decodeAllocOps(data) {
			if op.release {
				if len(live) == 0 {
					continue
				}
				i := op.pick % len(live)
				a.release(live[i])
				live = slices.Delete(live, i, i+1)
			} else {
				e, end := a.alloc(op.n)
				require.Equal(t, roundSlot(op.n), e.size, "alloc(%d) rounds up to the slot size", op.n)
				require.LessOrEqual(t, e.off+e.size, end, "the extent lies within the file's new end")
				_, _, snapEnd := a.snapshot()
				require.Equal(t, snapEnd, end)
				live = append(live, e)
			}
			checkAllocator(t, &a, live)
			_, peak, _ := a.snapshot()
			require.GreaterOrEqual(t, peak, lastPeak, "the peak never falls")
			lastPeak = peak
		}
		for len(live) > 0 {
			a.release(live[len(live)-1])
			live = live[:len(live)-1]
			checkAllocator(t, &a, live)
		}
		used, _, end := a.snapshot()
		require.Zero(t, used, "releasing everything returns usage to zero")
		require.Zero(t, end, "and the end to the start of the file")
		require.Empty(t, a.free)
	})
}

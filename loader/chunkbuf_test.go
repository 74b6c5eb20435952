package loader

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// A buffer put back serves the next read that fits in it, and the pool
// never keeps more than its limit once its buffers are back.
func TestBufPoolReusesWithinItsLimit(t *testing.T) {
	p := newBufPool(4 * chunkBufStep)
	b, put := p.get(100_000)
	require.Len(t, b, 100_000)
	first := addr(b)
	require.Zero(t, first%4096, "aligned for O_DIRECT")
	put()
	c, put2 := p.get(90_000)
	require.Equal(t, first, addr(c), "the idle buffer that fits is reused")
	d, put3 := p.get(200_000) // the first is in use: a new one
	require.NotEqual(t, first, addr(d))
	put2()
	put3()
	require.LessOrEqual(t, p.total, p.limit)

	// Bigger than every idle buffer: the idle ones make room, the pool stays within its limit.
	e, put4 := p.get(3 * chunkBufStep)
	require.Len(t, e, 3*chunkBufStep)
	put4()
	require.LessOrEqual(t, p.total, p.limit)
	var idle int64
	for _, c := range p.idle {
		idle += int64(len(c.b))
	}
	require.Equal(t, p.total, idle, "every buffer back: the total is the idle bytes")
}

// Over the limit (several reads in flight with buffers too small to reuse),
// buffers put back are let go until the pool is within it again.
func TestBufPoolLetsGoOverItsLimit(t *testing.T) {
	p := newBufPool(2 * chunkBufStep)
	var puts []func()
	for range 4 {
		_, put := p.get(chunkBufStep)
		puts = append(puts, put)
	}
	require.Equal(t, int64(4*chunkBufStep), p.total)
	for _, put := range puts {
		put()
	}
	require.Equal(t, int64(2*chunkBufStep), p.total)
	require.Len(t, p.idle, 2)
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

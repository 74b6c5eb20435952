package hooks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllocatorAlignsAndReuses(t *testing.T) {
	var a allocator
	e1, end := a.alloc(1)
	assert.Equal(t, extent{off: 0, size: 4096}, e1)
	assert.EqualValues(t, 4096, end)
	e2, _ := a.alloc(10000)
	assert.Equal(t, extent{off: 4096, size: 12288}, e2)
	e3, _ := a.alloc(4096)
	assert.EqualValues(t, 16384, e3.off)

	a.release(e2)
	e4, end := a.alloc(5000) // first fit inside e2's hole
	assert.Equal(t, extent{off: 4096, size: 8192}, e4)
	assert.EqualValues(t, 20480, end, "reuse does not grow the file")
	e5, _ := a.alloc(4096) // the rest of the hole
	assert.Equal(t, extent{off: 12288, size: 4096}, e5)
	assert.Empty(t, a.free)

	used, peak, _ := a.snapshot()
	assert.EqualValues(t, 4096+8192+4096+4096, used)
	assert.EqualValues(t, 4096+12288+4096, peak)
}

func TestAllocatorCoalescesAndShrinks(t *testing.T) {
	var a allocator
	var es []extent
	for range 5 {
		e, _ := a.alloc(4096)
		es = append(es, e)
	}
	a.release(es[1])
	a.release(es[3])
	require.Len(t, a.free, 2)
	a.release(es[2]) // joins 1..3 into one extent
	require.Len(t, a.free, 1)
	assert.Equal(t, extent{off: 4096, size: 3 * 4096}, a.free[0])
	a.release(es[4]) // reaches the end: the end falls back to es[1]
	assert.Empty(t, a.free)
	_, _, end := a.snapshot()
	assert.EqualValues(t, 4096, end)
	a.release(es[0])
	used, _, end := a.snapshot()
	assert.Zero(t, used)
	assert.Zero(t, end)
}

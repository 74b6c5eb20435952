package gds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The size of a direct file after writes that overlap in time and fail:
// what they reserved is taken back only once none is in flight, to what
// the file holds and what the successful ones wrote.
func TestFailedWritesInFlightTogetherLeaveTheSizeTheFileHolds(t *testing.T) {
	e := NewDirect(Options{})
	f, err := e.Open(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	df, ok := f.(*directFile)
	if !ok {
		t.Skipf("no O_DIRECT here: %s", f.Fallback())
	}
	size := func() int64 {
		n, err := f.Size()
		require.NoError(t, err)
		return n
	}

	// Both fail, the first to reserve settling first: nothing was written.
	df.reserve(2 << 20)
	df.reserve(4 << 20)
	df.settle(2<<20, false)
	assert.Equal(t, int64(4<<20), size(), "the other write is still in flight: its reservation stands")
	df.settle(4<<20, false)
	assert.Zero(t, size(), "the file holds nothing")

	// One fails while the other, further, succeeds: the success's end stands.
	df.reserve(6 << 20)
	df.reserve(1 << 20)
	df.settle(6<<20, false)
	assert.Equal(t, int64(6<<20), size())
	_, err = f.WriteAt(make([]byte, 1<<20), 0) // the second write, for real
	require.NoError(t, err)
	df.settle(1<<20, true)
	assert.Equal(t, int64(1<<20), size(), "what the file holds and the success wrote")
}

package hooks

import (
	"errors"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFullSpillFilesystem(t *testing.T) {
	dir := testutil.MountFS(t, "tmpfs", 0, "size=1m")
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	defer s.Close()

	var ids []SlotID
	for i := range 8 {
		id, err := s.Put(testutil.Pattern(256<<10, uint64(i)))
		if err != nil { // growth itself may already hit the limit
			require.True(t, IsNoSpace(err), "%v", err)
			continue
		}
		ids = append(ids, id)
	}
	var full error
	for _, id := range ids {
		if err := s.Wait(id); err != nil {
			full = err
			// A failed slot reports the same error on Get, and frees.
			assert.ErrorIs(t, s.Get(id, make([]byte, 256<<10)), unix.ENOSPC)
			require.NoError(t, s.Free(id))
		}
	}
	require.Error(t, full, "8 x 256 KiB cannot fit in 1 MiB")
	assert.True(t, IsNoSpace(full), "%v", full)
	assert.Contains(t, full.Error(), dir)
	assert.Positive(t, s.Stats().FailedWrites)
}

func TestReadOnlySpillDirectory(t *testing.T) {
	dir := testutil.MountFS(t, "tmpfs", unix.MS_RDONLY, "size=1m")
	_, err := Open(Config{Dir: dir})
	require.ErrorIs(t, err, ErrSpillDir)
	assert.True(t, errors.Is(err, unix.EROFS), "%v", err)
	assert.Contains(t, err.Error(), dir)
}

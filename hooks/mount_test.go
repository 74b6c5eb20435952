package hooks

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mountFS mounts a fresh filesystem on a temporary directory for the test,
// or skips the test with the reason when this process may not mount.
func mountFS(t *testing.T, fstype string, flags uintptr, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(fstype, dir, fstype, flags, opts); err != nil {
		t.Skipf("cannot mount %s here (needs root and mount rights): %v", fstype, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestFullSpillFilesystem(t *testing.T) {
	dir := mountFS(t, "tmpfs", 0, "size=1m")
	s, err := Open(Config{Dir: dir})
	require.NoError(t, err)
	defer s.Close()

	var ids []SlotID
	for i := range 8 {
		id, err := s.Put(pattern(256<<10, uint64(i)))
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
	dir := mountFS(t, "tmpfs", unix.MS_RDONLY, "size=1m")
	_, err := Open(Config{Dir: dir})
	require.ErrorIs(t, err, ErrSpillDir)
	assert.True(t, errors.Is(err, unix.EROFS), "%v", err)
	assert.Contains(t, err.Error(), dir)
}

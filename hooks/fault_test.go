package hooks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// The spill store picks its engine by name, so a fault-injecting engine
// registered in gds reaches its failure paths on any filesystem, without
// a full disk.

// faultyStore opens a store whose spill file is served by posix wrapped
// with inj, under an engine name of the test's own.
func faultyStore(t *testing.T, inj gds.Injector) (*Store, string) {
	t.Helper()
	name := "faulty-" + t.Name()
	unregister, err := gds.RegisterFault(name, "posix", inj)
	require.NoError(t, err)
	t.Cleanup(unregister)
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Engine: name})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, dir
}

func TestSpillWriteFailsWithInjectedNoSpace(t *testing.T) {
	// The second slot starts at 8192: its write fails, half done.
	s, dir := faultyStore(t, gds.Only(gds.OpWrite).AtOffset(8192, 16384).WithError(unix.ENOSPC).Partial())
	a, err := s.Put(testutil.Pattern(8192, 1))
	require.NoError(t, err)
	require.NoError(t, s.Wait(a))
	b, err := s.Put(testutil.Pattern(8192, 2))
	require.NoError(t, err)
	err = s.Wait(b)
	require.Error(t, err)
	assert.True(t, IsNoSpace(err), "%v", err)
	assert.ErrorIs(t, err, gds.ErrInjected)
	assert.Contains(t, err.Error(), dir)
	assert.Contains(t, err.Error(), "partial write: 4096 of 8192 bytes done")
	assert.ErrorIs(t, s.Get(b, make([]byte, 8192)), unix.ENOSPC, "a failed slot reports its error on Get")
	require.NoError(t, s.Free(b))
	assert.EqualValues(t, 1, s.Stats().FailedWrites)

	got := make([]byte, 8192)
	require.NoError(t, s.Get(a, got), "the slot before is intact")
	assert.Equal(t, testutil.Pattern(8192, 1), got)
}

func TestSpillGrowthFailsWithInjectedNoSpace(t *testing.T) {
	s, _ := faultyStore(t, gds.Only(gds.OpTruncate).WithError(unix.ENOSPC))
	_, err := s.Put(testutil.Pattern(4096, 1))
	require.Error(t, err, "the spill file cannot grow")
	assert.True(t, IsNoSpace(err), "%v", err)
	assert.Contains(t, err.Error(), "growing to 4096 bytes")
	assert.Zero(t, s.Stats().LiveSlots)
}

func TestSpillReadFailsWithInjectedError(t *testing.T) {
	s, dir := faultyStore(t, gds.OnNth(1, gds.OpRead).WithError(unix.EIO))
	id, err := s.Put(testutil.Pattern(4096, 1))
	require.NoError(t, err)
	require.NoError(t, s.Wait(id))
	err = s.Get(id, make([]byte, 4096))
	require.ErrorIs(t, err, unix.EIO)
	assert.Contains(t, err.Error(), dir)
	got := make([]byte, 4096)
	require.NoError(t, s.Get(id, got), "only the first read was failed")
	assert.Equal(t, testutil.Pattern(4096, 1), got)
}

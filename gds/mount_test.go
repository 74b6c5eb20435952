package gds

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mountFS mounts a fresh filesystem of fstype (with mount data opts) on a
// temporary directory for the test, or skips the test with the reason when
// this process may not mount.
func mountFS(t *testing.T, fstype, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(fstype, dir, fstype, 0, opts); err != nil {
		t.Skipf("cannot mount %s here (needs root and mount rights): %v", fstype, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestDirectFallsBackWithoutODirect(t *testing.T) {
	dir := mountFS(t, "ramfs", "")
	for _, name := range []string{"direct", "uring"} {
		t.Run(name, func(t *testing.T) {
			e, err := New(name, Options{})
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("engine %s unavailable here: %v", name, err)
			}
			require.NoError(t, err)
			path := filepath.Join(dir, name)
			f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
			require.NoError(t, err, "a filesystem without O_DIRECT is not an error")
			defer f.Close()
			assert.Equal(t, "posix", f.Engine(), "this test accepts the fallback")
			assert.Contains(t, f.Fallback(), "does not support O_DIRECT")
			want := pattern(10007, 5)
			_, err = f.WriteAt(want, 3)
			require.NoError(t, err)
			got := make([]byte, len(want))
			_, err = f.ReadAt(got, 3)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestFullFilesystem(t *testing.T) {
	dir := mountFS(t, "tmpfs", "size=1m")
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		skipReadOnly(t, e)
		path := filepath.Join(dir, e.Name())
		defer os.Remove(path)
		f := openServed(t, e, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		n, err := f.WriteAt(pattern(4<<20, 1), 0)
		require.Error(t, err)
		assert.True(t, IsNoSpace(err), "ENOSPC maps to ErrNoSpace: %v", err)
		require.ErrorIs(t, err, unix.ENOSPC, "the OS error is still there")
		assert.Contains(t, err.Error(), path)
		assert.Less(t, n, 4<<20)
		if n > 0 {
			assert.Contains(t, err.Error(), "partial write")
		}
	})
}

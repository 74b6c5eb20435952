package gds

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestDirectFallsBackWithoutODirect(t *testing.T) {
	dir := testutil.MountFS(t, "ramfs", 0, "")
	for _, name := range []string{"direct", "uring"} {
		t.Run(name, func(t *testing.T) {
			e, err := New(name, Options{})
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("engine %s unavailable here: %v", name, err)
			}
			require.NoError(t, err)
			path := filepath.Join(dir, name)
			f, err := e.Open(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			require.NoError(t, err, "a filesystem without O_DIRECT is not an error (the refused open created the file)")
			defer f.Close()
			assert.Equal(t, "posix", f.Engine(), "this test accepts the fallback")
			assert.Contains(t, f.Fallback(), "does not support O_DIRECT")
			want := testutil.Pattern(10007, 5)
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
	dir := testutil.MountFS(t, "tmpfs", 0, "size=1m")
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		skipReadOnly(t, e)
		path := filepath.Join(dir, e.Name())
		defer os.Remove(path)
		f := openServed(t, e, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		n, err := f.WriteAt(testutil.Pattern(4<<20, 1), 0)
		require.Error(t, err)
		assert.True(t, IsNoSpace(err), "ENOSPC maps to ErrNoSpace: %v", err)
		require.ErrorIs(t, err, unix.ENOSPC, "the OS error is still there")
		assert.Contains(t, err.Error(), path)
		assert.Less(t, n, 4<<20)
		if n > 0 {
			assert.Contains(t, err.Error(), "partial write")
		}
		size, err := f.Size()
		require.NoError(t, err)
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.LessOrEqual(t, size, st.Size(), "the size a failed write leaves is what the file holds")
	})
}

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

// A filesystem that refuses O_DIRECT, played on any filesystem: every open
// with O_DIRECT fails with EINVAL, as tmpfs before Linux 6.6 and ramfs
// fail it. mount_test.go meets the real thing where mounting works.

// withoutODirect makes opens with O_DIRECT fail with EINVAL for the rest
// of the test, and returns the injector (to count its failures).
func withoutODirect(t *testing.T) *Fault {
	t.Helper()
	inj := Only(OpOpen).WithError(unix.EINVAL)
	t.Cleanup(InjectDirectOpen(inj))
	return inj
}

func TestProbeDirWithInjectedEINVAL(t *testing.T) {
	dir := t.TempDir()
	inj := withoutODirect(t)
	info := ProbeDir(dir)
	assert.False(t, info.Direct)
	assert.Contains(t, info.DirectReason, "O_DIRECT")
	assert.Contains(t, info.DirectReason, "does not support O_DIRECT")
	assert.Zero(t, info.OffsetAlign)
	assert.Equal(t, 1, inj.Fired(), "the probe's open was the one refused")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe leaves no file behind")
}

func TestDirectFallsBackWithInjectedEINVAL(t *testing.T) {
	for _, name := range []string{"direct", "uring"} {
		t.Run(name, func(t *testing.T) {
			e, err := New(name, Options{TaskSize: 64 << 10})
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("engine %s unavailable here: %v", name, err)
			}
			require.NoError(t, err)
			inj := withoutODirect(t)
			path := filepath.Join(t.TempDir(), "f")
			f, err := e.Open(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			require.NoError(t, err, "a filesystem without O_DIRECT is not an error")
			defer f.Close()
			assert.Equal(t, 1, inj.Fired())
			assert.Equal(t, "posix", f.Engine(), "this test accepts the fallback")
			assert.Contains(t, f.Fallback(), name+": filesystem does not support O_DIRECT")
			assert.Contains(t, f.Fallback(), "invalid argument on open")

			want := testutil.Pattern(200<<10+7, 5) // several tasks, unaligned length
			n, err := f.WriteAt(unaligned(want), 3)
			require.NoError(t, err)
			require.Equal(t, len(want), n)
			require.NoError(t, f.Sync())
			got := unaligned(make([]byte, len(want)))
			_, err = f.ReadAt(got, 3)
			require.NoError(t, err)
			require.Equal(t, want, got)
			size, err := f.Size()
			require.NoError(t, err)
			assert.EqualValues(t, len(want)+3, size)
			disk, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, want, disk[3:], "the bytes are on disk")
		})
	}
}

func TestInjectDirectOpenOtherErrorsFailTheOpen(t *testing.T) {
	t.Cleanup(InjectDirectOpen(Only(OpOpen).WithError(unix.EACCES)))
	path := filepath.Join(t.TempDir(), "f")
	_, err := NewDirect(Options{}).Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.ErrorIs(t, err, os.ErrPermission, "only EINVAL means no O_DIRECT")
	require.ErrorIs(t, err, ErrInjected)
	assert.Contains(t, err.Error(), "direct: open "+path)
}

func TestInjectDirectOpenRestores(t *testing.T) {
	restore := InjectDirectOpen(Only(OpOpen).WithError(unix.EINVAL))
	restore()
	path := filepath.Join(t.TempDir(), "f")
	f, err := NewDirect(Options{}).Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	if f.Fallback() != "" {
		t.Skipf("no O_DIRECT in %s: %s", filepath.Dir(path), f.Fallback())
	}
	assert.Equal(t, "direct", f.Engine())
}

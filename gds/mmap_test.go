package gds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMmapRefusesWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, testutil.Pattern(100, 1), 0o644))
	_, err := NewMmap(Options{}).Open(path, os.O_RDWR, 0)
	require.ErrorIs(t, err, ErrUnsupported)
	f, err := NewMmap(Options{}).Open(path, os.O_RDONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte{1}, 0)
	require.ErrorIs(t, err, ErrUnsupported)
	assert.Contains(t, err.Error(), "mmap: write "+path+" at 0")
}

func TestMmapFileShrunkWhileMapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, testutil.Pattern(1<<20, 1), 0o644))
	f, err := NewMmap(Options{}).Open(path, os.O_RDONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, os.Truncate(path, 4096))
	_, err = f.ReadAt(make([]byte, 8192), 512<<10)
	require.ErrorIs(t, err, ErrEOF, "a fault in the mapping is an error, not a crash")
}

func TestMmapEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	f, err := NewMmap(Options{}).Open(path, os.O_RDONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	n, err := f.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, ErrEOF)
	require.Zero(t, n)
}

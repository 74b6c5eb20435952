package gds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFileResidencyFollowsThePageCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.bin")
	page := int64(os.Getpagesize())
	require.NoError(t, os.WriteFile(path, make([]byte, 64*page), 0o644))

	r, err := FileResidency(path)
	require.NoError(t, err)
	assert.Equal(t, 1.0, r.Fraction(0, 64*page), "just written: every page cached")

	// Clean pages dropped with POSIX_FADV_DONTNEED are gone.
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fsync(int(f.Fd())))
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	r, err = FileResidency(path)
	require.NoError(t, err)
	assert.Equal(t, 0.0, r.Fraction(0, 64*page))

	// Read back the second quarter only: that quarter is resident, the rest not.
	_, err = f.ReadAt(make([]byte, 16*page), 16*page)
	require.NoError(t, err)
	r, err = FileResidency(path)
	require.NoError(t, err)
	assert.Equal(t, 1.0, r.Fraction(16*page, 16*page))
	assert.InDelta(t, 0.25, r.Fraction(0, 64*page), 0.1, "read-ahead may add a few pages")
	assert.Equal(t, 0.0, r.Fraction(48*page, 16*page))
	assert.Equal(t, 0.0, r.Fraction(64*page, page), "past the end counts as absent")
	assert.Equal(t, 1.0, r.Fraction(5, 0), "an empty range is resident")
}

func TestFileResidencyErrorsNameTheFile(t *testing.T) {
	_, err := FileResidency(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing")
	assert.Contains(t, err.Error(), "resident")

	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	r, err := FileResidency(empty)
	require.NoError(t, err)
	assert.Equal(t, 0.0, r.Fraction(0, 1))
}

func TestRangeResidencyLooksAtTheRangeOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.bin")
	page := int64(os.Getpagesize())
	require.NoError(t, os.WriteFile(path, make([]byte, 16*page), 0o644)) // all cached
	r, err := RangeResidency(path, 4*page+100, 8*page)
	require.NoError(t, err)
	assert.Equal(t, 1.0, r.Fraction(4*page, 4*page))
	assert.Equal(t, 0.0, r.Fraction(0, 4*page), "before the range: not looked at, absent")
	assert.Equal(t, 0.0, r.Fraction(8*page, 8*page), "after the range: absent")
	assert.Equal(t, 0.5, r.Fraction(2*page, 4*page))
}

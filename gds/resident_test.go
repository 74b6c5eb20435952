package gds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// residentWays runs a test over Resident (cachestat where the kernel has
// it) and over the mincore fallback.
var residentWays = map[string]func(path string, offs, sizes []int64) ([]float64, error){
	"Resident": Resident,
	"mincore": func(path string, offs, sizes []int64) ([]float64, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return mincoreRanges(f, offs, sizes)
	},
}

func TestResidentFollowsThePageCache(t *testing.T) {
	page := int64(os.Getpagesize())
	for name, resident := range residentWays {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.bin")
			require.NoError(t, os.WriteFile(path, make([]byte, 64*page), 0o644))
			r, err := resident(path, []int64{0}, []int64{64 * page})
			require.NoError(t, err)
			assert.Equal(t, []float64{1}, r, "just written: every page cached")

			// Clean pages dropped with POSIX_FADV_DONTNEED are gone.
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			require.NoError(t, unix.Fsync(int(f.Fd())))
			require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
			r, err = resident(path, []int64{0}, []int64{64 * page})
			require.NoError(t, err)
			if r[0] > 0.9 {
				t.Skip("this filesystem keeps its pages (tmpfs)")
			}
			assert.Equal(t, []float64{0}, r)

			// Read back the second quarter only: that quarter is resident, the rest not.
			_, err = f.ReadAt(make([]byte, 16*page), 16*page)
			require.NoError(t, err)
			r, err = resident(path, []int64{16 * page, 0, 48 * page, 64 * page, 5, 2*page + 100},
				[]int64{16 * page, 64 * page, 16 * page, page, 0, 16 * page})
			require.NoError(t, err)
			assert.Equal(t, 1.0, r[0])
			assert.InDelta(t, 0.25, r[1], 0.1, "read-ahead may add a few pages")
			assert.Equal(t, 0.0, r[2])
			assert.Equal(t, 0.0, r[3], "past the end counts as absent")
			assert.Equal(t, 1.0, r[4], "an empty range is resident")
			assert.InDelta(t, 3.0/17, r[5], 0.01, "a range counts the pages it touches: 2 to 18, of which 16 to 18 are cached")
		})
	}
}

func TestResidentErrorsNameTheFile(t *testing.T) {
	for name, resident := range residentWays {
		t.Run(name, func(t *testing.T) {
			missing := filepath.Join(t.TempDir(), "missing")
			_, err := Resident(missing, []int64{0}, []int64{1})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "missing")
			assert.Contains(t, err.Error(), "resident")

			empty := filepath.Join(t.TempDir(), "empty")
			require.NoError(t, os.WriteFile(empty, nil, 0o644))
			r, err := resident(empty, []int64{0, 0}, []int64{1, 0})
			require.NoError(t, err)
			assert.Equal(t, []float64{0, 1}, r)

			_, err = resident(empty, []int64{-4096}, []int64{1})
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
}

// ResidentFile asks about the file it is given, not about what its path
// leads to: with the path removed, and then a file of other pages put at
// it, the figures are still the open file's.
func TestResidentFileMeasuresTheOpenFile(t *testing.T) {
	page := int64(os.Getpagesize())
	path := filepath.Join(t.TempDir(), "r.bin")
	require.NoError(t, os.WriteFile(path, make([]byte, 8*page), 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, nil, 0o644)) // empty: its pages are all absent

	r, err := ResidentFile(f, []int64{0, 8 * page}, []int64{8 * page, page})
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 0}, r, "the open file's 8 pages, just written; past its end absent")
	r, err = Resident(path, []int64{0}, []int64{8 * page})
	require.NoError(t, err)
	assert.Equal(t, []float64{0}, r, "the file now at the path")

	_, err = ResidentFile(f, []int64{0}, nil)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "r.bin")
}

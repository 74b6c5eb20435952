package gds

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The contract every engine must meet. Each registered engine that can work
// on this machine runs every test here; one that cannot is skipped with its
// reason.

// engineUnderTest is an engine opened with small tasks so that splitting and
// parallel pieces happen even at modest sizes.
func enginesUnderTest(t *testing.T) map[string]Engine {
	t.Helper()
	out := map[string]Engine{}
	for _, name := range Names() {
		e, err := New(name, Options{Threads: 4, TaskSize: 64 << 10})
		if err != nil {
			t.Logf("engine %s skipped: %v", name, err)
			continue
		}
		out[name] = e
	}
	return out
}

// pattern returns n bytes that differ at every position of interest.
func pattern(n int, seed uint64) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p)
	return p
}

// unaligned returns a copy of p at an address that is 1 byte past 4 KiB.
func unaligned(p []byte) []byte {
	buf := alignedBuf(len(p)+1, 4096)[1:]
	copy(buf, p)
	return buf
}

func writable(e Engine) bool { return e.Name() != "mmap" }

func TestRoundTripSizes(t *testing.T) {
	sizes := []int{1, 4095, 4096, 4097, 1<<20 + 3}
	if !testing.Short() {
		sizes = append(sizes, 256<<20)
	}
	offsets := []int64{0, 1, 4095, 4096, 12289}
	for name, e := range enginesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, size := range sizes {
				for _, off := range offsets {
					if size >= 256<<20 && off != 12289 {
						continue // one unaligned case at the largest size
					}
					path := filepath.Join(dir, "f")
					want := pattern(size, uint64(size)+uint64(off))
					// A canary around the target range proves no neighbour is overwritten.
					canary := pattern(int(off)+size+8192, 7)
					require.NoError(t, os.WriteFile(path, canary, 0o644))
					writeWith(t, e, path, unaligned(want), off)

					got := readWith(t, e, path, size, off)
					require.True(t, bytes.Equal(want, got), "%s size %d off %d: read differs", name, size, off)

					disk, err := os.ReadFile(path)
					require.NoError(t, err)
					require.Len(t, disk, len(canary))
					require.True(t, bytes.Equal(canary[:off], disk[:off]), "bytes before the range changed")
					require.True(t, bytes.Equal(canary[off+int64(size):], disk[off+int64(size):]), "bytes after the range changed")
				}
			}
		})
	}
}

// writeWith writes p at off; read-only engines write through posix.
func writeWith(t *testing.T, e Engine, path string, p []byte, off int64) {
	t.Helper()
	if !writable(e) {
		e = NewPosix(Options{})
	}
	f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	n, err := f.WriteAt(p, off)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

func readWith(t *testing.T, e Engine, path string, size int, off int64) []byte {
	t.Helper()
	f, err := e.Open(path, os.O_RDONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	got := unaligned(make([]byte, size))
	n, err := f.ReadAt(got, off)
	require.NoError(t, err)
	require.Equal(t, size, n)
	return got
}

func TestGrowsToExactSize(t *testing.T) {
	for name, e := range enginesUnderTest(t) {
		if !writable(e) {
			continue
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			f, err := e.Open(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			require.NoError(t, err)
			_, err = f.WriteAt(pattern(5000, 1), 3)
			require.NoError(t, err)
			size, err := f.Size()
			require.NoError(t, err)
			require.Equal(t, int64(5003), size)
			require.NoError(t, f.Close())
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.Equal(t, int64(5003), st.Size(), "padding past the end must be trimmed")
		})
	}
}

func TestConcurrentDisjointWrites(t *testing.T) {
	// Many goroutines write adjacent unaligned extents of one file; their
	// edges share blocks. Every byte must be the one its writer put there.
	const writers = 32
	for name, e := range enginesUnderTest(t) {
		if !writable(e) {
			continue
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			f, err := e.Open(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			require.NoError(t, err)
			defer f.Close()
			var (
				extents [][2]int64
				pos     int64
			)
			for i := range writers {
				n := int64(1000 + 3571*i%9000)
				extents = append(extents, [2]int64{pos, n})
				pos += n
			}
			want := pattern(int(pos), 42)
			var wg sync.WaitGroup
			for _, x := range extents {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := f.WriteAt(unaligned(want[x[0]:x[0]+x[1]]), x[0])
					assert.NoError(t, err)
				}()
			}
			wg.Wait()
			got := make([]byte, pos)
			var rg sync.WaitGroup
			for _, x := range extents {
				rg.Add(1)
				go func() {
					defer rg.Done()
					_, err := f.ReadAt(got[x[0]:x[0]+x[1]], x[0])
					assert.NoError(t, err)
				}()
			}
			rg.Wait()
			require.True(t, bytes.Equal(want, got))
		})
	}
}

func TestReadPastEOF(t *testing.T) {
	for name, e := range enginesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			require.NoError(t, os.WriteFile(path, pattern(10000, 3), 0o644))
			f, err := e.Open(path, os.O_RDONLY, 0)
			require.NoError(t, err)
			defer f.Close()
			buf := make([]byte, 4096)
			n, err := f.ReadAt(buf, 8000)
			require.ErrorIs(t, err, ErrEOF)
			require.Equal(t, 2000, n, "the bytes before the end are read")
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), "at 8000")
			assert.Contains(t, err.Error(), f.Engine()+":")

			_, err = f.ReadAt(buf, 1<<40)
			require.ErrorIs(t, err, ErrEOF)
		})
	}
}

// Options.Name is what a file's errors call it: a file reopened through
// /proc/self/fd/N keeps the name of its path.
func TestErrorsUseOptionsName(t *testing.T) {
	for _, name := range Names() {
		e, err := New(name, Options{Name: "/data/shown.pt"})
		if err != nil {
			continue // cufile without the library
		}
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			require.NoError(t, os.WriteFile(path, pattern(10000, 3), 0o644))
			g, err := os.Open(path)
			require.NoError(t, err)
			defer g.Close()
			f, err := e.Open(fmt.Sprintf("/proc/self/fd/%d", g.Fd()), os.O_RDONLY, 0)
			require.NoError(t, err)
			defer f.Close()
			assert.Equal(t, "/data/shown.pt", f.Path())
			_, err = f.ReadAt(make([]byte, 4096), 8000)
			require.ErrorIs(t, err, ErrEOF)
			assert.Contains(t, err.Error(), "/data/shown.pt")
			assert.NotContains(t, err.Error(), "/proc/self/fd")
		})
	}
}

func TestBadArguments(t *testing.T) {
	for name, e := range enginesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			require.NoError(t, os.WriteFile(path, pattern(100, 3), 0o644))
			f, err := e.Open(path, os.O_RDONLY, 0)
			require.NoError(t, err)
			_, err = f.ReadAt(make([]byte, 10), -1)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), "negative offset")
			_, err = f.ReadAt(make([]byte, 10), 1<<63-5)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), "overflows")
			require.NoError(t, f.Close())
			_, err = f.ReadAt(make([]byte, 10), 0)
			require.ErrorIs(t, err, ErrClosed)
		})
	}
}

func TestOpenMissingNamesPath(t *testing.T) {
	for name, e := range enginesUnderTest(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "missing", "f")
			_, err := e.Open(path, os.O_RDONLY, 0)
			require.ErrorIs(t, err, os.ErrNotExist)
			var op *OpError
			require.True(t, errors.As(err, &op))
			assert.Contains(t, err.Error(), path)
		})
	}
}

func TestUnknownEngine(t *testing.T) {
	_, err := New("floppy", Options{})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `"floppy"`)
	assert.Contains(t, err.Error(), "posix")
}

func TestUnalignedMemoryBetweenOneAndTwoTasks(t *testing.T) {
	// A transfer of 1.5 tasks runs as one piece on the caller's goroutine;
	// from unaligned memory it must still fit the task-sized bounce buffer.
	for name, e := range enginesUnderTest(t) { // task size 64 KiB
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			want := pattern(96<<10, 11)
			writeWith(t, e, path, unaligned(want), 0)
			got := readWith(t, e, path, len(want), 0)
			require.True(t, bytes.Equal(want, got))
		})
	}
}

package gds

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The contract every engine must meet. Each registered engine runs every
// test here as a subtest of its own name. An engine that cannot work on
// this machine, or that hands the file to another engine here (direct or
// uring falling back to posix on a filesystem without O_DIRECT), skips
// the subtest with its reason: a skip is visible, a fallback is not.

// faultyPosix is the fault-injecting wrapper over posix, registered for
// the tests of this package with an injector that never fires: the
// wrapper must fit the contract like any engine.
const faultyPosix = "faulty-posix"

func init() {
	if _, err := RegisterFault(faultyPosix, "posix", Never); err != nil {
		panic(err)
	}
}

// contractOptions open engines with small tasks so that splitting and
// parallel pieces happen even at modest sizes.
var contractOptions = Options{Threads: 4, TaskSize: 64 << 10}

// forEachEngine runs test as a subtest per registered engine, opened with
// opts. An engine unavailable here skips its subtest with the reason.
func forEachEngine(t *testing.T, opts Options, test func(t *testing.T, e Engine)) {
	t.Helper()
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			e, err := New(name, opts)
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("engine %s unavailable here: %v", name, err)
			}
			require.NoError(t, err)
			test(t, e)
		})
	}
}

// skipReadOnly skips the test for engines that do not write.
func skipReadOnly(t *testing.T, e Engine) {
	t.Helper()
	if !writable(e) {
		t.Skipf("engine %s opens files for reading only", e.Name())
	}
}

// servedBy is the engine whose files e's files are: e's own name, or for a
// wrapper (faulty engines) the name of the engine it wraps.
func servedBy(e Engine) string {
	if w, ok := e.(interface{ Unwrap() Engine }); ok {
		return servedBy(w.Unwrap())
	}
	return e.Name()
}

// openServed opens path with e and checks that e itself serves the file.
// A file handed to another engine with a reason (a fallback) skips the
// test with that reason, since the engine under test would not be tested;
// one handed over without a reason fails it. The file is closed at the end
// of the test.
func openServed(t *testing.T, e Engine, path string, flag int, perm os.FileMode) File {
	t.Helper()
	f, err := e.Open(path, flag, perm)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	if want := servedBy(e); f.Engine() != want {
		require.NotEmpty(t, f.Fallback(), "%s served %s with %s and gave no reason", want, path, f.Engine())
		t.Skipf("%s falls back to %s in %s: %s", want, f.Engine(), filepath.Dir(path), f.Fallback())
	}
	require.Empty(t, f.Fallback(), "a file served by the engine asked for has no fallback reason")
	return f
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
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		name := e.Name()
		dir := t.TempDir()
		for _, size := range sizes {
			for _, off := range offsets {
				if size >= 256<<20 && off != 12289 {
					continue // one unaligned case at the largest size
				}
				path := filepath.Join(dir, "f")
				want := testutil.Pattern(size, uint64(size)+uint64(off))
				// A canary around the target range proves no neighbour is overwritten.
				canary := testutil.Pattern(int(off)+size+8192, 7)
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

// writeWith writes p at off; read-only engines write through posix.
func writeWith(t *testing.T, e Engine, path string, p []byte, off int64) {
	t.Helper()
	if !writable(e) {
		e = NewPosix(Options{})
	}
	f := openServed(t, e, path, os.O_RDWR|os.O_CREATE, 0o644)
	n, err := f.WriteAt(p, off)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

func readWith(t *testing.T, e Engine, path string, size int, off int64) []byte {
	t.Helper()
	f := openServed(t, e, path, os.O_RDONLY, 0)
	defer f.Close()
	got := unaligned(make([]byte, size))
	n, err := f.ReadAt(got, off)
	require.NoError(t, err)
	require.Equal(t, size, n)
	return got
}

func TestGrowsToExactSize(t *testing.T) {
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		skipReadOnly(t, e)
		path := filepath.Join(t.TempDir(), "f")
		f := openServed(t, e, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		_, err := f.WriteAt(testutil.Pattern(5000, 1), 3)
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

func TestConcurrentDisjointWrites(t *testing.T) {
	// Many goroutines write adjacent unaligned extents of one file; their
	// edges share blocks. Every byte must be the one its writer put there.
	const writers = 32
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		skipReadOnly(t, e)
		path := filepath.Join(t.TempDir(), "f")
		f := openServed(t, e, path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		var (
			extents [][2]int64
			pos     int64
		)
		for i := range writers {
			n := int64(1000 + 3571*i%9000)
			extents = append(extents, [2]int64{pos, n})
			pos += n
		}
		want := testutil.Pattern(int(pos), 42)
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

func TestReadPastEOF(t *testing.T) {
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		path := filepath.Join(t.TempDir(), "f")
		require.NoError(t, os.WriteFile(path, testutil.Pattern(10000, 3), 0o644))
		f := openServed(t, e, path, os.O_RDONLY, 0)
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

// Options.Name is what a file's errors call it: a file reopened through
// /proc/self/fd/N keeps the name of its path.
func TestErrorsUseOptionsName(t *testing.T) {
	forEachEngine(t, Options{Name: "/data/shown.pt"}, func(t *testing.T, e Engine) {
		path := filepath.Join(t.TempDir(), "f")
		require.NoError(t, os.WriteFile(path, testutil.Pattern(10000, 3), 0o644))
		g, err := os.Open(path)
		require.NoError(t, err)
		defer g.Close()
		f := openServed(t, e, fmt.Sprintf("/proc/self/fd/%d", g.Fd()), os.O_RDONLY, 0)
		assert.Equal(t, "/data/shown.pt", f.Path())
		_, err = f.ReadAt(make([]byte, 4096), 8000)
		require.ErrorIs(t, err, ErrEOF)
		assert.Contains(t, err.Error(), "/data/shown.pt")
		assert.NotContains(t, err.Error(), "/proc/self/fd")
	})
}

func TestBadArguments(t *testing.T) {
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		path := filepath.Join(t.TempDir(), "f")
		require.NoError(t, os.WriteFile(path, testutil.Pattern(100, 3), 0o644))
		f := openServed(t, e, path, os.O_RDONLY, 0)
		_, err := f.ReadAt(make([]byte, 10), -1)
		require.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), "negative offset")
		_, err = f.ReadAt(make([]byte, 10), 1<<63-5)
		require.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), "overflows")
		require.NoError(t, f.Close())
		_, err = f.ReadAt(make([]byte, 10), 0)
		require.ErrorIs(t, err, ErrClosed)
		// After Close the descriptor's number may be another file's: nothing reaches it.
		victim, err := os.Create(filepath.Join(t.TempDir(), "victim"))
		require.NoError(t, err)
		defer victim.Close()
		_, err = victim.Write(testutil.Pattern(100, 4))
		require.NoError(t, err)
		_, err = f.Size()
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, f.Truncate(0), ErrClosed)
		require.ErrorIs(t, f.Sync(), ErrClosed)
		st, err := victim.Stat()
		require.NoError(t, err)
		assert.Equal(t, int64(100), st.Size(), "a file opened after Close is left alone")
	})
}

func TestOpenMissingNamesPath(t *testing.T) {
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		path := filepath.Join(t.TempDir(), "missing", "f")
		_, err := e.Open(path, os.O_RDONLY, 0)
		require.ErrorIs(t, err, os.ErrNotExist)
		var op *OpError
		require.True(t, errors.As(err, &op))
		assert.Contains(t, err.Error(), path)
	})
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
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) { // task size 64 KiB
		path := filepath.Join(t.TempDir(), "f")
		want := testutil.Pattern(96<<10, 11)
		writeWith(t, e, path, unaligned(want), 0)
		got := readWith(t, e, path, len(want), 0)
		require.True(t, bytes.Equal(want, got))
	})
}

func TestWriteOnlyPartialBlockWrites(t *testing.T) {
	// Bytes in the middle of a block, on a file opened write-only: an engine
	// that writes whole blocks reads the rest of the block first.
	forEachEngine(t, contractOptions, func(t *testing.T, e Engine) {
		skipReadOnly(t, e)
		path := filepath.Join(t.TempDir(), "f")
		base := testutil.Pattern(3*4096, 6)
		require.NoError(t, os.WriteFile(path, base, 0o644))
		f := openServed(t, e, path, os.O_WRONLY, 0)
		n, err := f.WriteAt([]byte("hello"), 4096+3)
		require.NoError(t, err)
		assert.Equal(t, 5, n)
		require.NoError(t, f.Close())
		want := append([]byte(nil), base...)
		copy(want[4096+3:], "hello")
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(want, got), "the block's other bytes are kept")
	})
}

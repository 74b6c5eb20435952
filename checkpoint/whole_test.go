package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenArchiveMemoryMatchesTheFile(t *testing.T) {
	path, a := savedSample(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	m, err := OpenArchiveMemory(path, data)
	require.NoError(t, err)
	assert.Equal(t, []any{a.Path, a.Size, a.Entries, a.Ours, a.NoCRC}, []any{m.Path, m.Size, m.Entries, m.Ours, m.NoCRC})

	// Records verified from the same memory.
	reqs := make([]ReadRequest, len(m.Entries))
	for i, e := range m.Entries {
		reqs[i] = ReadRequest{Index: i, Dst: data[e.DataOff : e.DataOff+e.Size]}
	}
	require.NoError(t, m.Verify(reqs, ReadOptions{}))
}

func TestOpenArchiveMemoryCatchesWhatTheFileCheckCatches(t *testing.T) {
	path, a := saved(t, sampleRecords()[:6])
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	e := a.Entries[3]

	header := append([]byte(nil), data...)
	header[e.HeaderOff+localHeaderLen] ^= 0xff // first byte of the local header's name
	_, err = OpenArchiveMemory(path, header)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), e.Name)

	_, err = OpenArchiveMemory(path, data[:len(data)-100]) // truncated
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
}

func TestReadWholeReadsParsesAndVerifies(t *testing.T) {
	path, a := savedSample(t)
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	engines := []string{"posix"}
	if gds.ProbeDir(filepath.Dir(path)).Direct {
		engines = append(engines, "direct")
	}
	for _, engine := range engines {
		dst := make([]byte, len(want))
		var moved atomic.Int64
		w, err := ReadWhole(path, dst, ReadOptions{Chooser: transfer.Fixed(engine), Progress: func(n int64) { moved.Add(n) }})
		require.NoError(t, err, engine)
		assert.Equal(t, want, dst, engine)
		assert.Equal(t, int64(len(want)), moved.Load(), engine)
		parsed := slices.Clone(w.Entries)
		for i := range parsed {
			parsed[i].Memory = "" // the load planner's, not the parser's
		}
		assert.Equal(t, a.Entries, parsed, engine)
		reqs := make([]ReadRequest, len(w.Entries))
		for i, e := range w.Entries {
			reqs[i] = ReadRequest{Index: i, Dst: dst[e.DataOff : e.DataOff+e.Size]}
			assert.True(t, e.Size == 0 || w.whole.Holds(reqs[i].Dst, e.DataOff), "checked from the granules")
		}
		require.NoError(t, w.Verify(reqs, ReadOptions{}), engine)
	}
}

func TestReadWholeCatchesAFlippedByteAndAShrunkFile(t *testing.T) {
	path, a := savedSample(t)
	e := a.Entries[len(a.Entries)-2] // the largest record, 2 task sizes and a byte
	flip(t, path, e.DataOff+e.Size/2)
	dst := make([]byte, a.Size)
	w, err := ReadWhole(path, dst, ReadOptions{Chooser: transfer.Fixed("posix")})
	require.NoError(t, err, "the structure is intact")
	err = w.Verify([]ReadRequest{{Index: len(a.Entries) - 2, Dst: dst[e.DataOff : e.DataOff+e.Size]}}, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), e.Name)

	// The same memory, not read by ReadWhole: summed in full, the same verdict.
	copied := append([]byte(nil), dst[e.DataOff:e.DataOff+e.Size]...)
	err = w.Verify([]ReadRequest{{Index: len(a.Entries) - 2, Dst: copied}}, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)

	// NoVerify keeps no sums: Verify sums the memory itself.
	w, err = ReadWhole(path, dst, ReadOptions{Chooser: transfer.Fixed("posix"), NoVerify: true})
	require.NoError(t, err)
	assert.Nil(t, w.whole)

	// A file shorter than measured is opened as it is: truncated.
	require.NoError(t, os.Truncate(path, a.Size-100))
	_, err = ReadWhole(path, dst, ReadOptions{Chooser: transfer.Fixed("posix")})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "truncated")
}

// A save replaces the file by a rename: an archive keeps reading the file it
// parsed, and ReadWhole, given the old file's size, opens the new one.
func TestReplacedFileIsReadAsParsed(t *testing.T) {
	old := sampleRecords()
	path, a := saved(t, old)
	replacement := []Record{{Name: "archive/data.pkl", Data: []byte("another pickle")},
		{Name: "archive/data/0", Data: testutil.Pattern(5000, 99), Align: DataAlign}}
	_, err := Save(path, replacement, WriteOptions{NotDurable: true})
	require.NoError(t, err)

	for _, engine := range []string{"posix", ""} { // "": the default chooser (direct when cold)
		var ch transfer.Chooser
		if engine != "" {
			ch = transfer.Fixed(engine)
		}
		reqs := make([]ReadRequest, len(old))
		for i := range old {
			reqs[i] = ReadRequest{Index: i, Dst: make([]byte, len(old[i].Data))}
		}
		_, err = a.Read(reqs, ReadOptions{Chooser: ch})
		require.NoError(t, err, engine)
		for i := range old {
			require.Equal(t, old[i].Data, reqs[i].Dst, old[i].Name)
		}
	}

	w, err := ReadWhole(path, make([]byte, a.Size), ReadOptions{Chooser: transfer.Fixed("posix")})
	require.NoError(t, err)
	defer w.Close()
	assert.False(t, w.ReadWhole)
	require.Len(t, w.Entries, 2)
	got := make([]byte, 5000)
	_, err = w.Read([]ReadRequest{{Index: 1, Dst: got}}, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, replacement[1].Data, got)

	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "idempotent")
	_, err = a.Read([]ReadRequest{{Index: 1, Dst: make([]byte, len(old[1].Data))}}, ReadOptions{})
	require.ErrorIs(t, err, gds.ErrClosed)
}

func TestDirOfFollowsAPinnedDescriptor(t *testing.T) {
	path, a := savedSample(t)
	a.mu.RLock()
	src, err := a.source()
	a.mu.RUnlock()
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("/proc/self/fd/%d", a.Fd), src)
	dir, err := transfer.DirOf(src)
	require.NoError(t, err)
	assert.Equal(t, filepath.Dir(path), dir, "the file's directory, for its O_DIRECT probe")
	require.NoError(t, os.Remove(path))
	dir, err = transfer.DirOf(src)
	require.NoError(t, err)
	assert.Equal(t, filepath.Dir(path), dir, "even once removed")
}

// Errors from a read through the pinned descriptor name the file's path,
// not /proc/self/fd/N.
func TestPinnedReadErrorsNameThePath(t *testing.T) {
	path, a := savedSample(t)
	last := len(a.Entries) - 2
	e := a.Entries[last]
	require.NoError(t, os.Truncate(path, e.DataOff+10)) // the same inode, shorter
	_, err := a.Read([]ReadRequest{{Index: last, Dst: make([]byte, e.Size)}}, ReadOptions{Chooser: transfer.Fixed("posix")})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.NotContains(t, err.Error(), "/proc/self/fd")

	_, err = ReadRaw(fmt.Sprintf("/proc/self/fd/%d", a.Fd), []Extent{{Off: e.DataOff, Data: make([]byte, 100)}}, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.NotContains(t, err.Error(), "/proc/self/fd")
}

// An archive read whole copies records out of its memory, checked from the
// sums taken as the file landed: the file is not read again.
func TestReadOfAWholeArchiveCopiesFromItsMemory(t *testing.T) {
	path, a := savedSample(t)
	e := a.Entries[len(a.Entries)-2]
	flip(t, path, e.DataOff+e.Size/2)
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, verify := range []bool{true, false} {
		w, err := ReadWhole(path, make([]byte, a.Size), ReadOptions{Chooser: transfer.Fixed("posix"), NoVerify: !verify})
		require.NoError(t, err)
		require.NoError(t, os.Truncate(path, 0), "nothing more comes from the file")
		var moved atomic.Int64
		var reqs []ReadRequest
		for i, r := range w.Entries {
			if i != len(w.Entries)-2 {
				reqs = append(reqs, ReadRequest{Index: i, Dst: make([]byte, r.Size)})
			}
		}
		st, err := w.Read(reqs, ReadOptions{Progress: func(n int64) { moved.Add(n) }})
		require.NoError(t, err)
		var total int64
		for _, r := range reqs {
			total += int64(len(r.Dst))
		}
		assert.Equal(t, total, st.DataBytes)
		assert.Equal(t, total, moved.Load())
		for _, r := range reqs {
			x := w.Entries[r.Index]
			assert.Equal(t, want[x.DataOff:x.DataOff+x.Size], r.Dst, x.Name)
		}
		damaged := make([]byte, e.Size)
		_, err = w.Read([]ReadRequest{{Index: len(w.Entries) - 2, Dst: damaged}}, ReadOptions{NoVerify: !verify})
		if verify {
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), e.Name)
		} else {
			require.NoError(t, err)
			assert.Equal(t, want[e.DataOff:e.DataOff+e.Size], damaged, "the flipped byte too: from memory")
		}
		require.NoError(t, w.Close())
		_, err = w.Read(reqs, ReadOptions{})
		require.ErrorIs(t, err, gds.ErrClosed)
		require.NoError(t, os.WriteFile(path, want, 0o644))
	}
}
